from django.urls import re_path

from attestation_dashboard.content.nodes import views

_UUID = r"(?P<node_id>[0-9a-fA-F-]{32,36})"

urlpatterns = [
    re_path(r"^$", views.IndexView.as_view(), name="index"),
    re_path(rf"^{_UUID}/$", views.DetailView.as_view(), name="detail"),
    re_path(
        rf"^{_UUID}/change_policy/$",
        views.ChangePolicyView.as_view(),
        name="change_policy",
    ),
]

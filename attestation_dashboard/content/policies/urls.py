from django.urls import re_path

from attestation_dashboard.content.policies import views

urlpatterns = [
    re_path(r"^$", views.IndexView.as_view(), name="index"),
    re_path(r"^upload/$", views.UploadView.as_view(), name="upload"),
    re_path(
        r"^(?P<kind>runtime|measured-boot)/(?P<name>[^/]+)/$",
        views.DetailView.as_view(),
        name="detail",
    ),
]

from django.urls import re_path

from attestation_dashboard.content.admin import views

urlpatterns = [
    re_path(r"^$", views.IndexView.as_view(), name="index"),
]

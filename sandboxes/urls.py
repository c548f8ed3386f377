"""Routes of the sandboxes app (namespace "sandboxes")."""

from django.urls import path

from . import views

app_name = "sandboxes"

urlpatterns = [
    path("sandboxes/", views.config_list, name="config_list"),
    path("sessions/", views.session_list, name="session_list"),
]

"""Routes of the sandboxes app (namespace "sandboxes")."""

from django.urls import path

from . import views

app_name = "sandboxes"

urlpatterns = [
    path("sandboxes/", views.config_list, name="config_list"),
    path("sandboxes/capabilities/", views.capability_matrix, name="capability_matrix"),
    path("spaces/<uuid:space_id>/sandboxes/new/", views.config_create, name="config_create"),
    path("sandboxes/<uuid:config_id>/", views.config_detail, name="config_detail"),
    path("sandboxes/<uuid:config_id>/edit/", views.config_edit, name="config_edit"),
    path("sandboxes/<uuid:config_id>/delete/", views.config_delete, name="config_delete"),
    path("sandboxes/<uuid:config_id>/test/", views.config_test, name="config_test"),
    path("sandboxes/<uuid:config_id>/templates/", views.template_list, name="template_list"),
    path("sandboxes/<uuid:config_id>/templates/new/", views.template_build, name="template_build"),
    path("sandboxes/<uuid:config_id>/templates/delete/", views.template_delete, name="template_delete"),
    path("sandboxes/<uuid:config_id>/snapshots/delete/", views.snapshot_delete, name="snapshot_delete"),
    path("sessions/", views.session_list, name="session_list"),
]

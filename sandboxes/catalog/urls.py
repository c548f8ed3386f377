"""Routes of the catalog's pages: configs, their templates and snapshots, the capability
matrix and the platform's Backends section (namespace "sandboxes", joined in `sandboxes.urls`)."""

from django.urls import path

from . import config_pages as configs
from . import platform_pages as platform
from . import template_pages as templates

urlpatterns = [
    path("sandboxes/", configs.config_list, name="config_list"),
    path("sandboxes/capabilities/", configs.capability_matrix, name="capability_matrix"),
    path("spaces/<uuid:space_id>/sandboxes/new/", configs.config_create, name="config_create"),
    path("sandboxes/<uuid:config_id>/", configs.config_detail, name="config_detail"),
    path("sandboxes/<uuid:config_id>/edit/", configs.config_edit, name="config_edit"),
    path("sandboxes/<uuid:config_id>/test/", configs.config_test, name="config_test"),
    path("sandboxes/<uuid:config_id>/verify/", configs.config_verify, name="config_verify"),
    path("sandboxes/<uuid:config_id>/templates/", templates.template_list, name="template_list"),
    path("sandboxes/<uuid:config_id>/templates/new/", templates.template_build, name="template_build"),
    path("sandboxes/<uuid:config_id>/templates/delete/", templates.template_delete, name="template_delete"),
    path("sandboxes/<uuid:config_id>/snapshots/delete/", templates.snapshot_delete, name="snapshot_delete"),
    # The platform's Backends section (platform admins only).
    path("platform/backends/", platform.backend_list, name="backend_list"),
    path("platform/backends/new/", platform.backend_create, name="backend_create"),
    path("platform/backends/<uuid:backend_id>/", platform.backend_edit, name="backend_edit"),
    path("platform/backends/<uuid:backend_id>/test/", platform.backend_test, name="backend_test"),
]

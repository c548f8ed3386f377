"""Routes of the skills app (namespace "skills")."""

from django.urls import path

from . import image_views, views
from .sources import pages as source_pages

app_name = "skills"

urlpatterns = [
    path("skills/", views.skill_list, name="skill_list"),
    path("skills/import/", views.skill_import, name="skill_import"),
    path("skills/import/examples/", views.skill_import_examples, name="skill_import_examples"),
    path("skills/<uuid:skill_id>/", views.skill_detail, name="skill_detail"),
    path("skills/versions/<uuid:version_id>/", views.version_detail, name="version_detail"),
    path("skills/versions/<uuid:version_id>/delete/", views.version_delete, name="version_delete"),
    path(
        "skills/versions/<uuid:version_id>/dependencies/",
        views.version_dependencies,
        name="version_dependencies",
    ),
    path("skills/files/<uuid:file_id>/", views.file_detail, name="file_detail"),
]

# Skills from git repositories.
urlpatterns += [
    path("skills/import/git/", source_pages.git_import, name="git_import"),
    path("skills/git-hosts/", source_pages.git_hosts, name="git_hosts"),
    path("skills/<uuid:skill_id>/source/check/", source_pages.source_check, name="source_check"),
    path("skills/<uuid:skill_id>/source/update/", source_pages.source_update, name="source_update"),
]

# Skill images (install pipeline), per space.
urlpatterns += [
    path("skills/versions/<uuid:version_id>/install/", image_views.version_install, name="version_install"),
    path("skills/install/", image_views.quick_install, name="quick_install"),
    path("spaces/<uuid:space_id>/skill-image/", image_views.image_detail, name="image_detail"),
    path("spaces/<uuid:space_id>/skill-image/install/", image_views.image_install, name="image_install"),
    path("spaces/<uuid:space_id>/skill-image/uninstall/", image_views.image_uninstall, name="image_uninstall"),
    path(
        "spaces/<uuid:space_id>/skill-image/generations/<uuid:image_id>/rollback/",
        image_views.image_rollback,
        name="image_rollback",
    ),
    path("spaces/<uuid:space_id>/skill-image/snapshots/delete/", image_views.image_cleanup, name="image_cleanup"),
]

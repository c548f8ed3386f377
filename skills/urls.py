"""Routes of the skills app (namespace "skills")."""

from django.urls import path

from . import views

app_name = "skills"

urlpatterns = [
    path("skills/", views.skill_list, name="skill_list"),
    path("skills/import/", views.skill_import, name="skill_import"),
    path("skills/<uuid:skill_id>/", views.skill_detail, name="skill_detail"),
    path("skills/versions/<uuid:version_id>/", views.version_detail, name="version_detail"),
    path("skills/versions/<uuid:version_id>/delete/", views.version_delete, name="version_delete"),
    path("skills/files/<uuid:file_id>/", views.file_detail, name="file_detail"),
]

"""Routes of the skills app (namespace "skills")."""

from django.urls import path

from . import views

app_name = "skills"

urlpatterns = [
    path("skills/", views.skill_list, name="skill_list"),
]

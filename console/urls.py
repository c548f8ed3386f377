"""Root URLconf, and the console app's own routes (namespace "console")."""

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from sandboxes.network import pages as network_pages
from sandboxes.sessions import teardown_pages

from . import activity_views, palette, user_views, views

console_patterns = [
    path("", views.dashboard, name="dashboard"),
    path("spaces/", views.space_list, name="space_list"),
    path("spaces/new/", views.space_create, name="space_create"),
    path("spaces/<uuid:space_id>/", views.space_detail, name="space_detail"),
    path("spaces/<uuid:space_id>/edit/", views.space_edit, name="space_edit"),
    path("spaces/<uuid:space_id>/delete/", teardown_pages.space_delete, name="space_delete"),
    path("spaces/<uuid:space_id>/network/", network_pages.network_policy_edit, name="network_policy_edit"),
    path("spaces/<uuid:space_id>/limits/", views.space_limits, name="space_limits"),
    path("spaces/<uuid:space_id>/members/add/", views.member_add, name="member_add"),
    path(
        "spaces/<uuid:space_id>/members/<uuid:membership_id>/role/",
        views.member_role,
        name="member_role",
    ),
    path(
        "spaces/<uuid:space_id>/members/<uuid:membership_id>/remove/",
        views.member_remove,
        name="member_remove",
    ),
    path("platform/users/", user_views.user_list, name="user_list"),
    path("platform/users/new/", user_views.user_create, name="user_create"),
    path("platform/users/<int:user_id>/", user_views.user_detail, name="user_detail"),
    path("platform/users/<int:user_id>/invite/", user_views.user_invite, name="user_invite"),
    path("platform/users/<int:user_id>/deactivate/", user_views.user_deactivate, name="user_deactivate"),
    path("platform/users/<int:user_id>/reactivate/", user_views.user_reactivate, name="user_reactivate"),
    path("invite/<str:token>/", user_views.invite_accept, name="invite_accept"),
    path("account/logout-everywhere/", views.logout_everywhere, name="logout_everywhere"),
    path("search/", palette.search_view, name="search"),
    path("audit/", views.audit_list, name="audit_list"),
    path("jobs/", views.job_list, name="job_list"),
    path("jobs/diagnostics/", views.diagnostics_start, name="diagnostics_start"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<uuid:job_id>/cancel/", views.job_cancel, name="job_cancel"),
    path("platform/activity/", activity_views.activity_page, name="activity"),
    path("platform/activity/series.json", activity_views.activity_series, name="activity_series"),
]

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("django-admin/", admin.site.urls),
    path("api/v1/", include("sandboxes.api.urls")),
    path("", include("sandboxes.urls")),
    path("", include("skills.urls")),
    path("", include((console_patterns, "console"))),
]

# Error pages in the layout (console/errors.py).
handler400 = "console.errors.bad_request"
handler403 = "console.errors.permission_denied"
handler404 = "console.errors.page_not_found"
handler500 = "console.errors.server_error"

if settings.OIDC_ENABLED:
    urlpatterns.insert(0, path("oidc/", include("mozilla_django_oidc.urls")))

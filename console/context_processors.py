"""Template context shared by every page."""

from __future__ import annotations

from django.http import HttpRequest

NAV_ITEMS = [
    ("dashboard", "Dashboard", "console:dashboard"),
    ("spaces", "Spaces", "console:space_list"),
    ("sandboxes", "Sandboxes", "sandboxes:config_list"),
    ("skills", "Skills", "skills:skill_list"),
    ("sessions", "Sessions", "sandboxes:session_list"),
    ("jobs", "Jobs", "console:job_list"),
    ("audit", "Audit", "console:audit_list"),
]


# Shown to platform admins only (the pages answer 404 to anyone else).
PLATFORM_NAV_ITEMS = [
    ("backends", "Backends", "sandboxes:backend_list"),
    ("users", "Users", "console:user_list"),
    ("activity", "Activity", "console:activity"),
    ("pools", "Pools", "sandboxes:platform_pools"),
    ("unmanaged", "Unmanaged", "sandboxes:unmanaged_list"),
]


def navigation(request: HttpRequest) -> dict[str, object]:
    from django.conf import settings

    from console.access import is_platform_admin

    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {"nav_items": NAV_ITEMS, "sso_name": settings.OIDC_PROVIDER_NAME if settings.OIDC_ENABLED else ""}

    if is_platform_admin(getattr(request, "user", None)):
        return {"nav_items": NAV_ITEMS + PLATFORM_NAV_ITEMS}
    return {"nav_items": NAV_ITEMS}


def csp(request: HttpRequest) -> dict[str, str]:
    """`csp_nonce`: the nonce every <script> tag carries (console.security)."""
    return {"csp_nonce": getattr(request, "csp_nonce", "")}

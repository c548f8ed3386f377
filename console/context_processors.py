"""Template context shared by every page: the navigation, in groups, and the CSP nonce."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

# (group, [(section key, label, url name)]). The top bar shows the groups side by side on a
# wide screen and folds them under one "Menu" button on a narrow one.
NAV_GROUPS: list[tuple[str, list[tuple[str, str, str]]]] = [
    (
        "Work",
        [
            ("dashboard", "Dashboard", "console:dashboard"),
            ("spaces", "Spaces", "console:space_list"),
            ("sessions", "Sessions", "sandboxes:session_list"),
            ("skills", "Skills", "skills:skill_list"),
        ],
    ),
    (
        "Setup",
        [
            ("sandboxes", "Sandboxes", "sandboxes:config_list"),
            ("jobs", "Jobs", "console:job_list"),
            ("audit", "Audit", "console:audit_list"),
        ],
    ),
]
NAV_ITEMS = [item for _group, items in NAV_GROUPS for item in items]

# Shown to platform admins only (the pages answer 404 to anyone else).
PLATFORM_NAV_ITEMS = [
    ("backends", "Backends", "sandboxes:backend_list"),
    ("users", "Users", "console:user_list"),
    ("activity", "Activity", "console:activity"),
    ("pools", "Pools", "sandboxes:platform_pools"),
    ("unmanaged", "Unmanaged", "sandboxes:unmanaged_list"),
]


def nav_groups(user: Any) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """The groups this user sees: the platform's only for platform admins."""
    from console.access import is_platform_admin

    if is_platform_admin(user):
        return [*NAV_GROUPS, ("Platform", PLATFORM_NAV_ITEMS)]
    return NAV_GROUPS


def navigation(request: HttpRequest) -> dict[str, object]:
    from django.conf import settings

    user = getattr(request, "user", None)
    if not user or not user.is_authenticated:
        return {
            "nav_groups": NAV_GROUPS,
            "nav_items": NAV_ITEMS,
            "sso_name": settings.OIDC_PROVIDER_NAME if settings.OIDC_ENABLED else "",
        }
    groups = nav_groups(user)
    return {"nav_groups": groups, "nav_items": [item for _group, items in groups for item in items]}


def csp(request: HttpRequest) -> dict[str, str]:
    """`csp_nonce`: the nonce every <script> tag carries (console.security)."""
    return {"csp_nonce": getattr(request, "csp_nonce", "")}

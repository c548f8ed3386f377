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


def navigation(request: HttpRequest) -> dict[str, object]:
    return {"nav_items": NAV_ITEMS}

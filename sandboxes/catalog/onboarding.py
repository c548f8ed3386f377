"""The sandboxes app's steps of the dashboard's getting-started path (console.onboarding).

Each reads the database only: a config exists, a connection test succeeded, a session
exists, a terminal opened. The links go where the step is done.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.urls import reverse

from console.access import is_platform_admin
from console.models import AdminJob, JobStatus, Space
from console.onboarding import Step, onboarding_step

from ..models import SandboxConfig, Session, Terminal


def _configs(spaces: QuerySet[Space]) -> QuerySet[SandboxConfig]:
    return SandboxConfig.objects.filter(space__in=spaces).order_by("-is_default", "created")


@onboarding_step(10)
def create_config(user: Any, spaces: QuerySet[Space]) -> Step:
    title = "Create a sandbox config"
    config = _configs(spaces).select_related("space").first()
    if config is not None:
        return Step(
            "config", title, True, config.get_absolute_url(), "Open it", f"{config.name} in {config.space.name}"
        )
    granted = spaces.filter(granted_backends__isnull=False).distinct().order_by("created").first()
    if granted is not None:
        url = reverse("sandboxes:config_create", kwargs={"space_id": granted.id})
        return Step("config", title, False, url, "Create a config", f"In {granted.name}, on a backend it was granted.")
    if is_platform_admin(user):
        url = reverse("sandboxes:backend_create")
        return Step("config", title, False, url, "Register a backend", "No backend is granted to your spaces yet.")
    return Step("config", title, False, "", "", "No backend is granted to your spaces: ask a platform admin.")


@onboarding_step(20)
def test_config(user: Any, spaces: QuerySet[Space]) -> Step:
    title = "Test its connection"
    tested = AdminJob.objects.filter(
        space__in=spaces, kind="sandboxes.test_connection", status=JobStatus.SUCCEEDED
    ).exists()
    config = _configs(spaces).first()
    url = config.get_absolute_url() if config is not None else ""
    if tested:
        return Step("test", title, True, url, "Open the config", "A connection test succeeded.")
    return Step("test", title, False, url, "Test connection" if url else "", "Health, then create, exec and delete.")


@onboarding_step(40)
def start_session(user: Any, spaces: QuerySet[Space]) -> Step:
    title = "Start a session"
    session = Session.objects.filter(space__in=spaces).order_by("-created").first()
    if session is not None:
        return Step("session", title, True, session.get_absolute_url(), "Open it", f"Session {session.key}")
    url = reverse("sandboxes:session_list") + "#start-session"
    has_config = _configs(spaces).exists()
    return Step(
        "session", title, False, url if has_config else "", "Start one" if has_config else "", "A sandbox of its own."
    )


@onboarding_step(50)
def open_terminal(user: Any, spaces: QuerySet[Space]) -> Step:
    title = "Open its terminal"
    opened = Terminal.objects.filter(session__space__in=spaces, opened__isnull=False).exists()
    session = Session.objects.filter(space__in=spaces).exclude(sandbox_id="").order_by("-created").first()
    url = reverse("sandboxes:terminal_page", kwargs={"session_id": session.id}) if session is not None else ""
    if opened:
        return Step("terminal", title, True, url, "Open a terminal" if url else "", "A terminal opened.")
    return Step("terminal", title, False, url, "Open the terminal" if url else "", "A shell in the session's sandbox.")

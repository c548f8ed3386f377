"""The sandboxes app's steps of the dashboard's getting-started path (console.onboarding).

Each reads the database only, as scalar reads the dashboard makes in one query: a config
exists, a connection test succeeded, a session exists, a terminal opened. The links go where
the step is done. Sessions are picked by the sessions list's order (`list_activity`), which
an index holds, never by a sort of every session.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F, QuerySet
from django.urls import reverse

from console.access import is_platform_admin
from console.models import AdminJob, JobStatus, Space
from console.onboarding import Step, onboarding_step
from console.readings import exists, first

from ..models import PlatformBackend, SandboxConfig, Session, Terminal, list_activity


def _configs(spaces: QuerySet[Space]) -> QuerySet[SandboxConfig]:
    return SandboxConfig.objects.filter(space__in=spaces).order_by("-is_default", "created")


def _latest_sessions(spaces: QuerySet[Space]) -> QuerySet[Session]:
    return Session.objects.filter(space__in=spaces).order_by(
        list_activity().desc(), F("created").desc(), F("id").desc()
    )


def _config_reads(user: Any, spaces: QuerySet[Space]) -> dict[str, Any]:
    return {
        "config": first(_configs(spaces), id="id", name="name", space="space__name"),
        "granted": first(
            Space.objects.filter(pk__in=spaces, granted_backends__isnull=False).order_by("created"),
            id="id",
            name="name",
        ),
        # A backend registered already (the local engine `make start` registers) but granted to
        # none of these spaces: granting it is the step, not registering another.
        "backend": first(PlatformBackend.objects.order_by("created"), id="id", name="name"),
    }


@onboarding_step(10, reads=_config_reads)
def create_config(user: Any, found: dict[str, Any]) -> Step:
    title = "Create a sandbox config"
    config = found["config"]
    if config is not None:
        url = reverse("sandboxes:config_detail", kwargs={"config_id": config["id"]})
        return Step("config", title, True, url, "Open it", f"{config['name']} in {config['space']}")
    granted = found["granted"]
    if granted is not None:
        url = reverse("sandboxes:config_create", kwargs={"space_id": granted["id"]})
        return Step(
            "config", title, False, url, "Create a config", f"In {granted['name']}, on a backend it was granted."
        )
    backend = found["backend"]
    if is_platform_admin(user) and backend is not None:
        url = reverse("sandboxes:backend_edit", kwargs={"backend_id": backend["id"]}) + "#id_spaces"
        return Step(
            "config",
            title,
            False,
            url,
            f"Grant {backend['name']} to a space",
            "A backend is registered but granted to none of your spaces yet.",
        )
    if is_platform_admin(user):
        url = reverse("sandboxes:backend_create")
        return Step("config", title, False, url, "Register a backend", "No backend is granted to your spaces yet.")
    return Step("config", title, False, "", "", "No backend is granted to your spaces: ask a platform admin.")


def _test_reads(user: Any, spaces: QuerySet[Space]) -> dict[str, Any]:
    return {
        "tested": exists(
            AdminJob.objects.filter(space__in=spaces, kind="sandboxes.test_connection", status=JobStatus.SUCCEEDED)
        ),
        "config": first(_configs(spaces), id="id"),
    }


@onboarding_step(20, reads=_test_reads)
def test_config(user: Any, found: dict[str, Any]) -> Step:
    title = "Test its connection"
    config = found["config"]
    url = reverse("sandboxes:config_detail", kwargs={"config_id": config["id"]}) if config is not None else ""
    if found["tested"]:
        return Step("test", title, True, url, "Open the config", "A connection test succeeded.")
    return Step("test", title, False, url, "Test connection" if url else "", "Health, then create, exec and delete.")


def _session_reads(user: Any, spaces: QuerySet[Space]) -> dict[str, Any]:
    return {
        "session": first(_latest_sessions(spaces), id="id", key="key"),
        "has_config": exists(SandboxConfig.objects.filter(space__in=spaces)),
    }


@onboarding_step(40, reads=_session_reads)
def start_session(user: Any, found: dict[str, Any]) -> Step:
    title = "Start a session"
    session = found["session"]
    if session is not None:
        url = reverse("sandboxes:session_detail", kwargs={"session_id": session["id"]})
        return Step("session", title, True, url, "Open it", f"Session {session['key']}")
    url = reverse("sandboxes:session_list") + "#start-session"
    has_config = found["has_config"]
    return Step(
        "session", title, False, url if has_config else "", "Start one" if has_config else "", "A sandbox of its own."
    )


def _terminal_reads(user: Any, spaces: QuerySet[Space]) -> dict[str, Any]:
    return {
        "opened": exists(Terminal.objects.filter(session__space__in=spaces, opened__isnull=False)),
        "session": first(_latest_sessions(spaces).exclude(sandbox_id=""), id="id"),
    }


@onboarding_step(50, reads=_terminal_reads)
def open_terminal(user: Any, found: dict[str, Any]) -> Step:
    title = "Open its terminal"
    session = found["session"]
    url = reverse("sandboxes:terminal_page", kwargs={"session_id": session["id"]}) if session is not None else ""
    if found["opened"]:
        return Step("terminal", title, True, url, "Open a terminal" if url else "", "A terminal opened.")
    return Step("terminal", title, False, url, "Open the terminal" if url else "", "A shell in the session's sandbox.")

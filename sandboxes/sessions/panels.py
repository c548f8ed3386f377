"""Cards other rooms add to the session page, so the page needs no import of them (the
inbound URLs, the session's egress): each is registered once, in `SandboxesConfig.ready()`.

A panel names its template, the context it adds (from the request, the session and whether
the user may use it) and the page's own card it follows (`FILES` or `ARTIFACTS`); the page
renders the panels of a place in the order they were registered."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest

from ..models import Session

FILES = "files"
ARTIFACTS = "artifacts"


@dataclass(frozen=True)
class SessionPanel:
    name: str
    template: str
    context: Callable[[HttpRequest, Session, bool], dict[str, Any]]
    after: str


_panels: dict[str, SessionPanel] = {}  # registrations (state, not a cache)


def register_session_panel(panel: SessionPanel) -> None:
    if panel.after not in (FILES, ARTIFACTS):
        raise ValueError(f"a session panel follows {FILES!r} or {ARTIFACTS!r}, not {panel.after!r}")
    _panels[panel.name] = panel


def panels_context(request: HttpRequest, session: Session, *, can_use: bool) -> dict[str, Any]:
    """What the registered panels add to the page's context, and `panels`: their templates by place."""
    context: dict[str, Any] = {}
    places: dict[str, list[str]] = {FILES: [], ARTIFACTS: []}
    for panel in _panels.values():
        context.update(panel.context(request, session, can_use))
        places[panel.after].append(panel.template)
    return {**context, "panels": places}

"""Actions on several sessions at once from the sessions list: pause, resume, rebuild, delete.

`plan_actions` reads what the user asked for into steps, each saying what will happen to one
session, or why nothing will (a role too low, a state the action does not fit); the
confirmation page shows them. `run_actions` then does each step through the one runtime (and
deletes through the teardown job, as the session's own delete page does), one session's failure
never stopping the others.

Ids are checked as the access helper checks one: a session of a space the user is no member of
is a 404 for the whole request, so a forged id cannot even be named back.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.http import Http404

from console.models import ROLE_RANK, Role
from console.services import Actor, ServiceError

from ..backends.base import RemoteError
from ..catalog.lookups import failure_message
from ..models import Session, SessionState
from .listing import visible_spaces
from .runtime import Runtime
from .teardown import KIND_SESSION, start_teardown

MAX_SESSIONS = 50  # two pages of the list; each pause or resume is one engine call

ACTIONS: dict[str, tuple[str, Role]] = {
    "pause": ("Pause", Role.MEMBER),
    "resume": ("Resume", Role.MEMBER),
    "rebuild": ("Rebuild", Role.MEMBER),
    "delete": ("Delete", Role.ADMIN),
}
# Per-row pause and resume run at once (both undo each other); the rest confirm first.
UNCONFIRMED = {"pause", "resume"}


@dataclass(frozen=True)
class Step:
    """One session of an action: what will happen to it, or why nothing will (`skip`)."""

    session: Session
    will: str = ""
    skip: str = ""


@dataclass(frozen=True)
class Outcome:
    session: Session
    ok: bool
    message: str


def action_label(action: str) -> str:
    return ACTIONS[action][0]


def _ids(values: Iterable[str]) -> list[uuid.UUID]:
    ids: list[uuid.UUID] = []
    for value in values:
        try:
            parsed = uuid.UUID(str(value))
        except ValueError:
            raise Http404("No such session") from None
        if parsed not in ids:
            ids.append(parsed)
    return ids


def plan_actions(user: Any, action: str, values: Iterable[str]) -> list[Step]:
    """The steps of `action` on the sessions named by `values`, in the order given."""
    if action not in ACTIONS:
        raise Http404("No such action")
    ids = _ids(values)
    if not ids:
        raise ServiceError("Tick at least one session first.")
    if len(ids) > MAX_SESSIONS:
        raise ServiceError(f"At most {MAX_SESSIONS} sessions at once ({len(ids)} ticked).")
    roles = {visible.space.id: visible.role for visible in visible_spaces(user)}
    rows = Session.objects.select_related("space", "config__backend").filter(pk__in=ids)
    sessions = {session.id: session for session in rows if session.space_id in roles}
    if len(sessions) != len(ids):
        raise Http404("No such session")  # unknown, or of a space the user is no member of
    needed = ACTIONS[action][1]
    steps = []
    for session_id in ids:
        session = sessions[session_id]
        role = roles[session.space_id]
        if ROLE_RANK[role] < ROLE_RANK[needed]:
            steps.append(
                Step(
                    session,
                    skip=f"you are {role.label.lower()} in {session.space.name}; {needed.label.lower()}s may {action}",
                )
            )
        else:
            steps.append(_step(action, session))
    return steps


def _step(action: str, session: Session) -> Step:
    state = session.state
    if action == "pause":
        if state != SessionState.RUNNING:
            return Step(session, skip=f"it is {session.get_state_display().lower()}, not running")
        mode = "stopped (processes end, files stay)" if session.config.idle_mode == "stop" else "paused (memory kept)"
        return Step(session, will=f"its sandbox is {mode}; the next turn or Resume wakes it")
    if action == "resume":
        if state == SessionState.RUNNING:
            return Step(session, skip="it is running already")
        if state in (SessionState.PAUSED, SessionState.STOPPED):
            return Step(session, will=f"its {state} sandbox is started again")
        return Step(session, will="a new sandbox is created for it from its template")
    if action == "rebuild":
        why = " (it is out of date)" if session.is_stale else ""
        return Step(
            session,
            will=f"its sandbox is deleted and a new one created from the current template{why};"
            " running processes are lost, a persistent /workspace is kept",
        )
    return Step(
        session,
        will="its sandbox, binding, "
        + ("persistent /workspace, " if session.has_persistent_workspace else "")
        + "artifacts and row are deleted (a job per session)",
    )


def run_actions(action: str, steps: Iterable[Step], *, actor: Actor) -> list[Outcome]:
    """Do each planned step (the skipped ones are left); one failure never stops the rest."""
    runtime = Runtime()
    outcomes = []
    for step in steps:
        if step.skip:
            continue
        session = step.session
        try:
            if action == "pause":
                info = runtime.pause(session, actor=actor)
                message = f"{session.key}: {info.state}"
            elif action == "resume":
                resolved = runtime.resume(session, actor=actor)
                message = f"{session.key}: running ({resolved.action})"
            elif action == "rebuild":
                runtime.rebuild(session, actor=actor)
                message = f"{session.key}: rebuilt"
            else:
                start_teardown(KIND_SESSION, session.space, str(session.id), actor=actor)
                message = f"{session.key}: deleting (a job)"
        except (RemoteError, ServiceError) as exc:
            outcomes.append(Outcome(session, False, f"{session.key}: {failure_message(exc)}"))
        else:
            outcomes.append(Outcome(session, True, message))
    return outcomes

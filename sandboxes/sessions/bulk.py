"""Actions on several sessions at once from the sessions list: pause, resume, rebuild, delete.

`plan_actions` reads what the user asked for into steps, each saying what will happen to one
session, or why nothing will (a role too low, a state the action does not fit); the
confirmation page shows them. `start_actions` then runs them as one job (`sessions.bulk`):
the job plans again with the same rules (a session may have changed or gone since), does each
step through the one runtime (and deletes as the session's delete job does), reports each
session's outcome as it goes, and fails naming the sessions that failed when any did; one
session's failure never stops the others. A row's own pause or resume (`run_step`) is one
engine call and runs in the request.

Ids are checked as the access helper checks one: a session of a space the user is no member of
is a 404 for the whole request, so a forged id cannot even be named back.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.http import Http404

from console.jobs import JobContext, JobFailed, job_handler, start_job
from console.models import ROLE_RANK, AdminJob, Role
from console.services import Actor, ServiceError

from ..backends.base import RemoteError
from ..catalog.lookups import failure_message
from ..models import Session, SessionState
from .listing import visible_spaces
from .runtime import Runtime, SessionDeleted
from .teardown import KIND_SESSION, delete_session, running_teardown

KIND_BULK = "sessions.bulk"

MAX_SESSIONS = 50  # two pages of the list; each pause or resume is one engine call

ACTIONS: dict[str, tuple[str, Role]] = {
    "pause": ("Pause", Role.MEMBER),
    "resume": ("Resume", Role.MEMBER),
    "rebuild": ("Rebuild", Role.MEMBER),
    "delete": ("Delete", Role.ADMIN),
}
# Per-row pause and resume run at once (both undo each other); the rest confirm first.
UNCONFIRMED = {"pause", "resume"}
GONE = "it no longer exists"


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
    gone: bool = False  # deleted meanwhile (by a second submit, its own delete): nothing to do


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
    roles, sessions = _visible(user, ids)
    if len(sessions) != len(ids):
        raise Http404("No such session")  # unknown, or of a space the user is no member of
    return [_planned(action, sessions[session_id], roles) for session_id in ids]


def _visible(user: Any, ids: list[uuid.UUID]) -> tuple[dict[Any, Role], dict[uuid.UUID, Session]]:
    """The user's role per space, and those of `ids` that are sessions of these spaces."""
    roles = {visible.space.id: visible.role for visible in visible_spaces(user)}
    rows = Session.objects.select_related("space", "config__backend").filter(pk__in=ids)
    return roles, {session.id: session for session in rows if session.space_id in roles}


def _planned(action: str, session: Session, roles: dict[Any, Role]) -> Step:
    needed = ACTIONS[action][1]
    role = roles[session.space_id]
    if ROLE_RANK[role] < ROLE_RANK[needed]:
        return Step(
            session, skip=f"you are {role.label.lower()} in {session.space.name}; {needed.label.lower()}s may {action}"
        )
    return _step(action, session)


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
        + "artifacts and row are deleted",
    )


def run_step(action: str, session: Session, *, actor: Actor, runtime: Runtime | None = None) -> Outcome:
    """Do one planned step; a backend's or a service's refusal is a failed outcome in words."""
    runtime = runtime or Runtime()
    try:
        if action == "pause":
            message = str(runtime.pause(session, actor=actor).state)
        elif action == "resume":
            message = f"running ({runtime.resume(session, actor=actor).action})"
        elif action == "rebuild":
            runtime.rebuild(session, actor=actor)
            message = "rebuilt"
        else:
            if running_teardown(KIND_SESSION, str(session.id)) is not None:
                raise ServiceError("its deletion is already running as its own job")
            delete_session(session, actor=actor)
            message = "deleted"
    except SessionDeleted:
        return Outcome(session, False, f"{session.key}: {GONE}", gone=True)
    except (RemoteError, ServiceError) as exc:
        return Outcome(session, False, f"{session.key}: {failure_message(exc)}")
    return Outcome(session, True, f"{session.key}: {message}")


def start_actions(action: str, steps: list[Step], *, actor: Actor) -> AdminJob:
    """The job doing `steps` (the skipped ones are listed again, as the job finds them). It
    belongs to the sessions' space when they share one; otherwise its starter follows it."""
    spaces = {step.session.space_id for step in steps}
    space = steps[0].session.space if len(spaces) == 1 else None
    params = {"action": action, "sessions": [str(step.session.id) for step in steps]}
    return start_job(KIND_BULK, actor=actor, space=space, params=params)


@job_handler(KIND_BULK, label="Act on sessions")
def bulk_actions_job(ctx: JobContext) -> dict[str, Any]:
    action, ids = ctx.params["action"], [uuid.UUID(value) for value in ctx.params["sessions"]]
    user = ctx.job.created_by
    if user is None or not user.is_active:
        raise JobFailed("the user who started these actions no longer exists or is deactivated")
    actor = Actor(user=user)
    roles, sessions = _visible(user, ids)
    runtime = Runtime()
    outcomes: list[dict[str, str]] = []
    for number, session_id in enumerate(ids, start=1):
        session = sessions.get(session_id)
        if session is None:
            row = {"name": str(session_id), "space": "", "status": "skipped", "message": GONE}
        else:
            step = _planned(action, session, roles)
            if step.skip:
                row = _row(session, "skipped", step.skip)
            else:
                outcome = run_step(action, session, actor=actor, runtime=runtime)
                status = "done" if outcome.ok else "skipped" if outcome.gone else "failed"
                row = _row(session, status, outcome.message.partition(": ")[2])
        outcomes.append(row)
        ctx.progress(100 * number // len(ids), f"{row['name']}: {row['status']}: {row['message']}")
    counts = {kind: sum(row["status"] == kind for row in outcomes) for kind in ("done", "failed", "skipped")}
    result: dict[str, Any] = {"outcomes": outcomes, **counts}
    if counts["failed"]:
        failed = "; ".join(f"{row['name']}: {row['message']}" for row in outcomes if row["status"] == "failed")
        raise JobFailed(f"{action_label(action)}: {counts['failed']} of {len(ids)} failed ({failed})", result=result)
    return result


def _row(session: Session, outcome: str, message: str) -> dict[str, str]:
    return {"name": session.key, "status": outcome, "space": session.space.name, "message": message}

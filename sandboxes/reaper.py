"""The reaper and the idle sweep: periodic housekeeping of session sandboxes.

Reaper: on every config, list the sandboxes this installation created (paged, with the
repeated-page-token guard) and delete those no binding owns once they are older than a
grace period, paused ones included. Ownership comes from the binding store and ages from
the backend's own timestamps, never from this process's memory. A sandbox without this
installation's metadata is never listed, so never touched. When the binding store does not
answer, nothing is deleted.

Idle sweep: sessions idle past their config's timeout are idled (paused or stopped, per the
config), or, on a backend that idles its sandboxes itself (E2B, Cube: TTL with auto-pause),
left to it and their state read back; the next resolve brings them back with /workspace
intact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from console.jobs import JobContext, JobFailed, job_handler
from console.models import AdminJob, JobStatus
from console.services import SYSTEM

from .backends.base import (
    META_CONFIG,
    META_INSTALLATION,
    META_PURPOSE,
    META_SESSION,
    META_SPACE,
    ListQuery,
    RemoteError,
    SandboxState,
)
from .binding import SessionStore, binding_key, get_store
from .models import SandboxConfig, Session, SessionState
from .runtime import Runtime, backend_for

# Longest a job may keep a sandbox of its own (skill builds, verification) before it counts
# as a leftover.
JOB_GRACE = timedelta(hours=1)


@dataclass
class ReapReport:
    config: str
    listed: int = 0
    bound: int = 0
    too_young: int = 0
    deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "listed": self.listed,
            "bound": self.bound,
            "too_young": self.too_young,
            "deleted": self.deleted,
            "errors": self.errors,
        }


def is_owned(store: SessionStore, metadata: dict[str, str] | Any, sandbox_id: str) -> bool:
    space, key = metadata.get(META_SPACE), metadata.get(META_SESSION)
    if not space or not key:
        return False  # e.g. a connection test's leftover
    binding = store.get_binding(binding_key(space, key))
    return binding is not None and binding.sandbox_id == sandbox_id


def reap_config(config: SandboxConfig, store: SessionStore, *, grace: timedelta) -> ReapReport:
    report = ReapReport(config=f"{config.space.name} / {config.name}")
    query = ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID, META_CONFIG: str(config.id)})
    backend = backend_for(config)
    now = timezone.now()
    try:
        for info in backend.iter_sandboxes(query):
            report.listed += 1
            if info.state == SandboxState.GONE:
                continue
            if is_owned(store, info.metadata, info.sandbox_id):
                report.bound += 1
                continue
            # A job's sandbox (a skill build, say) may legitimately outlive the session grace.
            allowed = max(grace, JOB_GRACE) if info.metadata.get(META_PURPOSE) else grace
            if info.started_at is None or now - info.started_at < allowed:
                report.too_young += 1
                continue
            backend.delete(info.sandbox_id)
            report.deleted.append(info.sandbox_id)
    except RemoteError as exc:
        report.errors.append(f"{exc.kind}: {exc.message}")
    return report


def reap_all(store: SessionStore | None = None, *, grace: timedelta | None = None) -> list[ReapReport]:
    store = store or get_store()
    grace = grace if grace is not None else timedelta(seconds=settings.REAPER_GRACE_S)
    configs = SandboxConfig.objects.select_related("space").order_by("created")
    return [reap_config(config, store, grace=grace) for config in configs]


@job_handler("sandboxes.reap", label="Reaper pass")
def reap_job(ctx: JobContext) -> dict[str, Any]:
    # Keep a day of reaper history; each pass is its own audited job.
    AdminJob.objects.filter(
        kind="sandboxes.reap", status=JobStatus.SUCCEEDED, created__lt=timezone.now() - timedelta(days=1)
    ).delete()
    reports = reap_all()
    for report in reports:
        ctx.log(
            f"{report.config}: listed {report.listed}, bound {report.bound}, young {report.too_young}, "
            f"deleted {len(report.deleted)}" + (f", errors: {'; '.join(report.errors)}" if report.errors else "")
        )
    result = {"configs": [r.as_json() for r in reports], "deleted": sum(len(r.deleted) for r in reports)}
    errors = [e for r in reports for e in r.errors]
    if errors:
        raise JobFailed("; ".join(errors[:5]))
    return result


def idle_sweep(runtime: Runtime | None = None) -> int:
    """Idle the running sessions whose config's timeout has passed; returns how many."""
    runtime = runtime or Runtime()
    now = timezone.now()
    idled = 0
    running = Session.objects.filter(state=SessionState.RUNNING, last_activity__isnull=False).select_related(
        "config", "space"
    )
    for session in running:
        if now - session.last_activity < timedelta(seconds=session.config.idle_timeout_s):  # type: ignore[operator]
            continue
        try:
            backend = backend_for(session.config)
            if backend.idles_itself():
                # Left to the backend's own auto-pause: only read the state back for the pages.
                state = backend.get(session.sandbox_id).state
                if state in (SandboxState.PAUSED, SandboxState.STOPPED):
                    Session.objects.filter(pk=session.pk).update(state=str(state))
                    idled += 1
                continue
            runtime.pause(session, actor=SYSTEM)
            idled += 1
        except Exception:  # noqa: S112 - one session's failure must not stop the sweep
            continue
    return idled


def start_reaper_pass() -> None:
    """The periodic entry point: one audited job per pass."""
    from console.jobs import start_job

    start_job("sandboxes.reap", actor=SYSTEM)

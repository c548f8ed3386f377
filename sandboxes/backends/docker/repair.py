"""Bounded control calls and the repair of a container whose engine and runtime disagree.

A `docker pause` racing a `docker exec` can leave the freezer cgroup stuck half-way
(docker/for-linux#891): the pause never returns, `docker inspect` hangs behind it, and once
the cgroup is thawed by hand the engine says "paused" while runc says running — every exec
and every unpause then fails with an internal error. The console keeps that race from
happening (one guarded pause, sandboxes/sessions/runtime.py), and this module bounds and
mends what is left:

- control calls (pause, unpause, inspect) carry their own timeout, the backend option
  `control_timeout` (seconds, default 10): a wedged engine answers `timeout` in seconds
  instead of holding a web worker for the client's whole patience;
- `repair()` compares the engine's view with the freezer cgroup's (on a local engine, where
  the cgroup file system is this host's) and mends a disagreement: a freezer stuck freezing
  or frozen under a container the engine calls running is thawed; a container the engine
  calls paused over a thawed freezer is frozen again and unpaused through the engine (so
  both agree it runs), or else killed and started again (its writable layer and workspace
  volume are kept).
"""

from __future__ import annotations

import glob
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from ..base import ErrorKind, RemoteError
from .common import _engine_call

if TYPE_CHECKING:
    from .backend import DockerBackend

logger = logging.getLogger(__name__)

DEFAULT_CONTROL_TIMEOUT_S = 10.0
CGROUP_ROOT = "/sys/fs/cgroup"
# Where the engine puts a container's freezer cgroup: cgroup v1 (cgroupfs and systemd
# drivers), then cgroup v2.
_V1_PATTERNS = ("freezer/docker/{id}", "freezer/system.slice/docker-{id}.scope", "freezer/*/docker/{id}")
_V2_PATTERNS = ("system.slice/docker-{id}.scope", "docker/{id}", "*/docker/{id}")
FROZEN, FREEZING, THAWED = "FROZEN", "FREEZING", "THAWED"


def control_timeout(given: float | None) -> float:
    """The adapter option `control_timeout` (seconds; None: the default), checked."""
    value = DEFAULT_CONTROL_TIMEOUT_S if given is None else given
    if not 0 < value <= 600:
        raise RemoteError(ErrorKind.INVALID, "option 'control_timeout' is between 0 and 600 seconds")
    return value


# --- Bounded control calls --------------------------------------------------------------


def inspect(backend: DockerBackend, container: str, *, timeout_s: float | None = None) -> dict[str, Any]:
    return backend.engine.inspect_container(container, timeout_s=timeout_s)


def pause(backend: DockerBackend, container: str, *, timeout_s: float | None = None) -> None:
    _post(backend, "pause", container, f"idling sandbox {container}", timeout_s)


def unpause(backend: DockerBackend, container: str, *, timeout_s: float | None = None) -> None:
    _post(backend, "unpause", container, f"resuming sandbox {container}", timeout_s)


def _post(backend: DockerBackend, verb: str, container: str, what: str, timeout_s: float | None) -> None:
    api = backend.api
    with _engine_call(what):
        response = api._post(api._url("/containers/{0}/" + verb, container), timeout=backend.engine.bound(timeout_s))
        api._raise_for_status(response)


# --- The freezer cgroup -----------------------------------------------------------------


class Freezer:
    """A container's freezer cgroup on this host (v1 `freezer.state`, v2 `cgroup.freeze`)."""

    def __init__(self, path: str, *, v2: bool) -> None:
        self.path, self.v2 = path, v2

    @classmethod
    def find(cls, container_id: str, root: str = CGROUP_ROOT) -> Freezer | None:
        if not container_id or "/" in container_id or "*" in container_id:
            return None
        for pattern in _V1_PATTERNS:
            for found in glob.glob(os.path.join(root, pattern.format(id=container_id), "freezer.state")):
                return cls(found, v2=False)
        for pattern in _V2_PATTERNS:
            for found in glob.glob(os.path.join(root, pattern.format(id=container_id), "cgroup.freeze")):
                return cls(found, v2=True)
        return None

    def state(self) -> str:
        if not self.v2:
            with open(self.path) as handle:
                return handle.read().strip()
        with open(self.path) as handle:
            wanted = handle.read().strip() == "1"
        events = os.path.join(os.path.dirname(self.path), "cgroup.events")
        with open(events) as handle:
            frozen = any(line.strip() == "frozen 1" for line in handle)
        if wanted:
            return FROZEN if frozen else FREEZING
        return THAWED

    def _write(self, state: str) -> None:
        value = state if not self.v2 else ("1" if state == FROZEN else "0")
        with open(self.path, "w") as handle:
            handle.write(value)

    def thaw(self) -> None:
        self._write(THAWED)

    def freeze(self, wait_s: float = 5.0) -> bool:
        """Freeze; True once the whole cgroup is frozen (thawed again and False past wait_s)."""
        self._write(FROZEN)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.state() == FROZEN:
                return True
            time.sleep(0.05)
        self.thaw()
        return False


# --- Repair -----------------------------------------------------------------------------


def repair(backend: DockerBackend, sandbox_id: str) -> str | None:
    """Mend a disagreement between the engine and the freezer (module docstring); what was
    done in words, or None when they agree (or the engine is not on this host)."""
    if not backend.engine_is_local():
        return None
    seen = backend.engine.seen(sandbox_id)
    container = seen.sandbox_id if seen is not None else sandbox_id
    freezer = Freezer.find(container)
    if freezer is None and "-" not in container and len(container) < 64:
        container = inspect(backend, container)["Id"]  # a short id: the engine knows the full one
        freezer = Freezer.find(container)
    if freezer is None:
        return None
    done: list[str] = []
    for _ in range(3):
        step = _repair_step(backend, container, freezer)
        if step is None:
            break
        done.append(step)
    if done:
        logger.warning(
            "repaired sandbox %s: %s", container, "; ".join(done), extra={"sandbox_id": container, "repair": done}
        )
    return "; ".join(done) or None


def _repair_step(backend: DockerBackend, container: str, freezer: Freezer) -> str | None:
    try:
        attrs = inspect(backend, container)
    except RemoteError as exc:
        if exc.kind != ErrorKind.TIMEOUT:
            raise
        if freezer.state() == THAWED:
            raise
        # The engine hangs behind a freeze that never completed: thawing lets its pause return.
        freezer.thaw()
        return "thawed a freeze the engine was stuck in"
    state = attrs.get("State") or {}
    engine_paused = bool(state.get("Paused"))
    engine_running = bool(state.get("Running"))
    cgroup = freezer.state()
    if engine_running and not engine_paused and cgroup in (FROZEN, FREEZING):
        freezer.thaw()
        return "thawed a frozen container the engine reported running"
    if engine_paused and cgroup != FROZEN:
        if cgroup == FREEZING:
            freezer.thaw()
        if freezer.freeze():
            try:
                unpause(backend, container)
                return "unpaused a container the engine reported paused while its processes ran"
            except RemoteError:
                freezer.thaw()
        with _engine_call(f"restarting sandbox {container}"):
            backend.api.kill(container)
        backend.connect(container)  # starts it again, its workspace and egress state kept
        return "restarted a container the engine reported paused while its processes ran"
    return None

"""Review of issue 12 (a): a file GET racing a pause answers like a paused session.

`files_view` checks the sandbox is running (`running_sandbox`), then execs the helper in it.
A pause landing between the two (the idle sweep, a member's Pause, the engine) makes the
exec fail on a paused container. The answer should still be the documented 409
`session_not_running` naming the POST that wakes it, never a 500, and never a wake.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import docker
import pytest

from sandboxes.models import Session
from tests.sandboxes.api.test_get_never_wakes import KEY, Agent, agent  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


def _thaw(container_id: str) -> None:
    """Thaw the container's freezer cgroup (v1 or v2) behind the engine's back. An exec whose
    `runc init` joined the cgroup as it froze stays frozen, and the engine then holds the
    container's lock for ever (docker/for-linux#891): every later inspect, unpause or removal
    of it hangs, and with them the rest of the run. Thawing lets that exec finish."""
    roots = [Path("/sys/fs/cgroup/freezer/docker"), Path("/sys/fs/cgroup/docker"), Path("/sys/fs/cgroup/system.slice")]
    for path in (roots[0] / container_id / "freezer.state", roots[1] / container_id / "cgroup.freeze"):
        if path.exists():
            path.write_text("THAWED" if path.name == "freezer.state" else "0")
    scope = roots[2] / f"docker-{container_id}.scope" / "cgroup.freeze"
    if scope.exists():
        scope.write_text("0")


def _unpause(container: Any) -> None:
    """Unpause, thawing the cgroup first if the engine does not answer within 5 s."""
    done, thawed = threading.Event(), threading.Event()

    def rescue() -> None:
        if not done.is_set():
            _thaw(container.id)
            thawed.set()

    watchdog = threading.Timer(5, rescue)
    watchdog.start()
    try:
        container.unpause()
    except docker.errors.APIError:
        if not thawed.is_set():  # the thaw may leave the engine nothing to resume
            raise
    finally:
        done.set()
        watchdog.cancel()


def test_a_file_get_racing_a_pause_answers_session_not_running(agent: Agent) -> None:  # noqa: F811
    assert agent.post("resolve").status_code == 200
    session = Session.objects.get(key=KEY)
    container = docker.from_env().containers.get(session.sandbox_id)
    stop = threading.Event()

    def flip() -> None:  # running for a moment, then paused for a while (as a Pause stays)
        while not stop.is_set():
            container.pause()
            time.sleep(0.3)
            _unpause(container)
            time.sleep(0.005)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    seen: Counter[tuple[int, str]] = Counter()
    try:
        for _ in range(40):
            response = agent.get("files", path="")
            code = response.json().get("error", {}).get("code", "") if response.status_code != 200 else ""
            seen[(response.status_code, code)] += 1
    finally:
        stop.set()
        flipper.join()
    print(dict(seen))
    wrong: dict[Any, int] = {k: n for k, n in seen.items() if k[0] != 200 and k != (409, "session_not_running")}
    assert not wrong, f"answers other than 200 and 409 session_not_running: {dict(seen)}"

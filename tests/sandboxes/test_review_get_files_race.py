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
from typing import Any

import docker
import pytest

from sandboxes.models import Session
from tests.sandboxes.test_api_get_never_wakes import KEY, Agent, agent  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


def test_a_file_get_racing_a_pause_answers_session_not_running(agent: Agent) -> None:  # noqa: F811
    assert agent.post("resolve").status_code == 200
    session = Session.objects.get(key=KEY)
    container = docker.from_env().containers.get(session.sandbox_id)
    stop = threading.Event()

    def flip() -> None:  # running for a moment, then paused for a while (as a Pause stays)
        while not stop.is_set():
            container.pause()
            time.sleep(0.3)
            container.unpause()
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

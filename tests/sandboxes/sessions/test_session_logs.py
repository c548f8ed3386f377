"""The session page's Logs card (sandboxes/sessions/logs.py) and the Docker adapter's read of a
sandbox's own output (sandboxes/backends/docker/logs.py): what the container printed, escaped,
bounded in lines and bytes, read from a paused sandbox without resuming it, members only,
and said in words where the backend offers no logs or the sandbox is gone."""

from __future__ import annotations

import time
from typing import Any

import docker
import pytest
from django.urls import reverse

from console.services import SYSTEM
from sandboxes.backends.base import SandboxState
from sandboxes.backends.capabilities import MAX_LOG_BYTES, MAX_LOG_LINES, bounded_logs
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.logs import DEFAULT_TAIL, LogsReading, read_session_logs, tail_of
from sandboxes.sessions.runtime import Runtime
from tests.factories import make_config
from tests.personas import World

pytestmark = pytest.mark.django_db


def print_in(session: Session, script: str) -> None:
    """Write to the sandbox's main process's output, as the process itself would (root, by the
    engine: the session user may not write to PID 1's descriptors)."""
    container = docker.from_env().containers.get(session.sandbox_id)
    result = container.exec_run(["sh", "-c", f"{{ {script} ; }} > /proc/1/fd/1"], user="root")
    assert result.exit_code == 0, result.output


def read_until(session: Session, last: str, tail: int = DEFAULT_TAIL) -> LogsReading:
    """The logs once `last` ends them: the engine's log driver writes a moment after the print."""
    deadline = time.monotonic() + 10
    while True:
        logs = read_session_logs(session, tail=tail)
        if logs.text.endswith(last) or time.monotonic() > deadline:
            return logs
        time.sleep(0.1)


@pytest.fixture
def live(world: World, session_config: SandboxConfig) -> Session:
    return Runtime().resolve(world.space_a, "with-logs").session


@pytest.mark.docker
def test_the_card_shows_what_the_sandbox_printed_escaped(world: World, live: Session) -> None:
    print_in(live, "printf 'first line\\n<script>alert(1)</script>\\n'")
    read_until(live, "</script>\n")
    url = reverse("sandboxes:session_logs", args=[live.id])
    card = world.client_for("bob").get(url, headers={"HX-Request": "true"}).content.decode()
    assert "first line" in card
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in card
    assert "<script>alert(1)" not in card
    page = world.client_for("bob").get(url).content.decode()  # without JavaScript: a page
    assert "Logs of with-logs" in page
    assert "first line" in page
    detail = world.client_for("bob").get(live.get_absolute_url()).content.decode()
    assert f'hx-get="{url}"' in detail


@pytest.mark.docker
def test_lines_and_bytes_are_bounded(world: World, live: Session) -> None:
    print_in(live, "seq 1 3000")
    logs = read_until(live, "3000\n", tail=50)
    assert logs.status == "shown"
    assert logs.text.splitlines() == [str(n) for n in range(2951, 3001)]
    assert logs.truncated
    # One endless line: the read keeps the end, within the byte cap.
    print_in(live, "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo after")
    capped = read_until(live, "after\n", tail=MAX_LOG_LINES)
    assert len(capped.text.encode()) <= MAX_LOG_BYTES
    assert capped.text.endswith("after\n")
    assert capped.truncated
    assert "3000\n" not in capped.text


@pytest.mark.docker
def test_a_paused_sandbox_is_read_without_waking_it(world: World, live: Session) -> None:
    print_in(live, "echo before the pause")
    read_until(live, "before the pause\n")
    Runtime().pause(live, actor=SYSTEM)
    logs = read_session_logs(live)
    assert "before the pause" in logs.text
    assert get_backend(live.config).get(live.sandbox_id).state == SandboxState.PAUSED
    live.refresh_from_db()
    assert live.state == "paused"


@pytest.mark.docker
def test_a_sandbox_gone_behind_the_consoles_back_is_said(world: World, live: Session) -> None:
    docker.from_env().containers.get(live.sandbox_id).remove(force=True)
    logs = read_session_logs(live)
    assert logs.status == "none"
    assert "gone" in logs.message


@pytest.mark.parametrize(("who", "status"), [("carol", 403), ("charlie", 404)])
def test_members_only_outsiders_get_404(world: World, who: str, status: int) -> None:
    config = make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    session = Session.objects.create(space=world.space_a, key="quiet", config=config)
    url = reverse("sandboxes:session_logs", args=[session.id])
    assert world.client_for(who).get(url).status_code == status
    detail = world.client_for("carol").get(session.get_absolute_url()).content.decode()
    assert url not in detail
    assert "Members of Space A can read" in detail


def test_a_backend_without_logs_says_so(world: World) -> None:
    config = make_config(world.space_a, kind="e2b", endpoint="http://127.0.0.1:9/", api_key="k", is_default=True)
    session = Session.objects.create(space=world.space_a, key="remote", config=config)
    assert get_backend(config).logs() is None
    card = world.client_for("bob").get(
        reverse("sandboxes:session_logs", args=[session.id]), headers={"HX-Request": "true"}
    )
    assert card.status_code == 200
    assert 'id="logs-unsupported"' in card.content.decode()
    assert "does not offer the sandbox&#x27;s output" in card.content.decode()


def test_no_sandbox_yet_is_said(world: World) -> None:
    config = make_config(world.space_a, is_default=True)
    session = Session.objects.create(space=world.space_a, key="never-run", config=config)
    assert read_session_logs(session).status == "none"


@pytest.mark.parametrize(
    ("asked", "tail"), [(None, DEFAULT_TAIL), ("50", 50), ("7", DEFAULT_TAIL), ("x", DEFAULT_TAIL)]
)
def test_only_the_offered_tails_are_read(asked: Any, tail: int) -> None:
    assert tail_of(asked) == tail


def test_the_byte_cap_cuts_at_a_line_start() -> None:
    data = b"a" * 100 + b"\n" + b"b" * (MAX_LOG_BYTES - 10) + b"\n" + b"end\n"
    logs = bounded_logs(data, MAX_LOG_LINES)
    assert logs.truncated
    assert logs.data.startswith(b"b")
    assert logs.data.endswith(b"end\n")
    assert bounded_logs(b"one\ntwo\n", 5) == bounded_logs(b"one\ntwo\n", 2)
    assert bounded_logs(b"one\ntwo\n", 1).data == b"two\n"

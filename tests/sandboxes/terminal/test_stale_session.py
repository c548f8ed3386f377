"""Opening the terminal of a stale session never rebuilds it: the page asks first.

The session is paused, out of date (a skill install made it stale) and runs `sleep 9999`.
The terminal page offers "Rebuild now" and "Open as is" instead of opening at once; opening
it as is resumes the same sandbox, and the process is still there.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.services import Actor
from sandboxes.backends.base import ExecRequest, PtySize, SandboxState
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from sandboxes.terminal.shells import open_shell
from tests.personas import World

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

KEY = "stale-terminal"


@pytest.fixture
def stale_paused(world: World, session_config: SandboxConfig) -> Session:
    runtime = Runtime()
    session = runtime.resolve(world.space_a, KEY).session
    ran = runtime.exec(session, ExecRequest(shell="nohup sleep 9999 >/dev/null 2>&1 &", timeout_s=10))
    assert ran.exit_code == 0
    Session.objects.filter(pk=session.pk).update(stale_at=timezone.now())
    session.refresh_from_db()
    runtime.pause(session, actor=Actor(user=world.alice))
    session.refresh_from_db()
    assert session.is_stale
    assert session.state == "paused"
    return session


def test_the_terminal_page_of_a_stale_session_asks_before_anything_opens(world: World, stale_paused: Session) -> None:
    client = Client()
    client.force_login(world.bob)
    url = reverse("sandboxes:terminal_page", kwargs={"session_id": stale_paused.id})
    page = client.get(url).content.decode()
    assert 'id="terminal-stale-question"' in page
    assert 'id="terminal-rebuild-now"' in page
    assert 'id="terminal-open-as-is"' in page
    assert "js/terminal.js" not in page
    assert 'id="terminal"' not in page
    as_is = client.get(url, {"as_is": "1"}).content.decode()
    assert 'id="terminal-stale-question"' not in as_is
    assert "js/terminal.js" in as_is
    # Rebuild now rebuilds, then comes back to the terminal page.
    answer = client.post(
        reverse("sandboxes:session_action", kwargs={"session_id": stale_paused.id, "action": "rebuild"}),
        {"next": "terminal"},
    )
    assert answer.status_code == 302
    assert answer["Location"] == url
    stale_paused.refresh_from_db()
    assert not stale_paused.is_stale


def test_opening_the_shell_of_a_stale_paused_session_resumes_it_and_keeps_its_processes(
    stale_paused: Session,
) -> None:
    before = (stale_paused.sandbox_id, stale_paused.binding_version)
    runtime = Runtime()
    runtime.begin_turn(stale_paused)  # even with a turn's rebuild ticket unused
    opened = open_shell(str(stale_paused.pk), "t-stale", PtySize(rows=24, cols=80))
    try:
        stale_paused.refresh_from_db()
        assert (opened.sandbox_id, stale_paused.binding_version) == before
        assert (stale_paused.sandbox_id, stale_paused.state) == (before[0], "running")
        backend = get_backend(stale_paused.config)
        assert backend.get(before[0]).state == SandboxState.RUNNING
        ps = backend.exec(before[0], ExecRequest(argv=("pgrep", "-f", "sleep 9999"), timeout_s=10))
        assert ps.exit_code == 0, "the running sleep 9999 was lost"
    finally:
        opened.handle.kill()
    assert stale_paused.execs_in_flight == 0

"""Live resource use of a session's sandbox: Backend.stats() on real Docker and the E2B
protocol fake, and the session page's panel (HTMX poll and the numbers at page load)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse

from console.models import AuditEvent
from sandboxes.backends.base import META_INSTALLATION, ExecRequest, ListQuery, SandboxSpec, SandboxState
from sandboxes.backends.e2b.backend import E2BBackend
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.stats import read_session_stats
from tests.fakes.fixtures import FakeHandle
from tests.personas import World
from tests.support.backend_conformance import OFFLINE

pytestmark = pytest.mark.django_db


@pytest.fixture
def live_session(world: World, session_config: SandboxConfig) -> Session:
    return Runtime().resolve(world.space_a, "stats-1").session


def sandboxes_of(config: SandboxConfig) -> list[tuple[str, Any]]:
    """The sandboxes of this test's installation (others' tests share the engine)."""
    backend = get_backend(config)
    query = ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})
    return sorted((i.sandbox_id, i.state) for i in backend.iter_sandboxes(query))


@pytest.mark.docker
def test_a_running_docker_sandbox_reports_cpu_memory_and_network(world: World, live_session: Session) -> None:
    # Some memory in use and some CPU burnt while the engine reads.
    Runtime().exec(live_session, ExecRequest(shell="head -c 20000000 /dev/zero | tail -c 1 >/dev/null; echo ok"))
    reading = read_session_stats(live_session)
    assert reading.status == "running", reading.message
    stats = reading.stats
    assert stats is not None
    assert stats.cpu_percent is not None
    assert stats.cpu_percent >= 0
    assert stats.memory_bytes is not None
    assert stats.memory_bytes > 0
    if stats.memory_limit_bytes is not None:
        assert stats.memory_bytes < stats.memory_limit_bytes
    # The panel, polled by HTMX, and the rate against the reading it carried.
    client = world.client_for("carol")  # a viewer reads it too
    url = reverse("sandboxes:session_stats", args=[live_session.id])
    panel = client.get(url, headers={"HX-Request": "true"})
    assert panel.status_code == 200
    html = panel.content.decode()
    assert 'data-status="running"' in html
    assert 'hx-trigger="every 5s"' in html
    assert re.search(r'data-stat="cpu">[0-9.]+ %', html), html
    assert re.search(r'data-stat="memory">[0-9.]+\s(?:bytes|KB|MB|GB)', html.replace("\xa0", " ")), html
    next_url = re.search(r'hx-get="([^"]+)"', html)
    assert next_url
    assert "at=" in next_url.group(1)
    # Without JavaScript: the same panel is in the page at load, with a refresh link.
    page = client.get(live_session.get_absolute_url()).content.decode()
    assert 'id="live-stats"' in page
    assert re.search(r'data-stat="cpu">[0-9.]+ %', page)
    assert f'href="{live_session.get_absolute_url()}#live-stats"' in page
    assert world.client_for("charlie").get(url).status_code == 404  # another space's admin


@pytest.mark.docker
def test_a_paused_session_says_paused_and_the_poll_creates_or_resumes_nothing(
    world: World, live_session: Session
) -> None:
    client = world.client_for("bob")
    client.post(reverse("sandboxes:session_action", args=[live_session.id, "pause"]))
    before = sandboxes_of(live_session.config)
    assert (live_session.sandbox_id, SandboxState.PAUSED) in before
    url = reverse("sandboxes:session_stats", args=[live_session.id])
    html = client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert 'data-status="paused"' in html
    assert "The sandbox is paused" in html
    assert "data-stat=" not in html
    page = client.get(live_session.get_absolute_url()).content.decode()
    assert "The sandbox is paused" in page
    assert sandboxes_of(live_session.config) == before
    assert not AuditEvent.objects.filter(action="session.resume").exists()
    # Gone behind the console's back: says so, makes no new one.
    get_backend(live_session.config).delete(live_session.sandbox_id)
    html = client.get(url).content.decode()
    assert 'data-status="none"' in html
    assert sandboxes_of(live_session.config) == [i for i in before if i[0] != live_session.sandbox_id]


def test_a_session_without_a_sandbox_reads_nothing(world: World) -> None:
    from tests.factories import make_config

    config = make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock")
    session = Session.objects.create(space=world.space_a, config=config, key="stats-none")
    html = world.client_for("alice").get(reverse("sandboxes:session_stats", args=[session.id])).content.decode()
    assert 'data-status="none"' in html
    assert "No sandbox is bound" in html


def test_e2b_reports_cpu_and_memory_from_its_metrics_endpoint(fake_e2b: FakeHandle, test_run_id: str) -> None:
    backend = E2BBackend(fake_e2b.backend_config("e2b"))
    info = backend.create(SandboxSpec(template_id="base", network=OFFLINE, metadata={"test-run": test_run_id}))
    try:
        capability = backend.stats()
        assert capability is not None
        stats = capability.read(info.sandbox_id)
        assert stats.memory_bytes == 64 * 1024 * 1024  # the fake's synthetic SandboxMetric
        assert stats.memory_limit_bytes
        assert stats.memory_limit_bytes > stats.memory_bytes
        assert stats.cpu_count
        assert stats.cpu_percent == pytest.approx(1.0 * stats.cpu_count)
        assert stats.net_rx_bytes is None  # not in the protocol
    finally:
        backend.delete(info.sandbox_id)

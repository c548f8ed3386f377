"""The dashboard and the activity page read a fixed number of queries however many spaces,
sessions, jobs, audit events and samples there are, and the getting-started steps read the
newest state (one query for all of them)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from console.models import AdminJob, AuditEvent, JobStatus, Membership, MetricSample, Role, Space
from sandboxes.models import Session, Terminal
from tests.factories import make_config
from tests.personas import World
from tests.support.sqlite_rerun import rerun_on_sqlite

pytestmark = pytest.mark.django_db


@pytest.fixture
def busy(world: World) -> World:
    """40 more spaces administered by charlie, 300 sessions, jobs, audit events, a terminal, and
    a day of one-minute samples."""
    spaces = Space.objects.bulk_create(Space(name=f"S{i:03d}", slug=f"s{i:03d}") for i in range(40))
    Membership.objects.bulk_create(Membership(space=s, user=world.charlie, role=Role.ADMIN) for s in spaces)
    config = make_config(world.space_b)
    sessions = Session.objects.bulk_create(
        Session(space=world.space_b, config=config, key=f"k{i:03d}", sandbox_id=f"sbx-{i}") for i in range(300)
    )
    Terminal.objects.create(session=sessions[7], user=world.charlie, opened=timezone.now())
    AdminJob.objects.bulk_create(
        AdminJob(kind="sandboxes.test_connection", space=s, status=JobStatus.SUCCEEDED) for s in spaces
    )
    AuditEvent.objects.bulk_create(AuditEvent(action="space.create", space=s) for s in spaces)
    now = timezone.now()
    MetricSample.objects.bulk_create(
        MetricSample(time=now - timedelta(minutes=m), interval_s=60.0, values={"sessions:running": 3.0})
        for m in range(24 * 60)
    )
    return world


@pytest.mark.parametrize("who", ["root", "charlie", "bob"])
def test_dashboard_reads_six_queries_at_most(busy: World, django_assert_max_num_queries: Any, who: str) -> None:
    client = busy.client_for(who)
    with django_assert_max_num_queries(6):
        response = client.get(reverse("console:dashboard"))
    assert response.status_code == 200


def test_the_steps_read_together_still_see_the_newest_state(busy: World) -> None:
    page = busy.client_for("charlie").get(reverse("console:dashboard")).content.decode()
    assert "5 of 5 done" not in page  # no skill image yet
    for key in ("config", "test", "session", "terminal"):
        assert f'id="step-{key}" data-done="true"' in page, key
    assert "<strong>41</strong> spaces" in page  # space B and the 40
    assert "<strong>1</strong> member" in page  # charlie, counted once over 41 spaces


def test_activity_page_reads_a_fixed_number_of_queries(busy: World, django_assert_max_num_queries: Any) -> None:
    client = busy.client_for("root")
    for window in ("1h", "24h", "14d"):
        with django_assert_max_num_queries(6):
            response = client.get(reverse("console:activity"), {"window": window})
        assert response.status_code == 200


def test_the_steps_link_their_rows_on_sqlite_too(tmp_path: Path) -> None:
    # SQLite's JSON carries a UUID as 32 hex digits: the links must still reverse (a 500 did).
    rerun_on_sqlite(__file__, "steps_read_together_still_see", tmp_path)

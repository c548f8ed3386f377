"""The audit log and jobs lists at size: keyset pages that show every row exactly once, ties
in the sort included, filters carried through the links, a query count that does not grow
with depth, and an index behind each order and filter."""

from __future__ import annotations

import base64
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from console.models import AdminJob, AuditAction, AuditEvent, JobStatus
from console.views import AUDIT_ORDER, JOB_ORDER
from tests.personas import World
from tests.support.keyset_pages import NEXT, cursor_after, page_plans, walk

pytestmark = pytest.mark.django_db

AUDIT = reverse("console:audit_list")
JOBS = reverse("console:job_list")
EVENT = re.compile(r"thing (e\d{3})")
JOB = re.compile(r'<a href="/jobs/([0-9a-f-]+)/">')
ACTIONS = [AuditAction.SESSION_CREATE.value, AuditAction.MEMBER_ADD.value]


@pytest.fixture
def audited(world: World) -> World:
    """130 audit events over two spaces, five to each instant, two actions."""
    epoch = timezone.now() - timedelta(days=1)
    AuditEvent.objects.bulk_create(
        AuditEvent(
            space=world.space_a if i % 3 else world.space_b,
            action=ACTIONS[i % 2],
            target_type="thing",
            details={"target_name": f"e{i:03d}"},
        )
        for i in range(130)
    )
    for i, event in enumerate(AuditEvent.objects.order_by("id")):
        AuditEvent.objects.filter(pk=event.pk).update(time=epoch + timedelta(seconds=i // 5))
    return world


def expected_events(**filters: Any) -> list[str]:
    rows = sorted(AuditEvent.objects.filter(**filters), key=lambda e: (e.time, e.id), reverse=True)
    return [e.details["target_name"] for e in rows]


def test_audit_next_and_previous_links_show_every_event_once_in_order(audited: World) -> None:
    client = audited.client_for("root")
    pages = walk(client, AUDIT, EVENT)
    assert [len(page) for page in pages] == [50, 50, 30]
    assert [key for page in pages for key in page] == expected_events()
    assert walk(client, AUDIT, EVENT, backwards=True) == pages


def test_audit_filters_carry_through_the_pages(audited: World) -> None:
    client = audited.client_for("root")
    query = f"space={audited.space_a.id}&action={ACTIONS[0]}"
    pages = walk(client, AUDIT, EVENT, query)
    assert len(pages) == 1  # 43 rows
    assert pages[0] == expected_events(space=audited.space_a, action=ACTIONS[0])
    pages = walk(client, AUDIT, EVENT, f"space={audited.space_a.id}")
    assert len(pages) == 2
    assert [key for page in pages for key in page] == expected_events(space=audited.space_a)
    body = client.get(AUDIT, {"space": str(audited.space_a.id)}).content.decode()
    link = NEXT.search(body)
    assert link is not None
    assert f"space={audited.space_a.id}" in link.group(1)


def test_audit_empty_states_and_bad_filters_stay_pages(audited: World) -> None:
    client = audited.client_for("root")
    body = client.get(AUDIT, {"date_from": "2026-05-02", "date_to": "2026-05-01"}).content.decode()
    assert "Fix the filters above." in body
    assert "No audit events match." in body
    body = client.get(AUDIT, {"actor": "nobody-like-this"}).content.decode()
    assert "No audit events match." in body
    assert client.get(AUDIT, {"after": "junk"}).status_code == 200
    # A space the reader does not administer is no filter of theirs: nothing shown.
    body = audited.client_for("alice").get(AUDIT, {"space": str(audited.space_b.id)}).content.decode()
    assert "Fix the filters above." in body
    assert not EVENT.findall(body)


def test_audit_queries_stay_bounded_whatever_the_filter_or_depth(
    audited: World, django_assert_max_num_queries: Any
) -> None:
    space = audited.space_a.id
    deep_root = cursor_after(AuditEvent.objects.all(), AUDIT_ORDER, 100)
    deep_a = cursor_after(AuditEvent.objects.filter(space=audited.space_a), AUDIT_ORDER, 60)
    # Login session, user, rows, capped count, the actions offered, the spaces offered (read
    # once for the choices and the check of a chosen space).
    for who, query, most in [
        ("root", "", 6),
        ("root", deep_root, 6),
        ("root", f"space={space}&{deep_a}", 6),
        ("root", "action=session&actor=x&date_from=2020-01-01", 6),
        ("alice", "", 6),
        ("alice", deep_a, 6),
    ]:
        client = audited.client_for(who)
        client.get(AUDIT)  # the login session warmed
        with django_assert_max_num_queries(most):
            assert client.get(f"{AUDIT}?{query}").status_code == 200, (who, query)


@pytest.fixture
def jobs(world: World) -> World:
    """130 jobs over two spaces and the platform, five created in each instant; every tenth a
    housekeeping pass; a status and kind mixed in."""
    epoch = timezone.now() - timedelta(days=1)
    for i in range(130):
        job = AdminJob.objects.create(
            kind="sandboxes.reap" if i % 10 == 0 else ["sandboxes.test_connection", "sandboxes.verify_backend"][i % 2],
            space=None if i % 10 == 0 else (world.space_a if i % 3 else world.space_b),
            status=[JobStatus.SUCCEEDED, JobStatus.FAILED][i % 3 == 0],
        )
        AdminJob.objects.filter(pk=job.pk).update(created=epoch + timedelta(seconds=i // 5))
    return world


def expected_jobs(rows: Any) -> list[str]:
    return [str(job.id) for job in sorted(rows, key=lambda j: (j.created, j.id), reverse=True)]


def test_jobs_links_show_every_job_once_in_order(jobs: World) -> None:
    client = jobs.client_for("root")
    pages = walk(client, JOBS, JOB, "housekeeping=all")
    assert [len(page) for page in pages] == [25] * 5 + [5]
    assert [key for page in pages for key in page] == expected_jobs(AdminJob.objects.all())
    assert walk(client, JOBS, JOB, "housekeeping=all", backwards=True) == pages


def test_jobs_filters_carry_through_the_pages(jobs: World) -> None:
    client = jobs.client_for("root")
    pages = walk(client, JOBS, JOB)  # housekeeping hidden
    assert [key for page in pages for key in page] == expected_jobs(AdminJob.objects.exclude(kind="sandboxes.reap"))
    pages = walk(client, JOBS, JOB, "status=failed&kind=sandboxes.verify_backend")
    wanted = AdminJob.objects.filter(status=JobStatus.FAILED, kind="sandboxes.verify_backend")
    assert [key for page in pages for key in page] == expected_jobs(wanted)
    pages = walk(client, JOBS, JOB, "housekeeping=only")
    assert [key for page in pages for key in page] == expected_jobs(AdminJob.objects.filter(kind="sandboxes.reap"))
    alice = walk(jobs.client_for("alice"), JOBS, JOB)
    assert [key for page in alice for key in page] == expected_jobs(AdminJob.objects.filter(space=jobs.space_a))


def test_jobs_empty_state_keeps_its_words(jobs: World) -> None:
    body = jobs.client_for("root").get(JOBS, {"status": "cancelled"}).content.decode()
    assert "No jobs match these filters (system jobs are hidden)." in body


def test_jobs_queries_stay_bounded_whatever_the_filter_or_depth(
    jobs: World, django_assert_max_num_queries: Any
) -> None:
    deep = cursor_after(AdminJob.objects.exclude(kind="sandboxes.reap"), JOB_ORDER, 60)
    deep_a = cursor_after(AdminJob.objects.filter(space=jobs.space_a), JOB_ORDER, 30)
    for who, query in [
        ("root", ""),
        ("root", deep),
        ("root", f"status=succeeded&housekeeping=all&{deep}"),
        ("alice", deep_a),
    ]:
        client = jobs.client_for(who)
        client.get(JOBS)
        with django_assert_max_num_queries(6):
            assert client.get(f"{JOBS}?{query}").status_code == 200, (who, query)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("model", "filters", "index"),
    [
        ("audit", {}, "audit_list_order"),
        ("audit", {"space": "A"}, "audit_space_order"),
        ("jobs", {}, "job_list_order"),
        ("jobs", {"space": "A"}, "job_space_order"),
        ("jobs", {"status": JobStatus.FAILED}, "job_status_order"),
        ("jobs", {"kind": "sandboxes.test_connection"}, "job_kind_order"),
    ],
)
def test_each_order_and_filter_reads_an_index_without_sorting(
    audited: World, jobs: World, model: str, filters: dict[str, Any], index: str
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the indexes' plans are PostgreSQL's")
    if filters.get("space") == "A":
        filters = {"space": audited.space_a}
    queryset, keyset = (
        (AuditEvent.objects.filter(**filters), AUDIT_ORDER)
        if model == "audit"
        else (AdminJob.objects.filter(**filters), JOB_ORDER)
    )
    for plan in page_plans(queryset, keyset, 25):
        assert index in plan, plan
        assert "Sort" not in plan, plan


@pytest.mark.parametrize("number", ["1e400", "Infinity", "-Infinity", "NaN", str(10**30)])
def test_audit_cursor_with_a_number_no_id_can_be_shows_the_first_page(audited: World, number: str) -> None:
    raw = f'["{timezone.now().isoformat()}", {number}]'.encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    client = audited.client_for("root")
    for name in ("after", "before"):
        response = client.get(AUDIT, {name: cursor})
        assert response.status_code == 200, (name, number)
        assert EVENT.findall(response.content.decode()) == expected_events()[:50]

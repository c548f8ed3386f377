"""Page benchmark: the pages an admin opens most, at 100,000 sessions over 3 spaces.

Through Django's test client, logged in as a platform admin, each page is requested with warm
caches and timed (median of several requests), and its SQL statements are counted once
(CaptureQueriesContext, the session and user lookups included):

- sessions: the first page, a state filter (running), space + state (paused), a deep page
  (the row 75% down the list: `?page=3000` on a numbered paginator, else the keyset cursor
  the page itself links to, found by walking "Next"), a search by key, a label (one session
  in 40 carries it);
- the dashboard and the activity page (24 hours of one-minute samples);
- the audit log (one event per session: 100,000 at LARGE), the jobs list (one job per five
  sessions, a quarter of them housekeeping passes) and a space's Egress page (one refusal per
  session over the 3 spaces), each at its row 75% down (the keyset cursor its "Next" links
  carry); the audit log also filtered by a space.

The same pages are measured first at SMALL sessions (the baseline: this machine is noisy and
shared), then at LARGE; each page's ratio is LARGE over SMALL. The goal: every page under
100 ms with at most 6 queries at LARGE.

Usage: python bench/pages.py [SMALL LARGE]   (default 1000 100000; DATABASE_URL defaults to the
local PostgreSQL; a database of its own is created and dropped, even on failure)
The last line is one JSON object: per page `<page>_ms`, `<page>_queries`, `<page>_ratio`, the
baseline's `<page>_small_ms`, and `worst_ms`, `worst_queries`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings.test")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")

import django

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_test_environment, teardown_test_environment  # noqa: E402

SPACES = 3
PAGE_SIZE = 25
REPEAT = 15
EPOCH = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
# i % 20: 2 running, 6 paused, 10 stopped, 2 new (never active).
STATES = ["running"] * 2 + ["paused"] * 6 + ["stopped"] * 10 + ["new"] * 2


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def main() -> None:
    small, large = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (1000, 100_000)
    settings_dict = connection.settings_dict
    # A name of its own, so a test run on the same server never meets it.
    settings_dict.setdefault("TEST", {})["NAME"] = f"{settings_dict['NAME']}_bench_pages_{os.getpid()}"
    setup_test_environment(debug=False)  # as deployed: no query log but the one measured
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        figures = run(small, large)
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        teardown_test_environment()
    print(json.dumps(figures))


def run(small: int, large: int) -> dict[str, Any]:
    from django.test import Client

    world = build_world()
    client = Client()
    client.force_login(world["admin"])
    add_sessions(world, 0, small)
    before = measure(client, world, small)
    add_sessions(world, small, large)
    after = measure(client, world, large)
    figures: dict[str, Any] = {"small": small, "large": large, "spaces": SPACES}
    for name, (ms, queries) in after.items():
        small_ms, small_queries = before[name]
        figures[f"{name}_ms"] = ms
        figures[f"{name}_queries"] = queries
        figures[f"{name}_small_ms"] = small_ms
        figures[f"{name}_ratio"] = round(ms / small_ms, 2) if small_ms else None
        print(
            f"{name:>14}: {small_ms:7.2f} ms ({small_queries} q) at {small}  ->  {ms:7.2f} ms ({queries} q) at {large}"
        )
    figures["worst_ms"] = max(ms for ms, _ in after.values())
    figures["worst_queries"] = max(q for _, q in after.values())
    return figures


def build_world() -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from console.crypto import encrypt
    from console.models import AdminJob, JobStatus, MetricSample, NetworkPolicy, Space
    from sandboxes.models import PlatformBackend, SandboxConfig

    admin = get_user_model().objects.create_superuser(username="bench-admin", password=None, email="")
    backend = PlatformBackend.objects.create(name="bench backend", kind="docker", api_key_encrypted=encrypt(""))
    spaces, configs = [], []
    for index in range(SPACES):
        space = Space.objects.create(name=f"Bench space {index}", slug=f"bench-space-{index}")
        NetworkPolicy.objects.create(space=space)
        backend.spaces.add(space)
        configs.append(
            SandboxConfig.objects.create(
                space=space,
                backend=backend,
                name=f"bench config {index}",
                default_template="sandbox-console/base:latest",
                is_default=True,
                cpus=1,
                memory_mb=256,
                pids_limit=128,
            )
        )
        spaces.append(space)
    statuses = [JobStatus.SUCCEEDED] * 8 + [JobStatus.FAILED, JobStatus.RUNNING]
    AdminJob.objects.bulk_create(
        AdminJob(kind="sandboxes.test_connection", space=spaces[i % SPACES], status=statuses[i % len(statuses)])
        for i in range(500)
    )
    # The activity charts' default window: 24 hours of one-minute samples.
    now = datetime.now(tz=EPOCH.tzinfo)
    MetricSample.objects.bulk_create(
        MetricSample(
            time=now - timedelta(minutes=minute),
            interval_s=60.0,
            values={
                "sessions:running": 40.0,
                "sessions:paused": 300.0,
                "resolves:created": 2.0,
                "resolves:reused": 30.0,
                "resolve_seconds": 3.5,
                "backend_errors:timeout": float(minute % 3 == 0),
            },
            totals={"resolves:reused": float(minute)},
        )
        for minute in range(24 * 60)
    )
    return {"admin": admin, "spaces": spaces, "configs": configs}


def add_sessions(world: dict[str, Any], start: int, stop: int) -> None:
    """Sessions start..stop-1, round robin over the spaces; three share each creation instant
    (ties in the sort), a tenth never active; for each session an audit event and a refused
    attempt, for every fifth a job."""
    from console.models import AdminJob, AuditAction, AuditEvent, JobStatus
    from sandboxes.models import EgressEvent, Session

    batch = 5000
    for first in range(start, stop, batch):
        rows: list[Session] = []
        events: list[AuditEvent] = []
        jobs: list[AdminJob] = []
        refusals: list[EgressEvent] = []
        for i in range(first, min(first + batch, stop)):
            state = STATES[i % len(STATES)]
            rows.append(
                Session(
                    space=world["spaces"][i % SPACES],
                    config=world["configs"][i % SPACES],
                    key=f"agent-{i:06d}",
                    state=state,
                    labels=" nightly " if i % 40 == 0 else "",
                    sandbox_id="" if state == "new" else f"sbx-{i:06d}",
                    # Spread over 60 days, not in creation order.
                    last_activity=None if state == "new" else EPOCH + timedelta(seconds=(i * 7919) % (60 * 86400)),
                )
            )
            events.append(
                AuditEvent(
                    action=AuditAction.values[i % 7],
                    space=world["spaces"][i % SPACES],
                    actor_name="bench-admin",
                    target_type="session",
                    target_id=f"agent-{i:06d}",
                )
            )
            if i % 5 == 0:
                jobs.append(
                    AdminJob(
                        kind="sandboxes.reap" if i % 20 == 0 else "sandboxes.test_connection",
                        space=None if i % 20 == 0 else world["spaces"][i % SPACES],
                        status=JobStatus.SUCCEEDED,
                    )
                )
            refusals.append(
                EgressEvent(
                    time=EPOCH + timedelta(seconds=(i * 7919) % (60 * 86400)),
                    space=world["spaces"][i % SPACES],
                    session=rows[-1] if i % 2 else None,
                    sandbox_id=rows[-1].sandbox_id or f"sbx-{i:06d}",
                    layer=["dns", "packet"][i % 2],
                    destination=f"host-{i % 997}.bench.test",
                    rule="not in the allow list",
                )
            )
        Session.objects.bulk_create(rows)
        AuditEvent.objects.bulk_create(events)
        AdminJob.objects.bulk_create(jobs)
        EgressEvent.objects.bulk_create(refusals)
    with connection.cursor() as cursor:
        # `created` is auto_now_add: set it after the insert, three sessions per instant.
        cursor.execute(
            "UPDATE sandboxes_session SET created = %s + (substring(key from '[0-9]+$')::int / 3) * interval '1 s' "
            "WHERE substring(key from '[0-9]+$')::int >= %s",
            [EPOCH, start],
        )
        cursor.execute("UPDATE console_auditevent SET time = now() - (id % 720) * interval '1 hour'")
        # Jobs over the last 30 days, ten to an instant.
        cursor.execute(
            "UPDATE console_adminjob SET created = now() - (row / 10) * interval '1 minute' FROM "
            "(SELECT id AS job, row_number() OVER (ORDER BY id) AS row FROM console_adminjob) numbered "
            "WHERE id = numbered.job"
        )
        # As autovacuum would have by then: statistics and the visibility map.
        for table in ("sandboxes_session", "console_auditevent", "console_adminjob", "sandboxes_egressevent"):
            cursor.execute(f"VACUUM ANALYZE {table}")


def deep_url(client: Any, base: str, rows: int) -> str:
    """The URL of the page holding the row 75% down: a page number on a numbered list, else
    the keyset cursor of the row before it, as the page's own "Next" link would carry it."""
    target = int(rows * 0.75) // PAGE_SIZE + 1
    body = client.get(base).content.decode()
    if "page=2" in body:
        return f"{base}?page={target}"
    from sandboxes.models import Session
    from sandboxes.sessions.listing import SESSION_ORDER

    keyed = SESSION_ORDER.annotate(Session.objects.all()).order_by(*SESSION_ORDER.order())
    return f"{base}?after={SESSION_ORDER.encode(keyed[(target - 1) * PAGE_SIZE - 1])}"


def deep_cursor(queryset: Any, keyset: Any, per_page: int) -> str:
    """The keyset cursor of the page holding the row 75% down `queryset`, as the page before
    it links to it."""
    target = int(queryset.count() * 0.75) // per_page + 1
    keyed = keyset.annotate(queryset).order_by(*keyset.order())
    return f"after={keyset.encode(keyed[(target - 1) * per_page - 1])}"


def measure(client: Any, world: dict[str, Any], rows: int) -> dict[str, tuple[float, int]]:
    from django.urls import reverse

    from console import jobs as job_runner
    from console.models import AdminJob, AuditEvent
    from console.views import AUDIT_ORDER, JOB_ORDER
    from sandboxes.models import EgressEvent
    from sandboxes.network.log import EGRESS_ORDER
    from sandboxes.network.pages import PAGE_SIZE as EGRESS_PAGE

    sessions = reverse("sandboxes:session_list")
    space = world["spaces"][1].id
    audit, jobs = reverse("console:audit_list"), reverse("console:job_list")
    egress = reverse("sandboxes:egress_list", args=[space])
    housekeeping = job_runner.housekeeping_kinds()
    audit_space = deep_cursor(AuditEvent.objects.filter(space=space), AUDIT_ORDER, 50)
    pages: dict[str, str] = {
        "first_page": sessions,
        "state_filter": f"{sessions}?state=running",
        "space_state": f"{sessions}?space={space}&state=paused",
        "deep_page": deep_url(client, sessions, rows),
        "search": f"{sessions}?q=00421",
        "label": f"{sessions}?label=nightly",
        "dashboard": reverse("console:dashboard"),
        "activity": reverse("console:activity"),
        "audit_deep": f"{audit}?{deep_cursor(AuditEvent.objects.all(), AUDIT_ORDER, 50)}",
        "audit_space_deep": f"{audit}?space={space}&{audit_space}",
        "jobs_deep": f"{jobs}?{deep_cursor(AdminJob.objects.exclude(kind__in=housekeeping), JOB_ORDER, PAGE_SIZE)}",
        "egress_deep": f"{egress}?{deep_cursor(EgressEvent.objects.filter(space=space), EGRESS_ORDER, EGRESS_PAGE)}",
    }
    results: dict[str, tuple[float, int]] = {}
    for name, url in pages.items():
        results[name] = time_page(functools.partial(client.get, url), name)
    return results


def time_page(get: Callable[[], Any], name: str) -> tuple[float, int]:
    for _ in range(2):
        response = get()
        assert response.status_code == 200, (name, response.status_code)
    with CaptureQueriesContext(connection) as captured:
        response = get()
    queries = len(captured.captured_queries)  # now: the next request clears the log
    if name == "search":
        assert re.search(r"agent-\d*00421", response.content.decode()), "the search found nothing"
    if name == "label":
        assert response.content.decode().count('class="label"') >= PAGE_SIZE, "the label filter found too few"
    samples = []
    for _ in range(REPEAT):
        started = time.perf_counter()
        get()
        samples.append(time.perf_counter() - started)
    return median_ms(samples), queries


if __name__ == "__main__":
    main()

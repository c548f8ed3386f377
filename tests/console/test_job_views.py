"""The Jobs list and the dashboard: system jobs hidden by default, a kind filter, results
rendered for people."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from console.jobs import job_kinds
from console.models import AdminJob, JobStatus
from console.templatetags.console_tags import counts_summary, render_value
from tests.personas import World

pytestmark = pytest.mark.django_db


def _job_labels(html: str) -> list[str]:
    return re.findall(r'<a href="/jobs/[0-9a-f-]+/">([^<]+)</a>', html)


@pytest.fixture
def jobs(world: World) -> dict[str, AdminJob]:
    made = {
        "reap": AdminJob.objects.create(kind="sandboxes.reap", status=JobStatus.SUCCEEDED),
        "sweep": AdminJob.objects.create(kind="sandboxes.idle_sweep", status=JobStatus.SUCCEEDED),
        "test": AdminJob.objects.create(
            kind="sandboxes.test_connection", space=world.space_a, status=JobStatus.SUCCEEDED
        ),
        "verify": AdminJob.objects.create(
            kind="sandboxes.verify_backend",
            space=world.space_a,
            status=JobStatus.SUCCEEDED,
            result={"summary": {"pass": 8, "fail": 0, "unsupported": 0}, "ok": True, "cleanup_errors": []},
        ),
    }
    return made


def test_system_jobs_are_hidden_by_default_and_shown_on_request(world: World, jobs: dict[str, AdminJob]) -> None:
    client = world.client_for("root")
    default = _job_labels(client.get(reverse("console:job_list")).content.decode())
    assert sorted(default) == ["Test connection", "Verify backend"]
    shown = _job_labels(client.get(reverse("console:job_list"), {"housekeeping": "all"}).content.decode())
    assert sorted(shown) == ["Idle sweep", "Reaper pass", "Test connection", "Verify backend"]

    dashboard = client.get(reverse("console:dashboard")).content.decode()
    recent = dashboard.split('id="recent-jobs"', 1)[1]
    assert "Reaper pass" not in recent
    assert "Show system jobs" in recent
    with_system = client.get(reverse("console:dashboard"), {"jobs": "all"}).content.decode()
    recent = with_system.split('id="recent-jobs"', 1)[1]
    assert "Reaper pass" in recent
    assert "Idle sweep" in recent
    assert "Hide system jobs" in recent


def test_kind_filter(world: World, jobs: dict[str, AdminJob]) -> None:
    client = world.client_for("root")
    page = client.get(reverse("console:job_list"), {"kind": "sandboxes.verify_backend"}).content.decode()
    assert _job_labels(page) == ["Verify backend"]
    assert '<option value="sandboxes.verify_backend" selected>' in page
    # Choosing a system kind shows it, although system jobs are hidden by default.
    page = client.get(reverse("console:job_list"), {"kind": "sandboxes.reap"}).content.decode()
    assert _job_labels(page) == ["Reaper pass"]
    # An unknown kind is no filter (and no error).
    unknown = client.get(reverse("console:job_list"), {"kind": "nope"})
    assert unknown.status_code == 200
    assert sorted(_job_labels(unknown.content.decode())) == ["Test connection", "Verify backend"]
    # The HTMX swap answers the results partial only.
    partial = client.get(
        reverse("console:job_list"),
        {"kind": "sandboxes.test_connection"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="job-results",
    ).content.decode()
    assert "<html" not in partial
    assert _job_labels(partial) == ["Test connection"]
    assert ("sandboxes.reap", "Reaper pass") in job_kinds()


def test_verify_result_reads_as_a_summary(world: World, jobs: dict[str, AdminJob]) -> None:
    client = world.client_for("alice")
    page = client.get(jobs["verify"].get_absolute_url()).content.decode()
    assert "8 passed · 0 failed · 0 unsupported" in page
    assert "{&#x27;pass&#x27;" not in page
    assert "{'pass'" not in page
    assert "<dt>Cleanup errors</dt>" in page
    assert "<dt>Summary</dt>" in page


def test_the_list_shows_results_in_words(world: World, jobs: dict[str, AdminJob]) -> None:
    AdminJob.objects.filter(pk=jobs["test"].pk).update(result={"steps": [{"name": "health", "ok": True}] * 4})
    page = world.client_for("alice").get(reverse("console:job_list")).content.decode()
    cells = re.findall(r'<td class="job-result">([^<]*)</td>', page)
    assert sorted(cells) == ["4 of 4 steps ok", "8 passed · 0 failed · 0 unsupported"]


def test_counts_and_mappings_render_for_people() -> None:
    assert counts_summary({"fail": 1, "pass": 2}) == "2 passed · 1 failed"
    assert counts_summary({"deleted": 3, "claimed": 1}) == "1 claimed · 3 deleted"
    assert str(render_value({"pass": 1})) == "1 passed"
    assert str(render_value({"image_tag": "x<y", "ok": True})) == "Image tag: x&lt;y · OK: ✓"
    assert str(render_value({})) == "—"

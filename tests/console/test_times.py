"""Times on the pages: one filter (`when`) renders `<time datetime>` in readable UTC with its
zone (static/js/console.js makes it relative, in the reader's zone); no raw ISO strings."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

from django.template import Context, Template

from console.templatetags.console_tags import render_value, when
from sandboxes.models import Session
from tests.factories import make_config
from tests.personas import World

RAW_ISO = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(\+00:00|Z)?(?![^<]*\")")


def test_a_datetime_reads_utc_with_its_zone_and_carries_its_moment() -> None:
    moment = datetime(2026, 12, 1, 20, 52, 34, 160953, tzinfo=UTC)
    assert when(moment) == (
        '<time class="when" datetime="2026-12-01T20:52:34Z" title="2026-12-01 20:52:34 UTC">2026-12-01 20:52 UTC</time>'
    )
    assert ">2026-12-01 20:52:34 UTC<" in when(moment, "seconds")
    assert ">2026-12-01<" in when(moment, "date")


def test_another_zone_and_an_iso_string_are_the_same_moment() -> None:
    moment = datetime(2026, 12, 1, 21, 52, 34, tzinfo=timezone(timedelta(hours=1)))
    assert when(moment) == when("2026-12-01T20:52:34.160953+00:00") == when("2026-12-01T20:52:34Z")


def test_a_unix_time_is_a_moment_too() -> None:
    moment = datetime(2026, 12, 1, 20, 52, 34, tzinfo=UTC)
    assert when(moment.timestamp()) == when(moment)
    assert when(0) == "0"
    assert when(True) == "True"


def test_nothing_is_empty_and_anything_else_comes_back() -> None:
    assert when(None) == ""
    assert when("") == ""
    assert when("not a time") == "not a time"
    assert when("2026-13-45T99:00:00") == "2026-13-45T99:00:00"
    assert Template('{{ value|when|default:"never" }}').render(Context({"value": None})) == "never"
    assert Template("{{ value|when }}").render(Context({"value": "<b>x</b>"})) == "&lt;b&gt;x&lt;/b&gt;"


def test_job_results_show_iso_strings_as_times() -> None:
    html = render_value({"started": "2026-12-01T20:52:34.160953+00:00", "name": "x"})
    assert "160953" not in html
    assert '<time class="when" datetime="2026-12-01T20:52:34Z"' in html


def test_the_session_page_shows_no_raw_iso_string(world: World) -> None:
    """The binding's "Bound at" (an ISO string from the session store) reads as a time."""
    from sandboxes.sessions import store_select as binding
    from sandboxes.sessions.store import Binding, binding_key

    config = make_config(world.space_a)
    session = Session.objects.create(space=world.space_a, config=config, key="timed", last_activity=datetime.now(UTC))
    binding.get_store().set_binding_if_absent(
        binding_key(session.space_id, session.key),
        Binding("no-such-sandbox", 1, str(config.id), "2026-12-01T20:52:34.160953+00:00"),
    )
    page = world.client_for("bob").get(session.get_absolute_url()).content.decode()
    text = re.sub(r"<[^>]+>", " ", page)
    assert not RAW_ISO.search(text), RAW_ISO.search(text)
    assert "2026-12-01 20:52:34 UTC" in page


def test_a_jobs_log_shows_its_times_not_raw_iso_strings(world: World) -> None:
    from django.urls import reverse

    from console.models import AdminJob, JobStatus

    job = AdminJob.objects.create(
        kind="sandboxes.test_connection",
        space=world.space_a,
        status=JobStatus.SUCCEEDED,
        log=[{"time": "2026-12-02T18:18:50+00:00", "message": "walk-one: done: paused"}, {"time": "", "message": "…"}],
    )
    page = world.client_for("alice").get(reverse("console:job_detail", args=[job.pk])).content.decode()
    text = re.sub(r"<[^>]+>", " ", page)
    assert not RAW_ISO.search(text), RAW_ISO.search(text)
    assert '<time class="when" datetime="2026-12-02T18:18:50Z"' in page
    assert "walk-one: done: paused" in page

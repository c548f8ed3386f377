"""Unmanaged resources: what the engine holds under this installation's labels that no space,
config or session owns is deleted by the reaper after the grace, listed on the platform's
page and deleted from it (real Docker); another installation's is never touched."""

from __future__ import annotations

import contextlib
import uuid
from datetime import timedelta
from typing import Any

import docker.errors
import pytest
from django.urls import reverse

from console.jobs import run_job, start_job
from console.models import AuditEvent, JobStatus
from console.services import SYSTEM
from sandboxes.backends.base import META_INSTALLATION
from sandboxes.models import SandboxConfig
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.unmanaged import find_unmanaged, reap_unmanaged
from tests.factories import make_config
from tests.personas import World
from tests.support.tuning import Tuned

pytestmark = pytest.mark.docker


def orphan_of(world: World, config: SandboxConfig, settings: Any, installation: str, key: str) -> tuple[str, str]:
    """A session's sandbox and workspace volume under `installation`, then its space's rows
    deleted behind the teardown's back (as the old delete did): (container id, volume)."""
    settings.CONSOLE_INSTALLATION_ID = installation
    session = Runtime().resolve(config.space, key).session
    assert session.has_persistent_workspace
    config.space.delete()
    return session.sandbox_id, session.workspace_volume


def labelled(engine: Any, installation: str) -> tuple[list[str], list[str]]:
    label = f"console.meta.{META_INSTALLATION}={installation}"
    containers = [row["Id"] for row in engine.containers(all=True, filters={"label": label})]
    volumes = [row["Name"] for row in engine.volumes(filters={"label": label}).get("Volumes") or []]
    return containers, volumes


def remove(engine: Any, containers: list[str], volumes: list[str]) -> None:
    for container in containers:
        with contextlib.suppress(docker.errors.NotFound):
            engine.remove_container(container, force=True)
    for volume in volumes:
        with contextlib.suppress(docker.errors.NotFound):
            engine.remove_volume(volume, force=True)


@pytest.mark.django_db(transaction=True)
def test_the_reaper_deletes_an_orphan_after_the_grace_and_not_another_installations(
    tuned: Tuned, world: World, session_config: SandboxConfig, engine: Any, settings: Any
) -> None:
    tuned({"sessions.reaper_unmanaged": True})
    mine = settings.CONSOLE_INSTALLATION_ID
    other = f"{mine}-other-{uuid.uuid4().hex[:6]}"
    theirs = make_config(
        world.space_b, backend=session_config.backend, default_template=session_config.default_template
    )
    try:
        their_container, their_volume = orphan_of(world, theirs, settings, other, "theirs")
        my_container, my_volume = orphan_of(world, session_config, settings, mine, "mine")
        assert labelled(engine, mine) == ([my_container], [my_volume])

        young = reap_unmanaged(grace=timedelta(hours=1))
        assert young.deleted == []
        assert young.young == 2  # its container and its volume, too young yet
        assert labelled(engine, mine) == ([my_container], [my_volume])

        tuned({"sessions.reaper_grace_s": 0})
        job = start_job("sandboxes.reap", actor=SYSTEM)
        run_job(str(job.id))
        job.refresh_from_db()
        assert job.status == JobStatus.SUCCEEDED, job.error
        assert sorted(job.result["unmanaged_deleted"]) == [f"sandbox {my_container}", f"volume {my_volume}"]
        assert labelled(engine, mine) == ([], [])
        # Another installation's orphan, with a space this database never had, stays.
        assert labelled(engine, other) == ([their_container], [their_volume])
    finally:
        remove(engine, *labelled(engine, other))
        remove(engine, *labelled(engine, mine))


@pytest.mark.django_db(transaction=True)
def test_the_unmanaged_page_lists_and_deletes_for_platform_admins_only(
    world: World, session_config: SandboxConfig, engine: Any, settings: Any
) -> None:
    mine = settings.CONSOLE_INSTALLATION_ID
    make_config(world.space_b, backend=session_config.backend, default_template=session_config.default_template)
    try:
        live = Runtime().resolve(world.space_b, "alive").session
        container, volume = orphan_of(world, session_config, settings, mine, "gone")
        listing = find_unmanaged()
        assert listing.errors == []
        found = {(item.kind, item.ident): item.reason for item in listing.items}
        assert found == {("sandbox", container): "its space is gone", ("volume", volume): "its space is gone"}

        url = reverse("sandboxes:unmanaged_list")
        delete_url = reverse("sandboxes:unmanaged_delete")
        form = {"backend": str(session_config.backend_id), "kind": "sandbox", "ident": container}
        for name in ("alice", "charlie"):  # space admins: the platform page does not exist for them
            client = world.client_for(name)
            assert client.get(url).status_code == 404
            assert client.get(delete_url, form).status_code == 404
            assert client.post(delete_url, form).status_code == 404
        assert container in labelled(engine, mine)[0]

        root = world.client_for("root")
        page = root.get(url).content.decode()
        assert container[:20] in page
        assert volume in page
        confirm = root.get(delete_url, form).content.decode()
        assert f"unmanaged sandbox {container}" in confirm
        # A live session's sandbox named in a forged form is judged again, and refused.
        forged = {**form, "ident": live.sandbox_id}
        root.post(delete_url, forged)
        assert live.sandbox_id in labelled(engine, mine)[0]
        assert root.post(delete_url, form).status_code == 302
        root.post(delete_url, {**form, "kind": "volume", "ident": volume})
        assert labelled(engine, mine) == ([live.sandbox_id], [live.workspace_volume])
        events = AuditEvent.objects.filter(action="unmanaged.delete")
        assert sorted(events.values_list("target_id", flat=True)) == sorted([container, volume])
        assert {event.actor for event in events} == {world.root}
    finally:
        remove(engine, *labelled(engine, mine))


@pytest.mark.django_db(transaction=True)
def test_a_backend_that_does_not_answer_is_named_within_the_deadline(
    tuned: Tuned, world: World, session_config: SandboxConfig, settings: Any, tmp_path: Any
) -> None:
    import socket
    import time

    from tests.factories import make_backend

    tuned({"sessions.unmanaged_list_timeout_s": 1})
    path = tmp_path / "silent.sock"
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(path))
    silent.listen(8)  # accepts connections and never answers
    make_backend(world.space_a, name="silent engine", endpoint=f"unix://{path}")
    try:
        started = time.monotonic()
        listing = find_unmanaged()
        elapsed = time.monotonic() - started
        assert elapsed < 5
        assert listing.errors == ["silent engine: did not answer within 1 s"]
        assert listing.backends == 2  # the live engine was listed all the same
        page = world.client_for("root").get(reverse("sandboxes:unmanaged_list")).content.decode()
        assert "silent engine: did not answer within 1 s" in page
    finally:
        silent.close()


@pytest.mark.django_db
def test_a_forged_delete_form_is_refused_in_words_never_a_500(world: World) -> None:
    """The confirm form's hidden fields come back from the browser: a backend id that is no
    id, a kind it does not know, an ident of 10 kB — each a message on the list, nothing deleted."""
    root = world.client_for("root")
    delete_url = reverse("sandboxes:unmanaged_delete")
    before = AuditEvent.objects.filter(action="unmanaged.delete").count()
    for form in (
        {"backend": "not-a-uuid", "kind": "sandbox", "ident": "abc"},
        {"backend": "1' OR '1'='1", "kind": "volume", "ident": "abc"},
        {"backend": str(uuid.uuid4()), "kind": "sandbox", "ident": "abc"},
        {"backend": str(uuid.uuid4()), "kind": "network", "ident": "abc"},
        {"backend": str(uuid.uuid4()), "kind": "sandbox", "ident": "x" * 10_000},
    ):
        for method in (root.get, root.post):
            response = method(delete_url, form)
            assert response.status_code in (200, 302), (form["backend"], response.status_code)
    assert AuditEvent.objects.filter(action="unmanaged.delete").count() == before

"""Deleting a space, a config or a session tears down through the backends first (real
Docker): sandboxes, workspace volumes, snapshot images (skill images included) and the
space's network go, the job's log says what went, and the rows go only after."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import docker.errors
import pytest
from django.urls import reverse

from console.models import AdminJob, AuditEvent, JobStatus, Space
from sandboxes.backends.base import META_INSTALLATION, META_SPACE
from sandboxes.catalog.bridge import console_metadata, get_backend
from sandboxes.models import SandboxConfig, Session, SessionImage
from sandboxes.sessions import teardown
from sandboxes.sessions.runtime import Runtime
from skills.models import SkillImage, SkillImageStatus
from tests.factories import set_policy
from tests.personas import World
from tests.support.jobs import run_to_end
from tests.support.skill_install import clean_up, import_skill, job_error, plain_skill, run_install

pytestmark = pytest.mark.docker


def held_by_space(engine: Any, space: Space, installation: str, network: str) -> dict[str, list[str]]:
    """What the engine holds of one space, read behind the console's back."""
    meta = [f"console.meta.{META_INSTALLATION}={installation}", f"console.meta.{META_SPACE}={space.pk}"]
    image_labels = [f"{META_INSTALLATION}={installation}", f"{META_SPACE}={space.pk}"]
    return {
        "containers": [row["Id"] for row in engine.containers(all=True, filters={"label": meta})],
        "volumes": [row["Name"] for row in engine.volumes(filters={"label": meta}).get("Volumes") or []],
        "images": [row["Id"] for row in engine.images(filters={"label": image_labels})],
        "networks": [row["Name"] for row in engine.networks(names=[network]) if row["Name"] == network],
    }


def host_state(network: str) -> tuple[int, int]:
    """Lines of the host ruleset naming the space's bridge, and processes naming its network."""
    import subprocess

    from sandboxes.backends.docker.egress.firewall import bridge_name

    ruleset = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=False).stdout
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=False).stdout
    bridge = bridge_name(network)
    return (
        sum(bridge in line for line in ruleset.splitlines()),
        sum(network in line or bridge in line for line in processes.splitlines() if "ps -eo" not in line),
    )


def counts(held: dict[str, list[str]]) -> dict[str, int]:
    return {key: len(value) for key, value in held.items()}


def wait_for(job_id: Any, timeout: float = 240, sample: Any = None) -> AdminJob:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = AdminJob.objects.get(pk=job_id)
        if job.is_finished:
            return job
        if sample is not None:
            sample()
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} still {AdminJob.objects.get(pk=job_id).status} after {timeout} s")


@pytest.mark.django_db(transaction=True)
def test_deleting_a_space_deletes_its_sandboxes_volumes_images_and_network(
    world: World, session_config: SandboxConfig, engine: Any, settings: Any
) -> None:
    installation = settings.CONSOLE_INSTALLATION_ID
    space = world.space_a
    network = get_backend(session_config).networks.space_network_name(str(space.pk))  # type: ignore[attr-defined]
    set_policy(space, allow_out=["files.test"])  # online: the space gets its own network
    try:
        first = run_install(space, session_config, import_skill(plain_skill("teardown-one")))
        assert first.status == JobStatus.SUCCEEDED, job_error(first)
        runtime = Runtime()
        sessions = [runtime.resolve(space, f"old-{n}").session for n in range(2)]
        second = run_install(space, session_config, import_skill(plain_skill("teardown-two")))
        assert second.status == JobStatus.SUCCEEDED, job_error(second)
        sessions.append(runtime.resolve(space, "new-0").session)
        before = held_by_space(engine, space, installation, network)
        print("teardown inventory before:", counts(before), "host state (nft lines, processes):", host_state(network))
        assert len(before["containers"]) == 3
        assert len(before["volumes"]) == 3
        assert len(before["images"]) >= 2
        assert before["networks"]

        alice = world.client_for("alice")
        page = alice.get(reverse("console:space_delete", args=[space.pk])).content.decode()
        assert "3 session(s)" in page
        assert "2 skill image" not in page
        assert "The networks its backends keep for it" in page
        answer = alice.post(reverse("console:space_delete", args=[space.pk]), {"confirm_slug": space.slug})
        job = AdminJob.objects.filter(kind=teardown.KIND_SPACE).get()
        assert answer.status_code == 302
        assert answer["Location"] == job.get_absolute_url()
        during: list[dict[str, int]] = []
        job = wait_for(
            job.pk, sample=lambda: during.append(counts(held_by_space(engine, space, installation, network)))
        )
        assert job.status == JobStatus.SUCCEEDED, job_error(job)
        after = held_by_space(engine, space, installation, network)
        print(
            f"teardown job took {job.duration_s or 0:.1f} s; inventory during:",
            [d for n, d in enumerate(during) if n == 0 or d != during[n - 1]],
            "after:",
            counts(after),
        )
        assert after == {"containers": [], "volumes": [], "images": [], "networks": []}
        print("host state left (nft lines, resolver processes; the egress component's to assert):", host_state(network))
        log = "\n".join(line["message"] for line in job.log)
        for session in sessions:
            assert f"Deleted session {session.key}" in log
        for image in before["images"]:
            assert f"snap-{image.removeprefix('sha256:')[:12]}" in log
        assert "No network of space Space A is left on Docker." in log  # it went with the last sandbox
        assert not Space.objects.filter(pk=space.pk).exists()
        assert AuditEvent.objects.get(action="space.delete").details["torn_down"]["session"] == 3
        # The job outlived its space, and its starter still follows it.
        assert alice.get(job.get_absolute_url()).status_code == 200
        assert world.client_for("charlie").get(job.get_absolute_url()).status_code == 404
    finally:
        if SandboxConfig.objects.filter(pk=session_config.pk).exists():
            clean_up(session_config, installation)


@pytest.mark.django_db(transaction=True)
def test_a_teardown_that_cannot_delete_keeps_the_rows_and_says_what_stayed(
    world: World, session_config: SandboxConfig, engine: Any, settings: Any
) -> None:
    space = world.space_a
    session = Runtime().resolve(space, "kept").session
    backend = get_backend(session_config)
    # A sandbox of the space running from one of its snapshots, behind the console's back:
    # the engine refuses to delete that image while the container lives.
    capability = backend.snapshots()
    assert capability is not None
    snapshot = capability.create(session.sandbox_id, labels=console_metadata(session_config))
    container = engine.create_container(
        snapshot.snapshot_id.removeprefix("snap-"), command=["sleep", "300"], labels={"test-run": "teardown"}
    )["Id"]
    try:
        job = teardown.start_teardown(teardown.KIND_SPACE, space, str(space.pk), actor=teardown.SYSTEM)
        run_to_end(str(job.id))
        job.refresh_from_db()
        assert job.status == JobStatus.FAILED
        assert f"could not delete snapshot {snapshot.snapshot_id}" in job.error
        assert Space.objects.filter(pk=space.pk).exists()  # the rows stay
        assert not Session.objects.filter(pk=session.pk).exists()  # what went, went
        page = world.client_for("alice").get(reverse("console:space_delete", args=[space.pk])).content.decode()
        assert "The last attempt stopped" in page
        assert snapshot.snapshot_id in page
        assert "Delete again" in page
        engine.remove_container(container, force=True)
        retry = teardown.start_teardown(teardown.KIND_SPACE, space, str(space.pk), actor=teardown.SYSTEM)
        run_to_end(str(retry.id))
        retry.refresh_from_db()
        assert retry.status == JobStatus.SUCCEEDED, job_error(retry)
        assert not Space.objects.filter(pk=space.pk).exists()
        assert snapshot.snapshot_id not in {s.snapshot_id for s in capability.list()}
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            engine.remove_container(container, force=True)
        if SandboxConfig.objects.filter(pk=session_config.pk).exists():
            clean_up(session_config, settings.CONSOLE_INSTALLATION_ID)


@pytest.mark.django_db(transaction=True)
def test_deleting_a_session_deletes_the_old_skill_image_it_ran_from(
    world: World, session_config: SandboxConfig, settings: Any
) -> None:
    space = world.space_a
    try:
        first = run_install(space, session_config, import_skill(plain_skill("session-one")))
        assert first.status == JobStatus.SUCCEEDED, job_error(first)
        old = SessionImage.objects.get(config=session_config).snapshot_id
        session = Runtime().resolve(space, "on-old").session
        assert session.template_id == old
        second = run_install(space, session_config, import_skill(plain_skill("session-two")))
        assert second.status == JobStatus.SUCCEEDED, job_error(second)
        current = SessionImage.objects.get(config=session_config).snapshot_id
        assert current != old
        snapshots = get_backend(session_config).snapshots()
        assert snapshots is not None

        job = teardown.start_teardown(teardown.KIND_SESSION, space, str(session.pk), actor=teardown.SYSTEM)
        run_to_end(str(job.id))
        job.refresh_from_db()
        assert job.status == JobStatus.SUCCEEDED, job_error(job)
        ids = {s.snapshot_id for s in snapshots.list()}
        assert old not in ids  # it leaked before: no session and no pointer kept it
        assert current in ids  # the current skill image stays for new sessions
        assert f"Deleted snapshot {old}" in "\n".join(line["message"] for line in job.log)
        generation = SkillImage.objects.get(space=space, config=session_config, snapshot_id=old)
        assert generation.status == SkillImageStatus.RETIRED
    finally:
        clean_up(session_config, settings.CONSOLE_INSTALLATION_ID)


@pytest.mark.django_db(transaction=True)
def test_deleting_a_config_is_a_job_that_deletes_its_sessions_first(
    world: World, session_config: SandboxConfig, engine: Any, settings: Any
) -> None:
    space = world.space_a
    session = Runtime().resolve(space, "on-config").session
    sandbox = session.sandbox_id
    alice = world.client_for("alice")
    page = alice.get(reverse("sandboxes:config_delete", args=[session_config.pk])).content.decode()
    assert "1 session(s)" in page
    alice.post(reverse("sandboxes:config_delete", args=[session_config.pk]))
    job = wait_for(AdminJob.objects.get(kind=teardown.KIND_CONFIG).pk)
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    assert not SandboxConfig.objects.filter(pk=session_config.pk).exists()
    assert not engine.containers(all=True, filters={"id": sandbox})
    meta = f"console.meta.{META_INSTALLATION}={settings.CONSOLE_INSTALLATION_ID}"
    assert not engine.volumes(filters={"label": meta}).get("Volumes")


@pytest.mark.django_db
def test_a_space_member_cannot_delete_the_space(world: World) -> None:
    for name, status in (("bob", 403), ("charlie", 404)):
        answer = world.client_for(name).post(
            reverse("console:space_delete", args=[world.space_a.pk]), {"confirm_slug": "space-a"}
        )
        assert answer.status_code == status
    assert not AdminJob.objects.filter(kind=teardown.KIND_SPACE).exists()


@pytest.mark.django_db
def test_deleting_a_space_asks_for_its_slug(world: World) -> None:
    alice = world.client_for("alice")
    page = reverse("console:space_delete", args=[world.space_a.pk])
    for typed in ("", "space-b", "Space-A"):
        answer = alice.post(page, {"confirm_slug": typed}, follow=True)
        assert answer.status_code == 200
        assert "Type <code>space-a</code> to confirm" in answer.content.decode()
        assert "Type space-a to confirm." in [str(m) for m in answer.context["messages"]]
    assert not AdminJob.objects.filter(kind=teardown.KIND_SPACE).exists()
    assert Space.objects.filter(pk=world.space_a.pk).exists()


@pytest.mark.django_db
def test_no_new_session_starts_in_a_space_being_deleted(world: World) -> None:
    from sandboxes.api.tokens import do_create_api_token
    from sandboxes.sessions.lookup import BeingDeleted, get_or_create_session
    from tests.factories import make_config

    make_config(world.space_a, is_default=True)
    get_or_create_session(world.space_a, "before")
    job = teardown.start_teardown(teardown.KIND_SPACE, world.space_a, str(world.space_a.pk), actor=teardown.SYSTEM)
    with pytest.raises(BeingDeleted, match="space is being deleted"):
        get_or_create_session(world.space_a, "during")
    assert get_or_create_session(world.space_a, "before").key == "before"  # an existing one is found
    _, token = do_create_api_token(world.space_a, name="agent", actor=teardown.SYSTEM)
    answer = world.client_for("anonymous").post(
        reverse("api:resolve", kwargs={"space_id": world.space_a.pk, "key": "during"}),
        content_type="application/json",
        data={},
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "being_deleted"
    AdminJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED)
    assert get_or_create_session(world.space_a, "after").key == "after"  # a failed teardown lets it be


@pytest.mark.django_db(transaction=True)
def test_releasing_a_space_removes_a_network_its_sandboxes_left_behind(
    world: World, session_config: SandboxConfig, engine: Any
) -> None:
    """A space network no container is on any more (a delete cut before its release) goes with
    the space's teardown, which names it."""
    backend = get_backend(session_config)
    name = backend.networks.space_network_name(str(world.space_a.pk))  # type: ignore[attr-defined]
    backend.networks.ensure_space_network(str(world.space_a.pk))  # type: ignore[attr-defined]
    try:
        assert engine.networks(names=[name])
        job = teardown.start_teardown(teardown.KIND_SPACE, world.space_a, str(world.space_a.pk), actor=teardown.SYSTEM)
        run_to_end(str(job.id))
        job.refresh_from_db()
        assert job.status == JobStatus.SUCCEEDED, job_error(job)
        assert f"Deleted network {name}" in "\n".join(line["message"] for line in job.log)
        assert not [row for row in engine.networks(names=[name]) if row["Name"] == name]
    finally:
        with contextlib.suppress(docker.errors.APIError):
            engine.remove_network(name)


@pytest.mark.django_db
def test_another_spaces_admin_cannot_delete_a_config_or_session_by_its_id(world: World) -> None:
    """charlie administers space B only: space A's config and session ids, forged into his
    requests, are not found (GET and POST alike), and no teardown starts."""
    from sandboxes.sessions.lookup import get_or_create_session
    from tests.factories import make_config

    config = make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "theirs")
    charlie = world.client_for("charlie")
    pages = (
        reverse("sandboxes:config_delete", args=[config.pk]),
        reverse("sandboxes:session_action", args=[session.pk, "delete"]),
    )
    for page in pages:
        assert charlie.get(page).status_code == 404
        assert charlie.post(page).status_code == 404
    assert world.client_for("bob").post(pages[1]).status_code == 403  # a member, not an admin
    assert not AdminJob.objects.filter(kind__in=[teardown.KIND_CONFIG, teardown.KIND_SESSION]).exists()


@pytest.mark.django_db
def test_a_second_delete_of_a_session_follows_the_running_teardown(world: World) -> None:
    """A double POST starts one job; the second says so, and a GET while it runs shows the job."""
    from sandboxes.sessions.lookup import get_or_create_session
    from tests.factories import make_config

    make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "twice")
    alice = world.client_for("alice")
    page = reverse("sandboxes:session_action", args=[session.pk, "delete"])
    first = alice.post(page)
    job = AdminJob.objects.get(kind=teardown.KIND_SESSION)  # queued: this test's transaction never commits
    assert first.status_code == 302
    assert first["Location"] == job.get_absolute_url()
    second = alice.post(page, follow=True)
    assert "Its deletion is already running" in second.content.decode()
    assert AdminJob.objects.filter(kind=teardown.KIND_SESSION).count() == 1
    shown = alice.get(page)
    assert shown.status_code == 302
    assert shown["Location"] == job.get_absolute_url()


@pytest.mark.django_db
def test_the_delete_pages_refuse_a_post_without_a_csrf_token(world: World) -> None:
    from django.test import Client

    from sandboxes.sessions.lookup import get_or_create_session
    from tests.factories import make_config

    config = make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "csrf")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(world.alice)
    for page, data in (
        (reverse("console:space_delete", args=[world.space_a.pk]), {"confirm_slug": "space-a"}),
        (reverse("sandboxes:config_delete", args=[config.pk]), {}),
        (reverse("sandboxes:session_action", args=[session.pk, "delete"]), {}),
    ):
        assert browser.post(page, data).status_code == 403
    assert not AdminJob.objects.exists()

"""The install pipeline on the real Docker engine: skill images, generations, sessions.

Each test gets its own installation id; everything it creates (build and session sandboxes,
snapshots, workspace volumes) is deleted afterwards, and the sandbox tests' session sweep
removes what a crash might leave.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.crypto import encrypt
from console.models import AuditEvent, JobStatus
from sandboxes.backends.base import ExecRequest
from sandboxes.models import PlatformBackend, SandboxConfig, Session, SessionImage
from sandboxes.sessions.provisioning import effective_template
from sandboxes.sessions.runtime import Runtime
from skills.images import current_image, do_delete_old_snapshots, do_rollback_image
from skills.install.packages import console_pip_wheel
from skills.models import SkillImage, SkillImageStatus
from tests.personas import World
from tests.support.skill_install import (
    build_sandboxes,
    import_skill,
    job_error,
    plain_skill,
    run_install,
    run_uninstall,
    skill_with_dependency,
    skills_config,
)

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.django_db]


@pytest.fixture
def config(world: World, docker_base_image: str, installation: str, wheels: Path) -> Iterator[SandboxConfig]:
    with skills_config(world.space_a, docker_base_image, installation, pip_find_links=wheels.name) as made:
        yield made


def sh(runtime: Runtime, session: Session, shell: str, user: str = "user") -> tuple[int, str]:
    result = runtime.exec(session, ExecRequest(shell=shell, user=user, timeout_s=60))
    return result.exit_code, (result.stdout + result.stderr).decode()


def test_install_makes_a_snapshot_new_sessions_start_from(
    world: World, config: SandboxConfig, runtime: Runtime, installation: str
) -> None:
    version = import_skill(skill_with_dependency())
    job = run_install(world.space_a, config, version, actor=_actor(world))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    image = current_image(world.space_a, config)
    assert image is not None
    assert image.generation == 1
    assert image.status == SkillImageStatus.READY
    assert image.snapshot_id.startswith("snap-")
    assert len(image.fingerprint) == 64
    assert set(image.timings) == {
        "create",
        "check",
        "copy",
        "dependencies",
        "verify",
        "clean",
        "ledger",
        "snapshot",
        "record",
    }
    assert image.manifest[0]["name"] == "tiny-skill"
    assert image.manifest[0]["installed"] == ["tinydep-1.0"]
    assert image.manifest[0]["verified_by"] == "entry checks (1 script(s))"
    assert any("step verify" in line["message"] for line in job.log)
    assert build_sandboxes(config, installation) == []
    assert effective_template(world.space_a, config).template_id == image.snapshot_id

    resolved = runtime.resolve(world.space_a, "after-install")
    session = resolved.session
    assert Session.objects.get(pk=session.pk).template_id == image.snapshot_id
    assert sh(runtime, session, "/opt/skills/tiny-skill/scripts/run.py") == (0, "tinydep says 42\n")
    assert sh(runtime, session, "python3 -c 'import tinydep; print(tinydep.__file__)'")[0] == 0
    assert sh(runtime, session, "stat -c '%U %a' /opt/skills/tiny-skill /opt/skills/tiny-skill/scripts/run.py") == (
        0,
        "root 755\nroot 755\n",
    )
    assert sh(runtime, session, "stat -c '%a' /opt/skills/tiny-skill/SKILL.md") == (0, "644\n")
    code, out = sh(runtime, session, "touch /opt/skills/tiny-skill/x")
    assert code != 0
    assert "Permission denied" in out
    assert sh(runtime, session, "echo hacked >> /opt/skills/tiny-skill/SKILL.md")[0] != 0
    assert sh(runtime, session, "rm -rf /opt/skills/tiny-skill/scripts/run.py")[0] != 0
    assert sh(runtime, session, "test -e /tmp/skill-build; echo $?") == (0, "1\n")
    code, ledger = sh(runtime, session, "cat /opt/skills/.ledger.json")
    assert code == 0
    assert [entry["name"] for entry in json.loads(ledger)["skills"]] == ["tiny-skill"]
    assert AuditEvent.objects.filter(action="skill_image.install", space=world.space_a).count() == 1
    assert AuditEvent.objects.filter(action="session_image.set", space=world.space_a).count() == 1


def test_a_failing_check_script_keeps_the_previous_generation(
    world: World, config: SandboxConfig, installation: str
) -> None:
    first = run_install(world.space_a, config, import_skill(plain_skill("first-skill")))
    assert first.status == JobStatus.SUCCEEDED, job_error(first)
    before = current_image(world.space_a, config)
    assert before is not None
    failing = import_skill(
        skill_with_dependency("broken-skill", check="#!/bin/bash\necho self-test broke >&2\nexit 3\n")
    )
    job = run_install(world.space_a, config, failing)
    assert job.status == JobStatus.FAILED
    assert "step verify failed" in job.error
    assert "self-test broke" in job.error
    failed = SkillImage.objects.get(space=world.space_a, config=config, generation=2)
    assert failed.status == SkillImageStatus.FAILED
    assert failed.failed_step == "verify"
    assert failed.snapshot_id == ""
    assert failed.fingerprint == ""
    assert current_image(world.space_a, config) == before
    assert SessionImage.objects.get(space=world.space_a, config=config).snapshot_id == before.snapshot_id
    assert build_sandboxes(config, installation) == []


def test_missing_package_source_fails_the_check_step(world: World, config: SandboxConfig, installation: str) -> None:
    PlatformBackend.objects.filter(pk=config.backend_id).update(pip_find_links="")
    config.refresh_from_db()
    job = run_install(world.space_a, config, import_skill(skill_with_dependency()))
    assert job.status == JobStatus.FAILED
    assert "step check failed" in job.error
    assert "no pip package source" in job.error
    assert current_image(world.space_a, config) is None
    assert build_sandboxes(config, installation) == []


def test_a_stale_session_rebuilds_on_its_next_turn(world: World, config: SandboxConfig, runtime: Runtime) -> None:
    before = runtime.resolve(world.space_a, "long-lived")
    assert before.action == "created"
    assert sh(runtime, before.session, "test -e /opt/skills/tiny-skill; echo $?") == (0, "1\n")
    job = run_install(world.space_a, config, import_skill(skill_with_dependency()))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    session = Session.objects.select_related("space", "config").get(pk=before.session.pk)
    assert session.is_stale
    runtime.begin_turn(session)
    rebuilt = runtime.resolve_session(session)
    assert rebuilt.action == "rebuilt"
    assert rebuilt.sandbox.sandbox_id != before.sandbox.sandbox_id
    again = runtime.resolve_session(session)
    assert again.action == "bound"
    assert again.sandbox.sandbox_id == rebuilt.sandbox.sandbox_id
    runtime.end_turn(session)
    assert sh(runtime, session, "/opt/skills/tiny-skill/scripts/run.py") == (0, "tinydep says 42\n")


def test_another_account_falls_back_to_the_base_template(
    world: World, config: SandboxConfig, docker_base_image: str
) -> None:
    job = run_install(world.space_a, config, import_skill(plain_skill("solo-skill")))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    image = current_image(world.space_a, config)
    assert image is not None
    # Another account: the key (then the endpoint) changes underneath, as an edit in the DB would.
    PlatformBackend.objects.filter(pk=config.backend_id).update(api_key_encrypted=encrypt("someone-else"))
    config.refresh_from_db()
    effective = effective_template(world.space_a, config)
    assert effective.template_id == docker_base_image
    assert effective.source == "default template"
    assert image.snapshot_id in effective.note
    page = world.client_for("carol").get(image.get_absolute_url()).content.decode()
    assert "fingerprint-mismatch" in page
    assert "sessions fall back to the base template" in page
    PlatformBackend.objects.filter(pk=config.backend_id).update(
        api_key_encrypted=encrypt(""), endpoint="tcp://other:2375"
    )
    config.refresh_from_db()
    assert effective_template(world.space_a, config).source == "default template"
    # Restore the account so clean-up reaches the engine.
    PlatformBackend.objects.filter(pk=config.backend_id).update(endpoint="")
    config.refresh_from_db()
    assert effective_template(world.space_a, config).template_id == image.snapshot_id


def test_uninstall_and_rollback_each_move_the_pointer_and_mark_sessions_stale(
    world: World, config: SandboxConfig, runtime: Runtime, installation: str
) -> None:
    alpha = import_skill(plain_skill("alpha-skill"))
    beta = import_skill(plain_skill("beta-skill"))
    assert run_install(world.space_a, config, alpha).status == JobStatus.SUCCEEDED
    assert run_install(world.space_a, config, beta).status == JobStatus.SUCCEEDED
    second = current_image(world.space_a, config)
    assert second is not None
    assert second.skill_names == ["alpha-skill", "beta-skill"]
    session = runtime.resolve(world.space_a, "watcher").session

    job = run_uninstall(world.space_a, config, "alpha-skill")
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    third = current_image(world.space_a, config)
    assert third is not None
    assert third.generation == 3
    assert third.skill_names == ["beta-skill"]
    assert third.base_template == config.default_template
    assert third.parent == second
    session.refresh_from_db()
    assert session.is_stale
    fresh = runtime.resolve(world.space_a, "after-uninstall").session
    assert sh(runtime, fresh, "ls /opt/skills") == (0, "beta-skill\n")

    first = SkillImage.objects.get(space=world.space_a, config=config, generation=1)
    stale_before = Session.objects.get(pk=session.pk).stale_at
    do_rollback_image(first, actor=_actor(world))
    assert current_image(world.space_a, config) == first
    assert Session.objects.get(pk=session.pk).stale_at != stale_before
    assert AuditEvent.objects.filter(action="skill_image.uninstall").count() == 1
    assert AuditEvent.objects.filter(action="skill_image.rollback").count() == 1
    rolled = runtime.resolve(world.space_a, "after-rollback").session
    assert sh(runtime, rolled, "ls /opt/skills") == (0, "alpha-skill\n")

    # Old snapshots: only those no session's sandbox runs from may go.
    retired, kept = do_delete_old_snapshots(world.space_a, config, actor=_actor(world))
    assert retired == []
    assert any("generation 2" in line and "1 session(s)" in line for line in kept)
    runtime.delete(Session.objects.select_related("space", "config").get(pk=session.pk), actor=_actor(world))
    retired, kept = do_delete_old_snapshots(world.space_a, config, actor=_actor(world))
    assert retired == [2]
    assert any("generation 3" in line and "session" in line for line in kept)
    assert SkillImage.objects.get(space=world.space_a, config=config, generation=2).status == "retired"
    assert build_sandboxes(config, installation) == []


def _actor(world: World) -> Any:
    from console.services import Actor

    return Actor(user=world.alice)


def test_a_pip_wheel_in_the_package_source_is_run_from_the_wheel(
    world: World, config: SandboxConfig, wheels: Path
) -> None:
    name, data = console_pip_wheel()
    (wheels / name).write_bytes(data)
    job = run_install(world.space_a, config, import_skill(skill_with_dependency()))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    assert any(f"running {name} from the package source" in line["message"] for line in job.log)


def test_debian_packages_the_image_lacks_fail_clearly(world: World, config: SandboxConfig, installation: str) -> None:
    # jq and curl are in the base image (the bundled text-stats skill needs jq); cowsay is not.
    skill = import_skill(plain_skill("needs-cowsay", extra_md='metadata:\n  debian-packages: "bash jq cowsay"\n'))
    job = run_install(world.space_a, config, skill)
    assert job.status == JobStatus.FAILED
    assert job.error == (
        "step check failed: Debian package cowsay: not in the image, and the platform backend has no apt source "
        "(set 'apt repository folder' or 'apt mirror or proxy URL' on it)"
    )
    assert build_sandboxes(config, installation) == []


def test_install_from_the_page_then_follow_the_job(world: World, config: SandboxConfig) -> None:
    from django.urls import reverse

    from console.jobs import run_job
    from console.models import AdminJob

    version = import_skill(skill_with_dependency())
    client = world.client_for("alice")
    page_url = reverse("skills:image_detail", kwargs={"space_id": world.space_a.id})
    response = client.post(
        reverse("skills:image_install", kwargs={"space_id": world.space_a.id}),
        {"config": str(config.id), "version": str(version.id)},
    )
    job = AdminJob.objects.get(kind="skills.install")
    assert response["Location"] == job.get_absolute_url()
    finished = run_job(str(job.id))  # the runner a Celery worker or thread would call
    assert finished is not None
    assert finished.status == JobStatus.SUCCEEDED, job_error(finished)
    job_page = client.get(job.get_absolute_url()).content.decode()
    assert "step snapshot" in job_page
    assert "Install skill" in job_page
    page = world.client_for("carol").get(page_url).content.decode()
    assert "/opt/skills/tiny-skill" in page
    assert "tinydep-1.0" in page
    assert '<span class="badge">current</span>' in page


def test_a_check_script_named_in_metadata_runs_as_the_session_user(world: World, config: SandboxConfig) -> None:
    from tests.support.skills import EXECUTABLE, REGULAR, build_zip

    md = (
        "---\nname: checked-skill\ndescription: Has its own self-test. Use when testing installs.\n"
        "license: MIT\nmetadata:\n  check: tests/selftest\n---\n\nBody.\n"
    )
    selftest = (
        b"#!/usr/bin/env python3\nimport os, tinydep\n"
        b"assert os.getuid() == 1000, os.getuid()\n"
        b"assert os.getcwd() == os.environ['SKILL_DIR'] == '/opt/skills/checked-skill'\n"
        b"print('selftest ok', tinydep.VALUE)\n"
    )
    archive = build_zip(
        [
            ("checked-skill/SKILL.md", md.encode(), REGULAR),
            ("checked-skill/requirements.txt", b"tinydep\n", REGULAR),
            ("checked-skill/tests/selftest", selftest, EXECUTABLE),
        ]
    )
    job = run_install(world.space_a, config, import_skill(archive))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    image = current_image(world.space_a, config)
    assert image is not None
    assert image.manifest[0]["verified_by"] == "entry checks (1 script(s)) and check script tests/selftest"

"""Skills imported from git: a folder of a commit imported through the archive checks, the
commit recorded, a newer commit found (on demand and by the periodic pass) and imported on
request, errors and timeouts shown, and only platform admins acting on it. Repositories are
written in a tmp folder and served by `git daemon` on 127.0.0.1 (or read through file://).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from console.models import AuditAction, AuditEvent
from console.services import SYSTEM, ServiceError
from skills.models import GitSource, Skill, SkillVersion
from skills.sources.services import check_git_sources, do_set_git_hosts, import_from_git
from tests.personas import World
from tests.support.git_repos import GitDaemon, GitRepo, RedirectServer, SilentServer, free_port, skill_md

pytestmark = pytest.mark.django_db

PDF = "skills/pdf-tool"


@pytest.fixture
def served(tmp_path: Path) -> Path:
    return tmp_path / "served"


@pytest.fixture
def daemon(served: Path) -> Iterator[GitDaemon]:
    served.mkdir()
    with GitDaemon(served) as running:
        yield running


@pytest.fixture
def allowed(daemon: GitDaemon) -> GitDaemon:
    do_set_git_hosts([daemon.host], allow_local_paths=False, actor=SYSTEM)
    return daemon


@pytest.fixture
def repo(served: Path) -> GitRepo:
    made = GitRepo(served / "tools")
    made.commit(
        {
            f"{PDF}/SKILL.md": skill_md("pdf-tool"),
            f"{PDF}/scripts/run.py": b"#!/usr/bin/env python3\nprint('pdf')\n",
            f"{PDF}/node_modules/left/index.js": b"x",
            "README.md": b"Tools.\n",
        },
        executable=(f"{PDF}/scripts/run.py",),
    )
    return made


def import_page(world: World, data: dict[str, str], persona: str = "root") -> Any:
    return world.client_for(persona).post(reverse("skills:git_import"), data)


def test_a_folder_of_a_commit_is_imported_with_its_commit_recorded(
    world: World, allowed: GitDaemon, repo: GitRepo
) -> None:
    response = import_page(world, {"url": allowed.url("tools"), "ref": "main", "path": PDF})
    version = SkillVersion.objects.get(skill__name="pdf-tool")
    assert response.status_code == 302
    assert response["Location"] == version.get_absolute_url()
    assert version.source_commit == repo.head()
    assert version.folder_name == "pdf-tool"
    files = {f.path: f.mode for f in version.files.all()}
    assert files == {"SKILL.md": 0o644, "scripts/run.py": 0o755}  # node_modules dropped, README outside
    assert any("Left out 1 packaging leftover" in issue["message"] for issue in version.warnings)
    source = GitSource.objects.get(skill=version.skill)
    assert (source.url, source.ref, source.path, source.commit) == (allowed.url("tools"), "main", PDF, repo.head())
    audit = AuditEvent.objects.get(action=AuditAction.SKILL_IMPORT)
    assert audit.details["commit"] == repo.head()
    assert audit.details["origin"].startswith(f"git {allowed.url('tools')} main {PDF} @ ")
    page = world.client_for("root").get(version.skill.get_absolute_url()).content.decode()
    assert repo.head()[:12] in page
    assert 'id="source-current"' in page


def test_a_newer_commit_is_found_shown_and_imported_on_request(world: World, allowed: GitDaemon, repo: GitRepo) -> None:
    first = import_from_git(allowed.url("tools"), "", PDF, actor=SYSTEM).version
    skill = first.skill
    newer = repo.commit({f"{PDF}/SKILL.md": skill_md("pdf-tool", body="Now better.")})
    root = world.client_for("root")
    response = root.post(reverse("skills:source_check", kwargs={"skill_id": skill.id}), follow=True)
    page = response.content.decode()
    assert f"A newer commit {newer[:12]}" in page
    assert 'id="newer-commit"' in page
    assert GitSource.objects.get(skill=skill).commit == first.source_commit  # a check imports nothing

    response = root.post(reverse("skills:source_update", kwargs={"skill_id": skill.id}))
    skill.refresh_from_db()
    latest = skill.latest_version
    assert latest is not None
    assert response["Location"] == skill.get_absolute_url()
    assert latest.pk != first.pk
    assert latest.source_commit == newer
    assert "Now better." in latest.body
    source = GitSource.objects.get(skill=skill)
    assert (source.commit, source.remote_commit) == (newer, newer)
    assert AuditEvent.objects.filter(action=AuditAction.SKILL_IMPORT).count() == 2
    assert 'id="source-current"' in root.get(skill.get_absolute_url()).content.decode()


def test_a_commit_outside_the_folder_moves_the_commit_without_a_new_version(allowed: GitDaemon, repo: GitRepo) -> None:
    first = import_from_git(allowed.url("tools"), "", PDF, actor=SYSTEM).version
    moved = repo.commit({"README.md": b"Other words.\n"})
    result = import_from_git(allowed.url("tools"), "", PDF, actor=SYSTEM, expect=first.skill)
    assert not result.created
    assert result.version.pk == first.pk
    assert GitSource.objects.get(skill=first.skill).commit == moved


def test_an_update_whose_folder_holds_another_skill_writes_nothing(allowed: GitDaemon, repo: GitRepo) -> None:
    first = import_from_git(allowed.url("tools"), "", PDF, actor=SYSTEM).version
    repo.commit({f"{PDF}/SKILL.md": skill_md("renamed-tool")})
    source = GitSource.objects.get(skill=first.skill)
    with pytest.raises(ServiceError, match="holds the skill 'renamed-tool'"):
        import_from_git(source.url, source.ref, source.path, actor=SYSTEM, expect=first.skill)
    assert not Skill.objects.filter(name="renamed-tool").exists()
    assert GitSource.objects.get(skill=first.skill).commit == first.source_commit
    assert AuditEvent.objects.filter(action=AuditAction.SKILL_IMPORT).count() == 1


def test_a_non_utf8_name_or_a_link_in_the_folder_is_a_form_error(
    world: World, allowed: GitDaemon, served: Path
) -> None:
    odd = GitRepo(served / "odd")
    odd.commit({"SKILL.md": skill_md("odd"), b"notes-\xff.txt": b"x"})
    response = import_page(world, {"url": allowed.url("odd"), "ref": "", "path": ""})
    assert response.status_code == 400
    assert "notes-\\xff.txt" in response.content.decode()
    linked = GitRepo(served / "linked")
    os.symlink("/etc/passwd", linked.root / "passwd")
    linked.commit({"SKILL.md": skill_md("linked")})
    response = import_page(world, {"url": allowed.url("linked"), "ref": "", "path": ""})
    assert response.status_code == 400
    assert "link" in response.content.decode()
    assert not Skill.objects.exists()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"url": "https://elsewhere.test/tools.git", "path": PDF}, "not in the allowed git hosts"),
        ({"url": "ext::sh -c id", "path": ""}, "Remote helpers"),
        ({"url": "TOOLS", "path": ""}, "scheme"),
        ({"path": "../etc"}, "not a folder path"),
        ({"path": "skills/missing"}, "has no folder 'skills/missing' to import"),
        ({"path": f"{PDF}/SKILL.md"}, "has no folder 'skills/pdf-tool/SKILL.md' to import"),
        ({"ref": "nope"}, "Fetching nope failed"),
        ({"ref": "--upload-pack=id"}, "not a branch or tag"),
    ],
)
def test_bad_sources_are_form_errors(
    world: World, allowed: GitDaemon, repo: GitRepo, data: dict[str, str], reason: str
) -> None:
    form = {"url": allowed.url("tools"), "ref": "", "path": PDF, **data}
    response = import_page(world, form)
    assert response.status_code == 400
    assert reason in response.content.decode().replace("&#x27;", "'")
    assert not Skill.objects.exists()


def test_a_redirect_off_the_allowed_hosts_is_not_followed(world: World) -> None:
    elsewhere = SilentServer()  # not allowed: must never be contacted
    redirect = RedirectServer(f"http://127.0.0.1:{elsewhere.port}")
    try:
        do_set_git_hosts([f"127.0.0.1:{redirect.port}"], allow_local_paths=False, actor=SYSTEM)
        response = import_page(world, {"url": f"http://127.0.0.1:{redirect.port}/tools.git", "ref": "", "path": ""})
        assert response.status_code == 400
        assert "Fetching the default branch failed" in response.content.decode()
        assert not elsewhere.was_contacted()
    finally:
        redirect.close()
        elsewhere.close()


def test_file_urls_only_when_local_paths_are_allowed(world: World, repo: GitRepo) -> None:
    data = {"url": repo.file_url, "ref": "", "path": PDF}
    assert "file:// URLs are not allowed" in import_page(world, data).content.decode()
    do_set_git_hosts([], allow_local_paths=True, actor=SYSTEM)
    assert import_page(world, data).status_code == 302
    assert SkillVersion.objects.get(skill__name="pdf-tool").source_commit == repo.head()


def test_a_repository_over_the_size_limit_is_refused(
    world: World, allowed: GitDaemon, served: Path, tuned: Any
) -> None:
    big = GitRepo(served / "big")
    big.commit({"SKILL.md": skill_md("big"), "blob.bin": os.urandom(400_000)})
    tuned(skills={"max_uncompressed_bytes": 100_000})
    response = import_page(world, {"url": allowed.url("big"), "ref": "", "path": ""})
    assert response.status_code == 400
    assert "over 97.7 KiB" in response.content.decode()


def test_check_errors_and_timeouts_are_stored_and_shown(
    world: World, allowed: GitDaemon, repo: GitRepo, tuned: Any
) -> None:
    skill = import_from_git(allowed.url("tools"), "", PDF, actor=SYSTEM).version.skill
    silent, closed = SilentServer(), free_port()
    try:
        do_set_git_hosts(
            [allowed.host, f"127.0.0.1:{silent.port}", f"127.0.0.1:{closed}"], allow_local_paths=False, actor=SYSTEM
        )
        tuned(skills={"git_check_timeout_s": 1.0})
        root, check = world.client_for("root"), reverse("skills:source_check", kwargs={"skill_id": skill.id})
        GitSource.objects.filter(skill=skill).update(url=f"git://127.0.0.1:{silent.port}/tools")
        page = root.post(check, follow=True).content.decode()
        assert "git ls-remote took longer than 1 s" in page
        GitSource.objects.filter(skill=skill).update(url=f"git://127.0.0.1:{closed}/tools")
        page = root.post(check, follow=True).content.decode()
        assert 'id="source-error"' in page
        assert "The repository did not answer" in GitSource.objects.get(skill=skill).check_error
    finally:
        silent.close()


def test_the_periodic_pass_checks_sources_that_are_due(allowed: GitDaemon, repo: GitRepo) -> None:
    skill = import_from_git(allowed.url("tools"), "", PDF, actor=SYSTEM).version.skill
    newer = repo.commit({f"{PDF}/SKILL.md": skill_md("pdf-tool", body="Later.")})
    assert check_git_sources() == 0  # just imported: not due
    GitSource.objects.filter(skill=skill).update(checked=timezone.now() - timedelta(days=1))
    assert check_git_sources() == 1
    source = GitSource.objects.get(skill=skill)
    assert source.remote_commit == newer
    assert source.has_newer_commit


def test_only_platform_admins_act_and_forged_ids_are_404(world: World, allowed: GitDaemon, repo: GitRepo) -> None:
    skill = import_from_git(allowed.url("tools"), "", PDF, actor=SYSTEM).version.skill
    newer = repo.commit({f"{PDF}/SKILL.md": skill_md("pdf-tool", body="Forged.")})
    for persona in ("alice", "bob", "carol", "charlie"):
        client = world.client_for(persona)
        for name in ("source_check", "source_update"):
            assert client.post(reverse(f"skills:{name}", kwargs={"skill_id": skill.id})).status_code == 403
        assert client.get(reverse("skills:git_import")).status_code == 403
        assert client.post(reverse("skills:git_hosts"), {"allowed_hosts": "evil.test"}).status_code == 403
        page = client.get(skill.get_absolute_url()).content.decode()
        assert "Import the newest commit" not in page
    source = GitSource.objects.get(skill=skill)
    assert (source.commit, source.remote_commit) != (newer, newer)
    assert source.remote_commit != newer
    assert SkillVersion.objects.filter(skill=skill).count() == 1
    root = world.client_for("root")
    plain = Skill.objects.create(name="no-source")
    for skill_id in (uuid.uuid4(), plain.id):
        for name in ("source_check", "source_update"):
            assert root.post(reverse(f"skills:{name}", kwargs={"skill_id": skill_id})).status_code == 404


def test_the_allowed_hosts_page_saves_and_audits(world: World) -> None:
    root, url = world.client_for("root"), reverse("skills:git_hosts")
    assert root.get(url).status_code == 200
    assert root.get(reverse("skills:git_import")).status_code == 200
    response = root.post(url, {"allowed_hosts": "git.example.test\nhttps://x.test"})
    assert response.status_code == 400
    assert "https://x.test" in response.content.decode()
    response = root.post(url, {"allowed_hosts": "Git.Example.Test\n\n127.0.0.1:9418\n", "allow_local_paths": "on"})
    assert response.status_code == 302
    event = AuditEvent.objects.get(action=AuditAction.SKILL_GIT_HOSTS)
    assert event.details["hosts"] == ["127.0.0.1:9418", "git.example.test"]
    assert event.details["allow_local_paths"] is True
    assert "git.example.test" in root.get(url).content.decode()


def test_the_import_command_takes_git_urls_and_goes_on_after_a_refusal(
    allowed: GitDaemon, repo: GitRepo, served: Path
) -> None:
    other = GitRepo(served / "other")
    other.commit({f"{PDF}/SKILL.md": skill_md("other-tool")})
    with pytest.raises(CommandError, match="1 of 3"):
        call_command(
            "import_skill",
            "--git",
            allowed.url("tools"),
            "--git",
            allowed.url("missing"),
            "--git",
            allowed.url("other"),
            "--path",
            PDF,
        )
    assert set(Skill.objects.values_list("name", flat=True)) == {"pdf-tool", "other-tool"}
    assert GitSource.objects.get(skill__name="other-tool").commit == other.head()

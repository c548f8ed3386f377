"""Import and delete services: content hashing, no-op re-imports, versions, one audit row per
write, the installer's read, the bundled examples and the management command."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from console.models import AuditEvent
from console.services import SYSTEM, Actor, ServiceError
from skills.archives import SkillEntry
from skills.models import Skill, SkillFile, SkillVersion
from skills.services import (
    SkillFileContent,
    content_hash,
    do_delete_skill_version,
    example_folders,
    import_folder,
    version_files,
)
from tests.support.skills import EXECUTABLE, REGULAR, build_zip, import_bytes, skill_md, skill_zip

from .conftest import World

pytestmark = pytest.mark.django_db


def audits(action: str = "") -> int:
    events = AuditEvent.objects.all()
    return events.filter(action=action).count() if action else events.count()


def test_import_creates_a_skill_a_version_and_one_audit_row(world: World) -> None:
    actor = Actor(user=world.root, source_ip="10.1.2.3")
    result = import_bytes(skill_zip({"scripts/run.sh": b"#!/bin/sh\n"}), actor=actor)
    assert result.created
    assert result.new_skill
    version = result.version
    assert version.skill.latest_version == version
    assert version.file_count == 2
    assert version.size == len(skill_md()) + len(b"#!/bin/sh\n")
    assert version.imported_by == world.root
    assert version.origin == "upload my-skill.skill"
    assert len(version.content_hash) == 64
    event = AuditEvent.objects.get()
    assert (event.action, event.actor, event.source_ip) == ("skill.import", world.root, "10.1.2.3")
    assert event.target_id == str(version.id)
    assert event.details["name"] == "my-skill"
    assert "imported" in result.message


def test_same_content_is_a_noop_without_audit() -> None:
    first = import_bytes(skill_zip({"a.txt": b"a"}))
    again = import_bytes(skill_zip({"a.txt": b"a"}), "renamed.zip")
    assert not again.created
    assert again.version == first.version
    assert "already in the catalog; nothing changed" in again.message
    assert (Skill.objects.count(), SkillVersion.objects.count(), audits()) == (1, 1, 1)


def test_changed_content_is_a_new_version_of_the_same_skill() -> None:
    first = import_bytes(skill_zip({"a.txt": b"a"})).version
    second = import_bytes(skill_zip({"a.txt": b"b"}))
    assert second.created
    assert not second.new_skill
    assert second.version.skill_id == first.skill_id
    assert second.version.content_hash != first.content_hash
    skill = Skill.objects.get()
    assert skill.latest_version == second.version
    assert skill.versions.count() == 2
    assert "new version" in second.message
    assert audits("skill.import") == 2


def test_mode_change_alone_is_a_new_version() -> None:
    one = import_bytes(build_zip([("s/SKILL.md", skill_md("s"), REGULAR), ("s/run", b"x", REGULAR)]))
    two = import_bytes(build_zip([("s/SKILL.md", skill_md("s"), REGULAR), ("s/run", b"x", EXECUTABLE)]))
    assert two.created
    assert one.version.content_hash != two.version.content_hash


def test_content_hash_is_order_independent_and_unambiguous() -> None:
    a = [SkillEntry.of("a", 0o644, b"1"), SkillEntry.of("b", 0o644, b"2")]
    assert content_hash(a) == content_hash(list(reversed(a)))
    assert content_hash([SkillEntry.of("ab", 0o644, b"")]) != content_hash([SkillEntry.of("a", 0o644, b"b")])


def test_warnings_are_stored_and_counted() -> None:
    data = build_zip([("folder/SKILL.md", b"---\nname: other\ndescription: x <y>\n---\nbody\n", REGULAR)])
    version = import_bytes(data).version
    messages = [w["message"] for w in version.warnings]
    assert any("differs from its folder 'folder'" in m for m in messages)
    assert any("'<' or '>'" in m for m in messages)
    assert any("No 'license'" in m for m in messages)
    assert version.warning_count == 3
    assert version.skill.name == "other"
    assert version.folder_name == "folder"


def test_version_files_yields_path_mode_bytes_in_order() -> None:
    version = import_bytes(skill_zip({"b/x.bin": b"\x00\xff", "a.txt": b"a"})).version
    files = list(version_files(version))
    assert [f.path for f in files] == ["SKILL.md", "a.txt", "b/x.bin"]
    assert files[2] == SkillFileContent("b/x.bin", 0o644, b"\x00\xff")
    path, mode, data = files[1]
    assert (path, mode, data) == ("a.txt", 0o644, b"a")


def test_version_files_detects_corruption() -> None:
    version = import_bytes(skill_zip({"a.txt": b"a"})).version
    SkillFile.objects.filter(version=version, path="a.txt").update(content=b"tampered")
    with pytest.raises(ServiceError, match="does not match its SHA-256"):
        list(version_files(version))


def test_delete_latest_version_falls_back_to_the_previous_one() -> None:
    first = import_bytes(skill_zip({"a.txt": b"a"})).version
    second = import_bytes(skill_zip({"a.txt": b"b"})).version
    before = audits()
    skill = do_delete_skill_version(second, actor=SYSTEM)
    assert skill is not None
    assert skill.latest_version == first
    assert not SkillVersion.objects.filter(pk=second.pk).exists()
    assert not SkillFile.objects.filter(version_id=second.pk).exists()
    assert audits() == before + 1
    assert AuditEvent.objects.first().action == "skill.delete_version"  # type: ignore[union-attr]


def test_delete_older_version_keeps_the_latest() -> None:
    first = import_bytes(skill_zip({"a.txt": b"a"})).version
    second = import_bytes(skill_zip({"a.txt": b"b"})).version
    skill = do_delete_skill_version(first, actor=SYSTEM)
    assert skill is not None
    assert skill.latest_version == second


def test_delete_last_version_deletes_the_skill() -> None:
    version = import_bytes(skill_zip()).version
    assert do_delete_skill_version(version, actor=SYSTEM) is None
    assert (Skill.objects.count(), SkillVersion.objects.count(), SkillFile.objects.count()) == (0, 0, 0)
    assert AuditEvent.objects.get(action="skill.delete_version").details["skill_deleted"] is True


def test_reimport_after_delete_creates_again() -> None:
    version = import_bytes(skill_zip()).version
    do_delete_skill_version(version, actor=SYSTEM)
    assert import_bytes(skill_zip()).created


def test_folder_and_archive_of_the_same_tree_are_the_same_version(tmp_path: Any) -> None:
    folder = tmp_path / "my-skill"
    folder.mkdir()
    (folder / "SKILL.md").write_bytes(skill_md())
    (folder / "SKILL.md").chmod(0o644)
    first = import_folder(folder, actor=SYSTEM)
    again = import_bytes(skill_zip())
    assert first.created
    assert not again.created


# --- Bundled examples and the management command -----------------------------------------


def test_bundled_examples_import_with_their_dependencies_and_modes() -> None:
    assert [p.name for p in example_folders()] == ["commit-message-style", "csv-summary", "text-stats"]
    out = io.StringIO()
    call_command("import_skill", "--examples", stdout=out)
    assert Skill.objects.count() == 3
    csv_summary = Skill.objects.get(name="csv-summary").latest_version
    assert csv_summary is not None
    assert csv_summary.dependencies["pip"] == [
        {"requirement": "tabulate>=0.9", "name": "tabulate", "source": "scripts/requirements.txt"}
    ]
    assert csv_summary.warning_count == 0, csv_summary.warnings
    modes = {f.path: f.mode for f in version_files(csv_summary)}
    assert modes["scripts/summarise.py"] & 0o111, "the script stays executable"
    text_stats = Skill.objects.get(name="text-stats").latest_version
    assert text_stats is not None
    assert text_stats.dependencies["debian"] == ["jq"]
    assert text_stats.allowed_tools == ["Bash(scripts/text-stats.sh:*)", "Read"]
    docs_only = Skill.objects.get(name="commit-message-style").latest_version
    assert docs_only is not None
    assert docs_only.dependencies == {"pip": [], "npm": [], "debian": []}
    assert "imported" in out.getvalue()
    assert audits("skill.import") == 3

    again = io.StringIO()
    call_command("import_skill", "--examples", stdout=again)
    assert again.getvalue().count("nothing changed") == 3
    assert audits() == 3


def test_command_imports_paths_and_reports_refusals(tmp_path: Any) -> None:
    archive = tmp_path / "my-skill.skill"
    archive.write_bytes(skill_zip())
    bad = tmp_path / "bad.zip"
    bad.write_bytes(build_zip([("x/SKILL.md", b"no frontmatter\n", REGULAR)]))
    err = io.StringIO()
    with pytest.raises(CommandError, match="1 of 3 path"):
        call_command(
            "import_skill", str(archive), str(bad), str(example_folders()[0]), stdout=io.StringIO(), stderr=err
        )
    assert "line 1" in err.getvalue()
    assert set(Skill.objects.values_list("name", flat=True)) == {"my-skill", "commit-message-style"}


def test_command_needs_a_path() -> None:
    with pytest.raises(CommandError, match="at least one path"):
        call_command("import_skill")
    with pytest.raises(CommandError):
        call_command("import_skill", "/nonexistent/skill", stderr=io.StringIO())


def test_command_records_the_user(world: World) -> None:
    call_command("import_skill", str(example_folders()[0]), "--user", "root", stdout=io.StringIO())
    assert SkillVersion.objects.get().imported_by == world.root

"""Builders for skill archives and catalog rows, used by the skills tests."""

from __future__ import annotations

import hashlib
import io
import stat
import tarfile
import warnings
import zipfile
from collections.abc import Iterable
from typing import Any

from console.services import SYSTEM, Actor
from skills.archives import Limits
from skills.models import Skill, SkillVersion
from skills.services import ImportResult, import_archive

REGULAR = stat.S_IFREG | 0o644
EXECUTABLE = stat.S_IFREG | 0o755


def skill_md(
    name: str = "my-skill",
    description: str = "Does a small thing. Use when testing the catalog.",
    *,
    extra: str = "license: MIT\n",
    body: str = "# My skill\n\nRun `scripts/run.sh`.\n",
) -> bytes:
    return f"---\nname: {name}\ndescription: {description}\n{extra}---\n\n{body}".encode()


def build_zip(entries: Iterable[tuple[str, bytes, int]], *, compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip of (name, data, st_mode) entries; st_mode carries the file type (S_IFLNK, ...)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are one of the attacks
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            info.external_attr = (mode & 0xFFFF) << 16
            info.compress_type = compression
            archive.writestr(info, data)
    return buffer.getvalue()


def skill_zip(files: dict[str, bytes] | None = None, *, top: str = "my-skill", name: str = "my-skill") -> bytes:
    """A .skill-shaped zip: one top-level folder holding SKILL.md and `files`."""
    entries = [(f"{top}/SKILL.md", skill_md(name), REGULAR)]
    entries += [(f"{top}/{path}", data, REGULAR) for path, data in (files or {}).items()]
    return build_zip(entries)


def build_tar(members: Iterable[tuple[tarfile.TarInfo, bytes | None]], *, compression: str = "gz") -> bytes:
    buffer = io.BytesIO()
    mode: Any = f"w:{compression}" if compression else "w"  # a Literal for the stubs
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                archive.addfile(info)
    return buffer.getvalue()


def tar_file(name: str, *, mode: int = 0o644, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.type = kind
    info.linkname = linkname
    return info


def import_bytes(
    data: bytes, filename: str = "my-skill.skill", *, actor: Actor = SYSTEM, limits: Limits | None = None
) -> ImportResult:
    return import_archive(io.BytesIO(data), filename, actor=actor, limits=limits)


def make_version(name: str, **fields: Any) -> SkillVersion:
    """A catalog row without files, for list-page tests."""
    skill = Skill.objects.create(name=name)
    values: dict[str, Any] = {
        "content_hash": hashlib.sha256(name.encode()).hexdigest(),
        "folder_name": name,
        "description": f"The {name} skill. Use when testing.",
        "size": 100,
        "file_count": 1,
    }
    values.update(fields)
    version = SkillVersion.objects.create(skill=skill, **values)
    skill.latest_version = version
    skill.save(update_fields=["latest_version"])
    return version

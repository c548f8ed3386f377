"""Skill import caps (skills/archives.py, docs/skills.md); overrides: CONSOLE_TUNING skills.*.

Official skills reach 83 files / 5.5 MB; the defaults sit well above."""

from __future__ import annotations

from dataclasses import dataclass

from console.tuning import room


@dataclass(frozen=True)
class SkillsTuning:
    archive_max_bytes: int = 20 * 1024 * 1024
    max_files: int = 1000
    max_uncompressed_bytes: int = 100 * 1024 * 1024
    max_compression_ratio: int = 100
    # git imports (skills/sources): a fetch or archive, and an update check (ls-remote).
    git_timeout_s: float = 120.0
    git_check_timeout_s: float = 15.0
    # How often every git source is checked for a newer commit (0: only on demand).
    git_check_interval_s: float = 6 * 3600.0


SKILLS = room("skills", SkillsTuning)

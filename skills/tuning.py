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


SKILLS = room("skills", SkillsTuning)

"""The migration that gives versions imported before reports existed their report, leaving
what they install unchanged."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from tests.support.skills import REGULAR, build_zip, import_bytes, skill_md

pytestmark = pytest.mark.django_db

migration = importlib.import_module("skills.migrations.0003_dependency_report")


def test_existing_versions_get_a_report_and_keep_their_plan() -> None:
    data = build_zip(
        [
            ("my-skill/SKILL.md", skill_md(body="# x\nThis needs pandoc.\n"), REGULAR),
            ("my-skill/requirements.txt", b"requests\n", REGULAR),
            ("my-skill/scripts/run.py", b"import yaml\nimport requests\n", REGULAR),
        ]
    )
    version = import_bytes(data).version
    plan = version.dependencies
    type(version).objects.filter(pk=version.pk).update(dependency_report={})
    migration.report_existing_versions(apps, None)
    version.refresh_from_db()
    assert [need["key"] for need in version.dependency_report["inferred"]] == ["debian:pandoc", "pip:pyyaml"]
    assert [need["key"] for need in version.dependency_report["declared"]] == ["pip:requests"]
    assert version.dependencies == plan
    assert version.dependency_report["declared_plan"] == plan

"""Confirming inferred needs into a version's install plan: the page lists them, a platform
admin confirms without editing the skill, the plan (`version.dependencies`, read by the install
plan) and `confirmed_needs`/`install_needs` change, one audit row per change."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.models import AuditAction, AuditEvent
from console.services import SYSTEM, ServiceError
from skills.install.plan import payload_for
from skills.models import SkillVersion
from skills.services import confirmed_needs, do_confirm_dependencies, install_needs
from tests.support.skills import REGULAR, build_zip, import_bytes

from .conftest import World

pytestmark = pytest.mark.django_db

PROSE_ONLY_MD = b"""---
name: pdf-tools
description: Fills and reads PDF forms. Use when a PDF needs filling or text extraction.
license: MIT
---

# PDF tools

## Requirements

This skill needs pypdf, pdfplumber and Pillow, and poppler-utils for rendering pages.

Run `python3 scripts/extract.py in.pdf`.
"""

NEEDS = ["debian:poppler-utils", "pip:pdfplumber", "pip:pillow", "pip:pypdf"]


def prose_only_skill(*, requirements: bytes | None = None) -> SkillVersion:
    entries = [
        ("pdf-tools/SKILL.md", PROSE_ONLY_MD, REGULAR),
        ("pdf-tools/scripts/extract.py", b"import sys\nprint(sys.argv)\n", REGULAR),
    ]
    if requirements is not None:
        entries.append(("pdf-tools/requirements.txt", requirements, REGULAR))
    return import_bytes(build_zip(entries), "pdf-tools.zip").version


def inferred_keys(version: SkillVersion) -> list[str]:
    return [need["key"] for need in version.dependency_report["inferred"]]


def test_prose_only_needs_are_listed_as_inferred_on_the_page(world: World) -> None:
    version = prose_only_skill()
    assert inferred_keys(version) == NEEDS
    assert version.dependencies == {"pip": [], "npm": [], "debian": []}, "nothing installs before a confirmation"
    admin_page = world.client_for("root").get(version.get_absolute_url()).content.decode()
    for key in NEEDS:
        assert f'name="need" value="{key}"' in admin_page
    assert "SKILL.md:11" in admin_page
    reader_page = world.client_for("bob").get(version.get_absolute_url()).content.decode()
    assert "pdfplumber" in reader_page
    assert 'name="need"' not in reader_page, "only platform admins confirm"


def test_admin_confirms_into_the_plan_the_install_reads(world: World) -> None:
    version = prose_only_skill(requirements=b"requests>=2\n")
    files_before = list(version.files.values_list("path", "sha256"))
    response = world.client_for("root").post(reverse("skills:version_dependencies", args=[version.id]), {"need": NEEDS})
    assert response.status_code == 302
    version.refresh_from_db()
    assert [dep["requirement"] for dep in version.dependencies["pip"]] == [
        "requests>=2",
        "pdfplumber",
        "pillow",
        "pypdf",
    ]
    assert version.dependencies["debian"] == ["poppler-utils"]
    assert version.dependencies["pip"][1]["source"].startswith("confirmed (named in prose (pdfplumber) at SKILL.md:11")
    assert version.confirmed_dependencies["keys"] == NEEDS
    assert version.confirmed_dependencies["by"] == "root"
    assert confirmed_needs(version).pip == ["pdfplumber", "pillow", "pypdf"]
    assert confirmed_needs(version).debian == ["poppler-utils"]
    assert install_needs(version).pip == ["requests>=2", "pdfplumber", "pillow", "pypdf"]
    payload = payload_for(version)
    assert payload.pip_requirements == ["requests>=2", "pdfplumber", "pillow", "pypdf"]
    assert payload.debian_packages == ["poppler-utils"]
    assert list(version.files.values_list("path", "sha256")) == files_before, "the skill is not edited"
    event = AuditEvent.objects.get(action=AuditAction.SKILL_CONFIRM_DEPENDENCIES)
    assert event.details["added"] == NEEDS
    assert event.target_id == str(version.id)
    page = world.client_for("root").get(version.get_absolute_url()).content.decode()
    assert "confirmed</span>" in page
    assert f'value="{NEEDS[0]}" id="need-1" aria-label="Confirm debian poppler-utils" checked' in page


def test_unconfirming_and_no_op(world: World) -> None:
    version = prose_only_skill()
    assert do_confirm_dependencies(version, NEEDS, actor=SYSTEM)
    assert not do_confirm_dependencies(version, list(reversed(NEEDS)), actor=SYSTEM), "same set: no change"
    assert do_confirm_dependencies(version, ["pip:pypdf"], actor=SYSTEM)
    version.refresh_from_db()
    assert install_needs(version).pip == ["pypdf"]
    assert install_needs(version).debian == []
    events = AuditEvent.objects.filter(action=AuditAction.SKILL_CONFIRM_DEPENDENCIES).order_by("time", "id")
    assert events.count() == 2
    last = events.last()
    assert last is not None
    assert last.details["removed"] == ["debian:poppler-utils", "pip:pdfplumber", "pip:pillow"]


def test_unknown_need_is_refused_and_nothing_changes(world: World) -> None:
    version = prose_only_skill()
    with pytest.raises(ServiceError) as caught:
        do_confirm_dependencies(version, ["pip:pypdf", "pip:evil @ https://x.test/e.whl"], actor=SYSTEM)
    assert "Not an inferred need of this version: pip:evil" in caught.value.message
    version.refresh_from_db()
    assert version.confirmed_dependencies == {}
    assert not AuditEvent.objects.filter(action=AuditAction.SKILL_CONFIRM_DEPENDENCIES).exists()
    response = world.client_for("root").post(
        reverse("skills:version_dependencies", args=[version.id]), {"need": ["debian:not-inferred"]}, follow=True
    )
    assert response.status_code == 200
    assert "Not an inferred need of this version: debian:not-inferred" in response.content.decode()


@pytest.mark.parametrize("persona", ["alice", "bob", "carol", "charlie"])
def test_only_platform_admins_confirm(world: World, persona: str) -> None:
    version = prose_only_skill()
    response = world.client_for(persona).post(
        reverse("skills:version_dependencies", args=[version.id]), {"need": NEEDS}
    )
    assert response.status_code == 403
    version.refresh_from_db()
    assert version.confirmed_dependencies == {}


def test_reimporting_the_same_content_keeps_the_plan() -> None:
    version = prose_only_skill()
    do_confirm_dependencies(version, NEEDS, actor=SYSTEM)
    again = prose_only_skill()
    assert again.pk == version.pk
    assert install_needs(again).debian == ["poppler-utils"]

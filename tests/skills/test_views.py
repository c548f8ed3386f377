"""Pages: who may browse, import and delete; sanitised SKILL.md; file views; list search,
pagination, HTMX partial and query bound."""

from __future__ import annotations

import random
import string
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from console.models import AuditEvent
from console.services import SYSTEM
from skills.models import Skill, SkillFile, SkillVersion
from tests.support.skills import REGULAR, build_zip, import_bytes, make_version, skill_md, skill_zip
from tests.support.tuning import Tuned

from .conftest import World

pytestmark = pytest.mark.django_db

PERSONAS = ["alice", "bob", "carol", "charlie", "root"]
NON_PLATFORM_ADMINS = ["alice", "bob", "carol", "charlie"]


def imported(files: dict[str, bytes] | None = None, **kwargs: Any) -> SkillVersion:
    return import_bytes(skill_zip(files or {"scripts/run.sh": b"#!/bin/sh\necho <b>hi</b>\n"}), **kwargs).version


def read_urls(version: SkillVersion) -> dict[str, str]:
    skill_file = SkillFile.objects.filter(version=version).exclude(path="SKILL.md").first()
    assert skill_file is not None
    return {
        "list": reverse("skills:skill_list"),
        "skill": version.skill.get_absolute_url(),
        "version": version.get_absolute_url(),
        "file": skill_file.get_absolute_url(),
    }


def upload(client: Client, data: bytes, name: str = "my-skill.skill") -> Any:
    return client.post(reverse("skills:skill_import"), {"archive": SimpleUploadedFile(name, data)})


# --- Access ------------------------------------------------------------------------------


@pytest.mark.parametrize("page", ["list", "skill", "version", "file"])
def test_anonymous_is_sent_to_login(world: World, page: str) -> None:
    response = Client().get(read_urls(imported())[page])
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_anonymous_cannot_import_or_delete(world: World) -> None:
    assert Client().get(reverse("skills:skill_import")).status_code == 302
    response = upload(Client(), skill_zip())
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    assert Skill.objects.count() == 0
    version = imported()
    delete_url = reverse("skills:version_delete", args=[version.id])
    assert Client().get(delete_url)["Location"].startswith(reverse("login"))
    assert Client().post(delete_url)["Location"].startswith(reverse("login"))
    assert SkillVersion.objects.filter(pk=version.pk).exists()


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("page", ["list", "skill", "version", "file"])
def test_everyone_signed_in_browses_the_catalog(world: World, persona: str, page: str) -> None:
    version = imported()
    response = world.client_for(persona).get(read_urls(version)[page])
    assert response.status_code == 200
    assert "my-skill" in response.content.decode()


@pytest.mark.parametrize("persona", NON_PLATFORM_ADMINS)
def test_only_platform_admins_import(world: World, persona: str) -> None:
    client = world.client_for(persona)
    assert client.get(reverse("skills:skill_import")).status_code == 403
    assert upload(client, skill_zip()).status_code == 403
    assert Skill.objects.count() == 0
    assert AuditEvent.objects.count() == 0


@pytest.mark.parametrize("persona", NON_PLATFORM_ADMINS)
def test_only_platform_admins_delete(world: World, persona: str) -> None:
    version = imported()
    before = AuditEvent.objects.count()
    url = reverse("skills:version_delete", args=[version.id])
    client = world.client_for(persona)
    assert client.get(url).status_code == 403
    assert client.post(url).status_code == 403
    assert SkillVersion.objects.filter(pk=version.pk).exists()
    assert AuditEvent.objects.count() == before


def test_import_and_delete_links_only_for_platform_admins(world: World) -> None:
    version = imported()
    for persona, expected in [("bob", False), ("root", True)]:
        client = world.client_for(persona)
        assert (reverse("skills:skill_import") in client.get(reverse("skills:skill_list")).content.decode()) is expected
        page = client.get(version.get_absolute_url()).content.decode()
        assert (reverse("skills:version_delete", args=[version.id]) in page) is expected


def test_posts_need_csrf(world: World) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.root)
    assert upload(client, skill_zip()).status_code == 403
    version = imported()
    assert client.post(reverse("skills:version_delete", args=[version.id])).status_code == 403
    assert SkillVersion.objects.count() == 1


def test_unknown_ids_are_404(world: World) -> None:
    client = world.client_for("bob")
    missing = "00000000-0000-0000-0000-000000000000"
    assert client.get(reverse("skills:skill_detail", args=[missing])).status_code == 404
    assert client.get(reverse("skills:version_detail", args=[missing])).status_code == 404
    assert client.get(reverse("skills:file_detail", args=[missing])).status_code == 404
    assert client.get("/skills/not-a-uuid/").status_code == 404


# --- Import and delete through the pages -------------------------------------------------


def test_platform_admin_uploads_a_skill(world: World) -> None:
    client = world.client_for("root")
    assert client.get(reverse("skills:skill_import")).status_code == 200
    response = upload(client, skill_zip({"a.txt": b"a"}))
    version = SkillVersion.objects.get()
    assert response.status_code == 302
    assert response["Location"] == version.get_absolute_url()
    assert AuditEvent.objects.filter(action="skill.import").count() == 1
    page = client.get(response["Location"]).content.decode()
    assert "Skill my-skill imported" in page

    again = upload(client, skill_zip({"a.txt": b"a"}))
    assert again.status_code == 302
    assert "nothing changed" in client.get(again["Location"]).content.decode()
    assert AuditEvent.objects.count() == 1


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (build_zip([("s/SKILL.md", skill_md("s"), REGULAR), ("../evil", b"x", REGULAR)]), "leaves the skill"),
        (build_zip([("s/SKILL.md", b"---\nname: [\n---\n", REGULAR)]), "line 2"),
        (build_zip([("s/SKILL.md", skill_md("s", body="# x\n\x00\n"), REGULAR)]), "line 8: SKILL.md holds a NUL"),
        (b"not an archive at all", "not a zip, .skill or tar archive"),
        (b"", "The submitted file is empty"),
    ],
)
def test_refused_uploads_show_the_reason(world: World, data: bytes, fragment: str) -> None:
    response = upload(world.client_for("root"), data)
    assert response.status_code == 400
    assert fragment in response.content.decode()
    assert SkillVersion.objects.count() == 0


def test_oversized_upload_is_cut_off(tuned: Tuned, world: World, settings: Any) -> None:
    tuned({"skills.archive_max_bytes": 1000})
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 100
    data = skill_zip({"big.bin": random.Random(2).randbytes(5000)})
    response = upload(world.client_for("root"), data)
    assert response.status_code == 400
    assert "over the limit of 1000 bytes (skills.archive_max_bytes)" in response.content.decode()
    assert SkillVersion.objects.count() == 0


def test_delete_confirmation_then_delete(world: World) -> None:
    first = imported({"a.txt": b"1"})
    second = imported({"a.txt": b"2"})
    client = world.client_for("root")
    url = reverse("skills:version_delete", args=[second.id])
    page = client.get(url).content.decode()
    assert "It is the latest version" in page
    response = client.post(url)
    assert response.status_code == 302
    assert response["Location"] == first.skill.get_absolute_url()
    last = client.post(reverse("skills:version_delete", args=[first.id]))
    assert last["Location"] == reverse("skills:skill_list")
    assert Skill.objects.count() == 0
    assert AuditEvent.objects.filter(action="skill.delete_version").count() == 2


# --- The skill page ----------------------------------------------------------------------

HOSTILE_BODY = (
    "# Title\n\n<script>alert('x')</script>\n\n<img src=x onerror=alert(1)>\n\n"
    '[click](javascript:alert(1)) and <a href="javascript:alert(2)">raw</a>\n\n'
    "| a | b |\n|---|---|\n| 1 | 2 |\n"
)


def test_skill_md_is_rendered_and_sanitised(world: World) -> None:
    data = build_zip([("my-skill/SKILL.md", skill_md(body=HOSTILE_BODY), REGULAR)])
    version = import_bytes(data).version
    page = world.client_for("bob").get(version.get_absolute_url()).content.decode()
    assert "<h1>Title</h1>" in page
    assert "<table>" in page
    assert "<script>alert" not in page
    assert "onerror=" not in page.replace("onerror=alert(1)&gt;", "")
    assert "<img" not in page
    assert '<a href="javascript:' not in page


def test_skill_page_shows_files_versions_warnings_and_dependencies(world: World) -> None:
    data = build_zip(
        [
            (
                "folder/SKILL.md",
                skill_md("other", extra="metadata:\n  debian-packages: jq poppler-utils\n"),
                REGULAR,
            ),
            ("folder/scripts/run.py", b"#!/usr/bin/env python3\n", 0o100755),
            ("folder/scripts/requirements.txt", b"pandas>=2\n", REGULAR),
            ("folder/package.json", b'{"dependencies": {"left-pad": "^1.3.0"}}', REGULAR),
            ("folder/assets/logo.png", b"\x89PNG\r\n\x1a\n\x00\x00", REGULAR),
        ]
    )
    version = import_bytes(data).version
    older = imported()
    assert older.skill_id != version.skill_id
    page = world.client_for("carol").get(version.skill.get_absolute_url()).content.decode()
    assert "-rwxr-xr-x" in page
    assert "-rw-r--r--" in page
    assert "scripts/run.py" in page
    assert "(binary)" in page
    assert "differs from its folder" in page
    assert "No &#x27;license&#x27;" in page
    assert "pandas&gt;=2" in page
    assert "left-pad@^1.3.0" in page
    assert "poppler-utils" in page
    assert version.short_hash in page
    assert "Install into a space…" in page


def test_older_version_page_says_so(world: World) -> None:
    first = imported({"a.txt": b"1"})
    imported({"a.txt": b"2"})
    page = world.client_for("bob").get(first.get_absolute_url()).content.decode()
    assert "This is an older version" in page


def test_text_file_is_escaped_and_binary_is_not_shown(world: World) -> None:
    version = imported({"run.sh": b"echo <script>x</script>\n", "blob.bin": b"\x00\x01\xff"})
    client = world.client_for("bob")
    text_file = SkillFile.objects.get(version=version, path="run.sh")
    page = client.get(text_file.get_absolute_url()).content.decode()
    assert "echo &lt;script&gt;x&lt;/script&gt;" in page
    assert "<script>x" not in page
    binary = SkillFile.objects.get(version=version, path="blob.bin")
    assert "A binary file" in client.get(binary.get_absolute_url()).content.decode()
    download = client.get(binary.get_absolute_url() + "?download=1")
    assert download["Content-Type"] == "application/octet-stream"
    assert download["Content-Disposition"] == 'attachment; filename="blob.bin"'
    assert download.content == b"\x00\x01\xff"


@pytest.mark.parametrize(
    ("name", "header"),
    [
        # A row imported before names were checked: the page and its download still answer.
        ("notes\r\nSet-Cookie: x=1.md", 'attachment; filename="notes\\\\r\\\\nSet-Cookie: x=1.md"'),
        ("run\u202egnp.sh", 'attachment; filename="run\\\\u202egnp.sh"'),
        ("caf\u00e9.md", "attachment; filename*=utf-8''caf%C3%A9.md"),
    ],
)
def test_a_file_of_any_stored_name_is_shown_and_downloaded(world: World, name: str, header: str) -> None:
    version = make_version("legacy-skill")
    stored = SkillFile.objects.create(
        version=version, path=f"scripts/{name}", mode=0o644, size=1, sha256="0" * 64, content=b"x"
    )
    client = world.client_for("bob")
    assert client.get(stored.get_absolute_url()).status_code == 200
    download = client.get(stored.get_absolute_url() + "?download=1")
    assert download.status_code == 200
    assert download["Content-Disposition"] == header
    assert download.content == b"x"


# --- The list ----------------------------------------------------------------------------


def test_list_shows_the_columns(world: World) -> None:
    version = imported()
    page = world.client_for("bob").get(reverse("skills:skill_list")).content.decode()
    assert version.short_hash in page
    assert "Does a small thing" in page
    assert "—" in page  # no space holds the skill yet


def test_list_search_pagination_and_htmx_partial(world: World) -> None:
    for i in range(30):
        make_version(f"skill-{i:02d}")
    make_version("pdf-tools", description="Fill PDF forms. Use when a form arrives.")
    client = world.client_for("carol")
    url = reverse("skills:skill_list")
    first = client.get(url).content.decode()
    assert "Page 1 of 2" in first
    assert "pdf-tools" in first
    assert "skill-00" in first
    assert "skill-29" not in first
    second = client.get(url, {"page": 2}).content.decode()
    assert "skill-29" in second
    assert "pdf-tools" not in second
    found = client.get(url, {"q": "PDF forms"}).content.decode()
    assert "pdf-tools" in found
    assert "skill-00" not in found
    assert "No skill matches" in client.get(url, {"q": "nothing-like-this"}).content.decode()
    partial = client.get(url, {"q": "skill-1"}, headers={"HX-Request": "true", "HX-Target": "skill-results"})
    body = partial.content.decode()
    assert "<html" not in body
    assert "skill-15" in body
    assert "pdf-tools" not in body
    assert client.get(url, {"page": "junk"}).status_code == 200


def test_list_queries_are_bounded(world: World, django_assert_max_num_queries: Any) -> None:
    for i in range(200):
        make_version(f"bulk-{i:03d}", warning_count=i % 3)
    client = world.client_for("bob")
    with django_assert_max_num_queries(6):
        response = client.get(reverse("skills:skill_list"), {"page": 3})
    assert response.status_code == 200
    assert "bulk-050" in response.content.decode()


def test_system_import_shows_as_system(world: World) -> None:
    version = import_bytes(skill_zip(), actor=SYSTEM).version
    assert "by system" in world.client_for("bob").get(version.get_absolute_url()).content.decode()


def test_upload_streamed_to_a_temporary_file_imports(world: World, settings: Any) -> None:
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 100  # forces TemporaryUploadedFile
    data = skill_zip({"noise.bin": random.Random(3).randbytes(5000)})
    response = upload(world.client_for("root"), data)
    assert response.status_code == 302
    version = SkillVersion.objects.get()
    assert SkillFile.objects.get(version=version, path="noise.bin").size == 5000


def test_large_text_file_preview_is_cut(world: World) -> None:
    text = "".join(random.Random(4).choices(string.ascii_letters, k=600 * 1024)) + "0123456789"
    version = imported({"big.txt": text.encode()})
    page = world.client_for("bob").get(SkillFile.objects.get(version=version, path="big.txt").get_absolute_url())
    body = page.content.decode()
    assert "Only the first 512 KiB are shown" in body
    assert "0123456789" not in body


@pytest.mark.django_db
def test_importing_the_bundled_examples_is_a_platform_admins_post_with_csrf(world: World) -> None:
    from django.test import Client

    from skills.models import Skill

    url = reverse("skills:skill_import_examples")
    alice = world.client_for("alice")  # a space admin, not a platform admin
    assert alice.post(url).status_code == 403
    assert world.client_for("root").get(url).status_code == 405
    assert not Skill.objects.exists()
    forged = Client(enforce_csrf_checks=True)
    forged.force_login(world.root)
    assert forged.post(url).status_code == 403  # a cross-site form without the CSRF token
    assert not Skill.objects.exists()

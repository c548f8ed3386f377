"""The session page's file manager against a real Docker sandbox: browse, preview (text
escaped, images with a safe type, SVG never rendered), upload into any writable folder, make a
folder, rename, delete with a confirmation; and every way out of /workspace refused (`..`,
absolute paths, links the session user planted), with /etc unchanged. Members act; viewers,
outsiders and posts without the CSRF token do not.
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from console.models import AuditEvent
from console.services import SYSTEM
from sandboxes.backends.base import ExecRequest
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from tests.personas import World

pytestmark = [pytest.mark.django_db, pytest.mark.docker]

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c6360f8cf"
    "c0f01f0005000201e2c2a3c90000000049454e44ae426082"
)


class Sandbox:
    def __init__(self, session: Session, sandbox_id: str) -> None:
        self.session, self.sandbox_id = session, sandbox_id

    def run(self, line: str, user: str = "user") -> str:
        result = get_backend(self.session.config).exec(
            self.sandbox_id, ExecRequest(shell=line, user=user, timeout_s=60)
        )
        assert result.exit_code == 0, result
        return result.stdout.decode()

    def etc(self) -> str:
        return hashlib.sha256(
            self.run("find /etc /root -xdev -printf '%p %s %T@\\n' | sort", "root").encode()
        ).hexdigest()


@pytest.fixture
def sandbox(world: World, session_config: SandboxConfig) -> Sandbox:
    resolved = Runtime().resolve(world.space_a, "files", actor=SYSTEM)
    box = Sandbox(resolved.session, resolved.sandbox.sandbox_id)
    box.run(
        "cd /workspace && mkdir -p docs/deep && printf 'hello <b>&amp;</b>\\n' > docs/note.txt"
        " && printf x > docs/deep/leaf.txt"
        " && ln -s /etc etclink && ln -s /etc/passwd pwlink && ln -s ../.. docs/up"
        " && printf '<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(1)</script></svg>' > pic.svg"
    )
    return box


def url(name: str, session: Session, **query: str) -> str:
    found = reverse(f"sandboxes:{name}", args=[session.id])
    return f"{found}?{urlencode(query)}" if query else found


def said(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_browse_preview_upload_mkdir_rename_and_delete(world: World, sandbox: Sandbox) -> None:
    session, alice = sandbox.session, world.client_for("alice")
    page = alice.get(session.get_absolute_url(), {"browse": "1", "path": "docs"}).content.decode()
    assert 'data-name="note.txt"' in page
    assert 'data-name="deep"' in page
    assert "/workspace</a>/<a" in page  # the path's crumbs
    # Text preview: escaped.
    preview = alice.get(url("file_preview", session, path="docs/note.txt")).content.decode()
    assert "hello &lt;b&gt;&amp;amp;&lt;/b&gt;" in preview
    assert "<b>&amp;</b>" not in preview
    # SVG: shown as escaped text, never an image or a page.
    svg = alice.get(url("file_preview", session, path="pic.svg")).content.decode()
    assert 'id="preview-text"' in svg
    assert "&lt;script&gt;" in svg
    assert "<script>alert" not in svg
    raw_svg = alice.get(url("file_raw", session, path="pic.svg"))
    assert raw_svg["Content-Type"] == "application/octet-stream"
    assert raw_svg["Content-Disposition"].startswith("attachment")
    assert raw_svg["X-Content-Type-Options"] == "nosniff"
    # Upload anywhere writable, here a PNG into docs/deep, then its preview and raw bytes.
    upload = alice.post(
        url("file_upload", session), {"folder": "docs/deep", "file": SimpleUploadedFile("dot.png", PNG)}
    )
    assert upload.status_code == 302
    assert sandbox.run("stat -c '%u %s' /workspace/docs/deep/dot.png") == f"1000 {len(PNG)}\n"
    assert 'id="preview-image"' in alice.get(url("file_preview", session, path="docs/deep/dot.png")).content.decode()
    raw = alice.get(url("file_raw", session, path="docs/deep/dot.png"))
    assert raw["Content-Type"] == "image/png"
    assert raw["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in raw["Content-Security-Policy"]
    assert raw.content == PNG
    # Make a folder, rename into it is refused (a name, not a path), rename in place works.
    assert alice.post(url("file_mkdir", session), {"folder": "docs", "name": "made"}).status_code == 302
    assert sandbox.run("test -d /workspace/docs/made && stat -c %u /workspace/docs/made") == "1000\n"
    moved = alice.post(url("file_rename", session), {"path": "docs/note.txt", "name": "made/note.txt"})
    assert "plain name" in " ".join(said(moved))
    renamed = alice.post(url("file_rename", session), {"path": "docs/note.txt", "name": "renamed.txt"})
    assert "Renamed" in " ".join(said(renamed))
    assert sandbox.run("ls /workspace/docs") == "deep\nmade\nrenamed.txt\nup\n"
    taken = alice.post(url("file_rename", session), {"path": "docs/renamed.txt", "name": "made"})
    assert "already exists" in " ".join(said(taken))
    # Delete: a confirmation first, then the folder with what it holds.
    confirm = alice.get(url("file_delete", session, path="docs/deep"))
    assert confirm.status_code == 200
    assert "/workspace/docs/deep" in confirm.content.decode()
    assert sandbox.run("test -d /workspace/docs/deep && echo kept") == "kept\n"
    gone = alice.post(url("file_delete", session), {"path": "docs/deep"})
    assert gone.status_code == 302
    assert sandbox.run("ls /workspace/docs") == "made\nrenamed.txt\nup\n"
    ops = [e.details.get("op") for e in AuditEvent.objects.filter(action="session.file_write").order_by("time")]
    assert ops == ["write", "mkdir", "rename", "delete"]


@pytest.mark.parametrize(
    ("view", "data"),
    [
        ("file_upload", {"folder": "../etc"}),
        ("file_upload", {"folder": "/etc"}),
        ("file_upload", {"folder": "etclink"}),
        ("file_upload", {"folder": "docs/up/etc"}),
        ("file_mkdir", {"folder": "etclink", "name": "x"}),
        ("file_mkdir", {"folder": "", "name": ".."}),
        ("file_mkdir", {"folder": "../..", "name": "tmp"}),
        ("file_rename", {"path": "../etc/passwd", "name": "p"}),
        ("file_rename", {"path": "etclink/passwd", "name": "p"}),
        ("file_rename", {"path": "docs/note.txt", "name": "../../../tmp/x"}),
        ("file_rename", {"path": "input", "name": "mine"}),
        ("file_delete", {"path": "../etc/passwd"}),
        ("file_delete", {"path": "/etc/passwd"}),
        ("file_delete", {"path": "etclink/passwd"}),
        ("file_delete", {"path": "docs/up/etc/hostname"}),
        ("file_delete", {"path": ""}),
        ("file_delete", {"path": "output"}),
        ("file_delete", {"path": "input/"}),
    ],
)
def test_every_way_out_of_the_workspace_is_refused(world: World, sandbox: Sandbox, view: str, data: Any) -> None:
    before = sandbox.etc()
    tree = sandbox.run("find /workspace -printf '%p %s\\n' | sort")
    if view == "file_upload":
        data = {**data, "file": SimpleUploadedFile("planted", b"planted")}
    answer = world.client_for("alice").post(url(view, sandbox.session), data)
    assert answer.status_code == 302  # back to the browser, with the refusal said
    messages = said(answer)
    assert messages
    assert not any(m.startswith(("Uploaded", "Made", "Renamed", "Deleted")) for m in messages), messages
    assert sandbox.etc() == before
    assert sandbox.run("find /workspace -printf '%p %s\\n' | sort") == tree


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "etclink/passwd", "pwlink", "docs/up/etc/passwd"])
def test_previews_never_leave_the_workspace(world: World, sandbox: Sandbox, path: str) -> None:
    alice = world.client_for("alice")
    preview = alice.get(url("file_preview", sandbox.session, path=path)).content.decode()
    assert 'id="preview-error"' in preview
    assert "root:x:0" not in preview
    raw = alice.get(url("file_raw", sandbox.session, path=path))
    assert raw.status_code == 404
    assert b"root:x:0" not in raw.content


def test_deleting_a_link_removes_the_link_not_its_target(world: World, sandbox: Sandbox) -> None:
    before = sandbox.etc()
    answer = world.client_for("alice").post(url("file_delete", sandbox.session), {"path": "etclink"})
    assert "Deleted /workspace/etclink." in said(answer)
    assert sandbox.run("test ! -e /workspace/etclink && test -f /etc/passwd && echo ok") == "ok\n"
    assert sandbox.etc() == before


@pytest.mark.parametrize(("persona", "status"), [("carol", 403), ("charlie", 404)])
def test_viewers_and_outsiders_do_not_touch_files(world: World, sandbox: Sandbox, persona: str, status: int) -> None:
    client = world.client_for(persona)
    session = sandbox.session
    assert client.get(url("file_preview", session, path="docs/note.txt")).status_code == status
    assert client.get(url("file_raw", session, path="docs/note.txt")).status_code == status
    assert client.post(url("file_delete", session), {"path": "docs/note.txt"}).status_code == status
    assert client.post(url("file_mkdir", session), {"folder": "", "name": "x"}).status_code == status
    assert client.post(url("file_rename", session), {"path": "docs/note.txt", "name": "y"}).status_code == status
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(world.alice)
    assert strict.post(url("file_delete", session), {"path": "docs/note.txt"}).status_code == 403
    assert sandbox.run("ls /workspace/docs") == "deep\nnote.txt\nup\n"


def test_a_file_of_any_name_the_session_user_gives_downloads(world: World, sandbox: Sandbox) -> None:
    """A newline in a name (no header may hold one) and a quote or bidi override (which would
    end or turn the quoted name): the download answers, the name escaped and quoted."""
    sandbox.run("cd /workspace && printf x > \"$(printf 'a\\r\\nb.txt')\"")
    sandbox.run('cd /workspace && printf y > "$(printf \'q\\"\\342\\200\\256x.png\')"')
    alice = world.client_for("alice")
    for view in ("file_raw", "session_download"):
        forged = alice.get(url(view, sandbox.session, path="a\r\nb.txt"))
        assert forged.status_code == 200
        assert forged["Content-Disposition"] == 'attachment; filename="a\\\\r\\\\nb.txt"'
        assert forged.content == b"x"
    raw = alice.get(url("file_raw", sandbox.session, path='q"\u202ex.png'))
    assert raw["Content-Disposition"] == 'inline; filename="q\\"\\\\u202ex.png"'
    assert raw.content == b"y"

"""unix:// endpoints: only socket files, at save and when the adapter connects; and one such
bad backend marks only itself unavailable.

The backend form used to save any unix:// path (unix:///etc/passwd), and one such backend made
the whole console "unavailable" on /readyz.
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from console import health
from sandboxes.backends.base import ErrorKind, RemoteError
from sandboxes.backends.unix_socket import check_unix_socket, unix_socket_problem
from sandboxes.catalog.bridge import get_backend
from sandboxes.catalog.health import check_name
from sandboxes.models import PlatformBackend
from tests.factories import make_backend, make_space
from tests.personas import World
from tests.sandboxes.catalog.test_platform_backends import backend_form
from tests.support.tuning import Tuned

TOKEN = "unix-readyz-token-9a8b7c"


@pytest.fixture
def socket_file() -> Iterator[str]:
    """A listening unix socket of the test's own (nothing answers on it)."""
    folder = tempfile.mkdtemp(prefix="unix-endpoint-")
    path = str(Path(folder) / "engine.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    try:
        yield path
    finally:
        server.close()
        Path(path).unlink(missing_ok=True)
        Path(folder).rmdir()


@pytest.mark.parametrize(
    ("endpoint", "words"),
    [
        ("unix:///etc/passwd", "/etc/passwd is a regular file, not a socket"),
        ("unix:///etc", "/etc is a folder, not a socket"),
        ("unix:///dev/null", "/dev/null is a character device, not a socket"),
        ("unix:///no/such/engine.sock", "does not exist"),
        ("unix://", "names a socket file"),
    ],
)
def test_anything_but_a_socket_file_is_refused(endpoint: str, words: str) -> None:
    problem = unix_socket_problem(endpoint)
    assert problem is not None
    assert words in problem
    with pytest.raises(RemoteError) as refused:
        check_unix_socket(endpoint)
    # Nothing there: an engine that is not running (it may come back); anything else will not.
    missing = endpoint.endswith("engine.sock")
    assert refused.value.kind == (ErrorKind.UNAVAILABLE if missing else ErrorKind.INVALID)


def test_a_socket_file_is_accepted(socket_file: str) -> None:
    assert unix_socket_problem(f"unix://{socket_file}") is None
    assert unix_socket_problem("unix:///var/run/docker.sock") is None


@pytest.mark.django_db
def test_the_backend_form_refuses_a_unix_path_that_is_not_a_socket(world: World, socket_file: str) -> None:
    root = world.client_for("root")
    url = reverse("sandboxes:backend_create")
    for endpoint in ("unix:///etc/passwd", "unix:///etc", "unix:///no/such.sock"):
        response = root.post(url, backend_form(name="bad", endpoint=endpoint))
        assert response.status_code == 400, endpoint
        assert "not a socket" in str(response.context["form"].errors["endpoint"]) or "does not exist" in str(
            response.context["form"].errors["endpoint"]
        )
    assert not PlatformBackend.objects.filter(name="bad").exists()
    saved = root.post(url, backend_form(name="good", endpoint=f"unix://{socket_file}"))
    assert saved.status_code == 302, saved.content
    assert PlatformBackend.objects.get(name="good").endpoint == f"unix://{socket_file}"


@pytest.mark.django_db
def test_the_docker_adapter_refuses_to_dial_a_file_that_is_not_a_socket() -> None:
    # Saved before the form checked (or the file changed since): the adapter checks again.
    row = make_backend(make_space(), endpoint="unix:///etc/passwd")
    backend = get_backend(row)
    try:
        with pytest.raises(RemoteError) as refused:
            backend.get("0123456789ab")
        assert refused.value.kind == ErrorKind.INVALID
        assert "/etc/passwd is a regular file" in refused.value.message
        health_info = backend.health()
        assert health_info.ok is False
        assert "not a socket" in health_info.detail
    finally:
        backend.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_one_bad_backend_marks_only_itself_unavailable(tuned: Tuned, settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    tuned({"readyz.cache_s": 0})
    space = make_space()
    good = make_backend(space, name="local engine")
    bad = make_backend(space, name="not a socket", endpoint="unix:///etc/passwd")
    health.forget_readiness()
    try:
        assert Client().get("/readyz").json() == {"status": "ok"}
        answer = Client().get("/readyz", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    finally:
        health.forget_readiness()
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["status"] == "ok"
    assert body["failing"] == []
    assert body["checks"][check_name(bad)] == {**body["checks"][check_name(bad)], "ok": False, "error": "invalid"}
    assert body["checks"][check_name(bad)]["required"] is False
    assert body["checks"][check_name(good)]["ok"] is True

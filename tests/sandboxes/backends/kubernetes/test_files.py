"""The Kubernetes backend's files, through exec on the fake cluster's pod: round trips of
binary content and odd names, metadata, limits and refusals."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from sandboxes.backends.base import ErrorKind, ExecRequest, RemoteError
from sandboxes.backends.kubernetes.exec import PodExec
from sandboxes.backends.kubernetes.files import KubernetesFiles
from tests.support import kube_pods

pytestmark = pytest.mark.docker

ODD_NAMES = ("two words.txt", "tab\there", "new\nline", 'it\'s "quoted"', "$HOME", "-rf", "ünïcødé ✓", "a\\b")


pod = kube_pods.pod
pods = kube_pods.pods


@pytest.fixture
def files(pods: PodExec) -> Iterator[KubernetesFiles]:
    yield KubernetesFiles(pods.exec)
    pods.exec("sbx", ExecRequest(argv=("rm", "-rf", "/workspace/t"), user="root"))


def test_binary_round_trip_mode_and_owner(files: KubernetesFiles, pods: PodExec) -> None:
    data = bytes(range(256)) * 4096 + os.urandom(1_000_000)
    written = files.write("sbx", "/workspace/t/deep/er/blob.bin", data, mode=0o640)
    assert (written.size, written.mode, written.name) == (len(data), 0o640, "blob.bin")
    assert files.read("sbx", "/workspace/t/deep/er/blob.bin") == data
    assert files.read("sbx", "/workspace/t/deep/er/blob.bin", max_bytes=300) == data[:300]
    info = files.stat("sbx", "/workspace/t/./deep/er/blob.bin/")
    assert (info.path, info.size, info.mode, info.is_dir) == ("/workspace/t/deep/er/blob.bin", len(data), 0o640, False)
    owner = pods.exec("sbx", ExecRequest(argv=("stat", "-c", "%u", "/workspace/t/deep/er/blob.bin")))
    assert owner.stdout.strip() == b"1000"
    files.write("sbx", "/workspace/t/empty", b"")
    assert files.read("sbx", "/workspace/t/empty") == b""
    assert files.stat("sbx", "/workspace/t/empty").mode == 0o644


def test_odd_names_round_trip_and_list(files: KubernetesFiles) -> None:
    for index, name in enumerate(ODD_NAMES):
        files.write("sbx", f"/workspace/t/{name}", f"content {index}".encode())
    files.make_dir("sbx", "/workspace/t/sub dir/inner")
    listed = files.list("sbx", "/workspace/t")
    assert [entry.name for entry in listed] == sorted([*ODD_NAMES, "sub dir"])
    by_name = {entry.name: entry for entry in listed}
    assert by_name["sub dir"].is_dir
    assert not by_name["-rf"].is_dir
    for index, name in enumerate(ODD_NAMES):
        assert by_name[name].path == f"/workspace/t/{name}"
        assert files.read("sbx", f"/workspace/t/{name}") == f"content {index}".encode()
    files.remove("sbx", "/workspace/t/-rf")
    assert "-rf" not in {entry.name for entry in files.list("sbx", "/workspace/t")}


def test_links_and_trees(files: KubernetesFiles, pods: PodExec) -> None:
    files.make_dir("sbx", "/workspace/t/tree/a/b")
    files.write("sbx", "/workspace/t/tree/a/b/f", b"x")
    pods.exec("sbx", ExecRequest(argv=("ln", "-s", "/etc", "/workspace/t/tree/link")))
    entries = {entry.name: entry for entry in files.list("sbx", "/workspace/t/tree")}
    assert entries["link"].is_symlink
    assert not entries["link"].is_dir
    files.remove("sbx", "/workspace/t/tree")
    with pytest.raises(RemoteError) as gone:
        files.stat("sbx", "/workspace/t/tree")
    assert gone.value.kind == ErrorKind.NOT_FOUND


def test_refusals_say_what_is_wrong(files: KubernetesFiles) -> None:
    files.write("sbx", "/workspace/t/file", b"1")
    cases = [
        (lambda: files.read("sbx", "/workspace/t/missing"), ErrorKind.NOT_FOUND),
        (lambda: files.read("sbx", "/workspace/t"), ErrorKind.INVALID),
        (lambda: files.list("sbx", "/workspace/t/file"), ErrorKind.INVALID),
        (lambda: files.list("sbx", "/workspace/t/missing"), ErrorKind.NOT_FOUND),
        (lambda: files.remove("sbx", "/workspace/t/missing"), ErrorKind.NOT_FOUND),
        (lambda: files.read("sbx", "workspace/t/file"), ErrorKind.INVALID),
        (lambda: files.write("sbx", "/", b""), ErrorKind.INVALID),
        (lambda: files.remove("sbx", "/"), ErrorKind.INVALID),
        (lambda: files.write("sbx", "/workspace/t/nul\x00", b""), ErrorKind.INVALID),
        # Writes run as the session user: the system's files are not theirs.
        (lambda: files.write("sbx", "/etc/console-test", b""), ErrorKind.FORBIDDEN),
        (lambda: files.make_dir("sbx", "/etc/console-test"), ErrorKind.FORBIDDEN),
    ]
    for call, kind in cases:
        with pytest.raises(RemoteError) as refused:
            call()
        assert refused.value.kind == kind, refused.value
    files.write("sbx", "/etc/console-test", b"root may", user="root")
    assert files.read("sbx", "/etc/console-test") == b"root may"
    files.remove("sbx", "/etc/console-test")

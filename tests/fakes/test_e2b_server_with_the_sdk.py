"""The unmodified e2b SDK (2.63) against the fake E2B/Cube server (tests/fakes/).

These tests prove the fake is faithful enough for the adapters' tests: every call below is a
public SDK call, pointed at the fake only through ConnectionConfig options. Sandboxes are
shared per module where a test does not need a fresh one, to keep the suite fast.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    BuildException,
    CommandExitException,
    FilesystemEvent,
    NotFoundException,
    PtySize,
    RateLimitException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
    ServiceBusyException,
    Template,
    TimeoutException,
    Volume,
    VolumeException,
)

from tests.fakes.e2b_server import FakeServer
from tests.fakes.fake_runtime import DEFAULT_IMAGE
from tests.fakes.fixtures import FakeHandle

pytestmark = [pytest.mark.docker, pytest.mark.e2b]

ALL_BYTES = bytes(range(256)) * 64


@pytest.fixture(scope="module")
def sbx(fake_e2b_server: FakeHandle) -> Iterator[Sandbox]:
    """One sandbox shared by the read-mostly E2B tests."""
    sandbox = Sandbox.create(
        "base",
        metadata={"suite": "fake-e2b", "owner": "alice"},
        envs={"GREETING": "hello from envVars"},
        timeout=600,
        **fake_e2b_server.options(),
    )
    yield sandbox
    sandbox.kill()


@pytest.fixture(scope="module")
def cube_pr1800(fake_cube_server: FakeHandle) -> Iterator[FakeHandle]:
    """SDK 2.63 creates and connects on /v2 paths, which no Cube release serves (Cube #1784):
    these SDK tests talk to a Cube built with PR #1800; off again after the module."""
    fake_cube_server.configure(cube_pr1800=True)
    yield fake_cube_server
    fake_cube_server.configure(cube_pr1800=False)


@pytest.fixture
def fake_cube(cube_pr1800: FakeHandle) -> Iterator[FakeHandle]:
    yield cube_pr1800
    cube_pr1800.clear_faults()
    cube_pr1800.configure(cube_pause_seconds=0, resume_failures=0)


@pytest.fixture(scope="module")
def cube_sbx(cube_pr1800: FakeHandle) -> Iterator[Sandbox]:
    sandbox = Sandbox.create("base", metadata={"suite": "fake-cube"}, **cube_pr1800.options())
    yield sandbox
    sandbox.kill()


def fresh(fake: FakeHandle, **kwargs: object) -> Sandbox:
    return Sandbox.create("base", **fake.options(), **kwargs)  # type: ignore[arg-type]


# -- control plane ------------------------------------------------------------------------------


def test_create_records_metadata_envs_and_timeout(sbx: Sandbox) -> None:
    info = sbx.get_info()
    assert info.metadata == {"suite": "fake-e2b", "owner": "alice"}
    assert info.state == SandboxState.RUNNING
    assert 590 <= (info.end_at - info.started_at).total_seconds() <= 610
    assert info.envd_version == "0.5.7+fake"
    assert sbx.commands.run("echo $GREETING").stdout == "hello from envVars\n"


def test_list_filters_on_metadata_and_paginates(fake_e2b: FakeHandle) -> None:
    tag = uuid.uuid4().hex[:8]
    # Escaped characters must survive the SDK's double encoding on E2B.
    created = [fresh(fake_e2b, metadata={"batch": tag, "note": "a b=c&d"}) for _ in range(3)]
    try:
        query = SandboxQuery(metadata={"batch": tag, "note": "a b=c&d"})
        pages = Sandbox.list(query=query, limit=2, **fake_e2b.options())
        first = pages.next_items()
        assert len(first) == 2
        assert pages.has_next
        second = pages.next_items()
        assert len(second) == 1
        assert not pages.has_next
        found = {s.sandbox_id for s in first + second}
        assert found == {s.sandbox_id for s in created}
        none = Sandbox.list(query=SandboxQuery(metadata={"batch": "nope"}), **fake_e2b.options())
        assert none.next_items() == []
    finally:
        for s in created:
            s.kill()


def test_metadata_filter_is_decoded_as_infra_parse_filters(fake_e2b: FakeHandle) -> None:
    # infra parseFilters: unescape the whole value, split on & and =, unescape each part.
    # The SDK's encoding (quote each, urlencode) round-trips `& = + %`; one level less does not.
    value = f"a&b=c+d%e {uuid.uuid4().hex[:6]}"
    s = fresh(fake_e2b, metadata={"k": value})
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"k": value}), **fake_e2b.options()).next_items()
        assert [x.sandbox_id for x in found] == [s.sandbox_id]
        with fake_e2b.http() as http:
            one_level = urllib.parse.urlencode({"k": value})  # what the adapter used to send
            short = http.get("/v2/sandboxes", params={"metadata": one_level})
            # `&`/`=` split wrongly and `%e` is a bad escape after the second unescape (400).
            assert short.status_code == 400 or short.json() == []
            bad = http.get("/v2/sandboxes", params={"metadata": "k=%zz"})
            assert bad.status_code == 400
    finally:
        s.kill()


def test_kill_is_idempotent_and_get_info_404s(fake_e2b: FakeHandle) -> None:
    s = fresh(fake_e2b)
    assert Sandbox.kill(s.sandbox_id, **fake_e2b.options()) is True
    assert Sandbox.kill(s.sandbox_id, **fake_e2b.options()) is False
    with pytest.raises(NotFoundException):
        Sandbox.get_info(s.sandbox_id, **fake_e2b.options())
    assert s.sandbox_id not in {x["sandboxID"] for x in fake_e2b.state()["sandboxes"]}


def test_wrong_api_key_is_rejected(fake_e2b: FakeHandle) -> None:
    bad = fake_e2b.options(api_key="e2b_" + "f" * 40)
    with pytest.raises(AuthenticationException):
        Sandbox.list(**bad).next_items()
    with pytest.raises(AuthenticationException):
        Sandbox.create("base", **bad)


def test_unknown_template_is_404(fake_e2b: FakeHandle) -> None:
    with pytest.raises(SandboxException, match="not found"):
        Sandbox.create("no-such-template", **fake_e2b.options())


# -- commands -------------------------------------------------------------------------------


def test_commands_run_stdout_stderr_exit_code(sbx: Sandbox) -> None:
    result = sbx.commands.run("echo out; echo err >&2; id -un; pwd")
    assert result.stdout == "out\nuser\n/home/user\n"
    assert result.stderr == "err\n"
    assert result.exit_code == 0
    with pytest.raises(CommandExitException) as exc:
        sbx.commands.run("echo boom >&2; exit 3")
    assert exc.value.exit_code == 3
    assert exc.value.stderr == "boom\n"
    assert sbx.commands.run("id -u", user="root").stdout == "0\n"


def test_unknown_user_is_unauthenticated(sbx: Sandbox) -> None:
    with pytest.raises(AuthenticationException):
        sbx.commands.run("id", user="ghost")
    with pytest.raises(AuthenticationException):
        sbx.files.read("/etc/hostname", user="ghost")


def test_commands_stdin(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat; echo done", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "line one\n")
    sbx.commands.send_stdin(handle.pid, b"\x00\xffbytes\n")
    sbx.commands.close_stdin(handle.pid)
    result = handle.wait()
    assert result.stdout.startswith("line one\n")
    assert result.stdout.endswith("done\n")


def test_background_command_list_and_kill(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 300", background=True)
    pids = {p.pid for p in sbx.commands.list()}
    assert handle.pid in pids
    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert handle.pid not in {p.pid for p in sbx.commands.list()}
    assert sbx.commands.kill(handle.pid) is False


def test_pty_create_input_resize(sbx: Sandbox) -> None:
    output = bytearray()
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)
    sbx.pty.resize(terminal.pid, PtySize(rows=33, cols=101))
    sbx.pty.send_stdin(terminal.pid, b"stty size; tty; exit\n")
    terminal.wait(on_pty=output.extend)
    text = output.decode(errors="replace")
    assert "33 101" in text
    assert "/dev/pts/" in text


@pytest.mark.asyncio
async def test_async_pty_and_watch_stream(fake_e2b: FakeHandle) -> None:
    """The terminal consumer's path: AsyncSandbox, pty with on_data and timeout=0."""
    s = await AsyncSandbox.create("base", **fake_e2b.options())
    try:
        output = bytearray()
        terminal = await s.pty.create(PtySize(rows=20, cols=70), on_data=output.extend, timeout=0)
        await s.pty.resize(terminal.pid, PtySize(rows=41, cols=121))
        await s.pty.send_stdin(terminal.pid, b"stty size; exit\n")
        await terminal.wait()
        assert "41 121" in output.decode(errors="replace")
        events: list[FilesystemEvent] = []
        watcher = await s.files.watch_dir("/tmp", on_event=events.append)  # WatchDir stream
        await s.files.write("/tmp/streamed.txt", "1")
        for _ in range(50):
            if any(e.name == "streamed.txt" for e in events):
                break
            await asyncio.sleep(0.1)
        await watcher.stop()
        assert any(e.name == "streamed.txt" for e in events)
    finally:
        await s.kill()


# -- files ---------------------------------------------------------------------------------------


def test_files_binary_round_trip(sbx: Sandbox) -> None:
    info = sbx.files.write("bin/all-bytes.bin", ALL_BYTES)
    assert info.path == "/home/user/bin/all-bytes.bin"
    assert sbx.files.read("bin/all-bytes.bin", format="bytes") == ALL_BYTES
    assert sbx.files.get_info("bin/all-bytes.bin").owner == "user"
    sbx.files.write("/root/owned-by-root.txt", "root data", user="root")
    assert sbx.files.read("/root/owned-by-root.txt", user="root") == "root data"
    with pytest.raises(SandboxException):
        sbx.files.read("/root/owned-by-root.txt")  # user cannot read /root


def test_files_list_make_dir_remove(sbx: Sandbox) -> None:
    assert sbx.files.make_dir("tree/a/b") is True
    assert sbx.files.make_dir("tree/a/b") is False
    sbx.files.write("tree/a/file.txt", "x")
    names = {e.name for e in sbx.files.list("tree/a")}
    assert names == {"b", "file.txt"}
    deep = {e.path for e in sbx.files.list("tree", depth=3)}
    assert "/home/user/tree/a/file.txt" in deep
    sbx.files.rename("tree/a/file.txt", "tree/moved.txt")
    assert sbx.files.exists("tree/moved.txt")
    sbx.files.remove("tree")
    assert not sbx.files.exists("tree")
    with pytest.raises(NotFoundException):
        sbx.files.read("tree/moved.txt")


# -- lifecycle -------------------------------------------------------------------------------------


def _ticks(s: Sandbox) -> list[float]:
    return [float(x) for x in s.files.read("/tmp/ticks").split()]


def test_pause_freezes_processes_and_connect_resumes(fake_e2b: FakeHandle) -> None:
    s = fresh(fake_e2b)
    try:
        # A clock in the sandbox: one timestamp every 50 ms.
        s.commands.run("while true; do date +%s.%N >> /tmp/ticks; sleep 0.05; done", background=True)
        time.sleep(0.3)
        assert Sandbox.pause(s.sandbox_id, **fake_e2b.options()) is True
        assert Sandbox.pause(s.sandbox_id, **fake_e2b.options()) is False  # 409
        assert Sandbox.get_info(s.sandbox_id, **fake_e2b.options()).state == SandboxState.PAUSED
        assert not s.is_running()  # envd health 502 while paused
        time.sleep(1.5)
        resumed = Sandbox.connect(s.sandbox_id, **fake_e2b.options())
        assert resumed.sandbox_id == s.sandbox_id
        assert Sandbox.get_info(s.sandbox_id, **fake_e2b.options()).state == SandboxState.RUNNING
        time.sleep(0.3)
        ticks = _ticks(resumed)
        # The loop was frozen while paused (one long gap), and runs again after the resume.
        gaps = [b - a for a, b in itertools.pairwise(ticks)]
        assert max(gaps) >= 1.2
        assert ticks[-1] > ticks[gaps.index(max(gaps)) + 1]
    finally:
        s.kill()


def test_ttl_auto_pause_then_auto_resume_on_traffic(fake_e2b: FakeHandle) -> None:
    s = fresh(fake_e2b, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        s.files.write("kept.txt", "survives the pause")
        fake_e2b.expire(s.sandbox_id)
        _wait_state(fake_e2b, s.sandbox_id, "paused")
        # Data-plane traffic resumes it (autoResume).
        assert s.files.read("kept.txt") == "survives the pause"
        _wait_state(fake_e2b, s.sandbox_id, "running")
    finally:
        s.kill()


def test_ttl_kill_without_auto_pause(fake_e2b: FakeHandle) -> None:
    s = fresh(fake_e2b, timeout=1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and s.sandbox_id in _ids(fake_e2b):
        time.sleep(0.1)
    assert s.sandbox_id not in _ids(fake_e2b)
    assert Sandbox.kill(s.sandbox_id, **fake_e2b.options()) is False


def test_snapshot_is_usable_as_template(fake_e2b: FakeHandle, sbx: Sandbox) -> None:
    sbx.files.write("/workspace/skill.txt", "baked in", user="root")
    snap = sbx.create_snapshot(name="skills")
    assert snap.snapshot_id == "fake-team/skills:default"
    unnamed = sbx.create_snapshot()
    assert unnamed.snapshot_id.endswith(":default")
    assert unnamed.names == []
    pages = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id, limit=1, **fake_e2b.options())
    listed = {x.snapshot_id for x in pages.next_items()}
    while pages.has_next:
        listed |= {x.snapshot_id for x in pages.next_items()}
    assert {snap.snapshot_id, unnamed.snapshot_id} <= listed
    with fake_e2b.http() as http:
        by_name = http.get("/snapshots", params={"name": "skills"}).json()
    assert [x["snapshotID"] for x in by_name] == [snap.snapshot_id]
    assert Sandbox.delete_snapshot(unnamed.snapshot_id, **fake_e2b.options()) is True
    child = Sandbox.create(snap.snapshot_id, **fake_e2b.options())
    try:
        assert child.files.read("/workspace/skill.txt") == "baked in"
        assert sbx.is_running()  # the origin keeps running after the snapshot
    finally:
        child.kill()
    assert Sandbox.delete_snapshot(snap.snapshot_id, **fake_e2b.options()) is True


def test_template_build_from_local_image(fake_e2b: FakeHandle) -> None:
    template = (
        Template()
        .from_image(DEFAULT_IMAGE)
        .set_envs({"BUILT": "yes"})
        .run_cmd("echo baked > /opt/baked.txt", user="root")
    )
    info = Template.build(template, "fake-built", **fake_e2b.options())
    s = Sandbox.create("fake-built", **fake_e2b.options())
    try:
        assert s.commands.run("cat /opt/baked.txt; echo $BUILT").stdout == "baked\nyes\n"
    finally:
        s.kill()
    with pytest.raises(BuildException, match="exited with code 7"):
        Template.build(Template().from_image(DEFAULT_IMAGE).run_cmd("exit 7"), "fake-broken", **fake_e2b.options())
    with fake_e2b.http() as http:
        assert http.delete(f"/templates/{info.template_id}").status_code == 204


def test_envd_requires_the_access_token(fake_e2b: FakeHandle, sbx: Sandbox) -> None:
    # POST /v2/sandboxes always secures envd: the SDK sends X-Access-Token by itself.
    with fake_e2b.http() as http:
        token = http.get(f"/sandboxes/{sbx.sandbox_id}").json()["envdAccessToken"]
    envd = {"E2b-Sandbox-Id": sbx.sandbox_id}
    url, params = fake_e2b.sandbox_url + "/files", {"path": "/etc/hostname"}
    assert httpx.get(url, params=params, headers=envd).status_code == 401
    ok = httpx.get(url, params=params, headers={**envd, "X-Access-Token": token})
    assert ok.status_code == 200


def test_commands_connect_reattaches_by_pid(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 2; echo after-reattach", background=True)
    handle.disconnect()  # the process keeps running, as under envd
    result = sbx.commands.connect(handle.pid).wait()
    assert result.stdout == "after-reattach\n"


def test_watch_dir_reports_changes(sbx: Sandbox) -> None:
    sbx.files.make_dir("watched")
    watcher = sbx.files.watch_dir("watched", recursive=True)
    try:
        sbx.files.write("watched/new.txt", "1")
        sbx.files.remove("watched/new.txt")
        deadline = time.monotonic() + 5
        seen: list[FilesystemEvent] = []
        while time.monotonic() < deadline and len({e.type.name for e in seen}) < 2:
            seen += watcher.get_new_events()
            time.sleep(0.1)
        kinds = {(e.name, e.type.name) for e in seen}
        assert ("new.txt", "CREATE") in kinds
        assert ("new.txt", "REMOVE") in kinds
    finally:
        watcher.stop()
    with pytest.raises(NotFoundException):
        sbx.files.watch_dir("no/such/dir")


def test_set_timeout_update_network_and_idempotent_create(fake_e2b: FakeHandle, sbx: Sandbox) -> None:
    sbx.set_timeout(900)
    info = sbx.get_info()
    assert 890 <= (info.end_at - datetime.datetime.now(datetime.UTC)).total_seconds() <= 900
    Sandbox.update_network(sbx.sandbox_id, {"deny_out": ["10.0.0.0/8"]}, **fake_e2b.options())
    with fake_e2b.http() as http:
        network = http.get(f"/sandboxes/{sbx.sandbox_id}").json()["network"]
    assert network == {"denyOut": ["10.0.0.0/8"]}  # PUT replaces every rule
    first = Sandbox.create("base", idempotency_key="same-key-1", **fake_e2b.options())
    try:
        again = Sandbox.create("base", idempotency_key="same-key-1", **fake_e2b.options())
        assert again.sandbox_id == first.sandbox_id
    finally:
        first.kill()


def test_list_state_filter_and_reboot_resume(fake_e2b: FakeHandle) -> None:
    s = fresh(fake_e2b)
    try:
        s.commands.run("sleep 300", background=True)
        s.files.write("disk.txt", "on disk")
        Sandbox.pause(s.sandbox_id, **fake_e2b.options())
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED]), **fake_e2b.options())
        assert s.sandbox_id in {x.sandbox_id for x in paused.next_items()}
        running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING]), **fake_e2b.options())
        assert s.sandbox_id not in {x.sandbox_id for x in running.next_items()}
        rebooted = Sandbox.connect(s.sandbox_id, on_resume="reboot", **fake_e2b.options())
        # A cold boot keeps the filesystem and loses the processes.
        assert rebooted.files.read("disk.txt") == "on disk"
        assert rebooted.commands.list() == []
    finally:
        s.kill()


def test_fork_copies_the_filesystem(fake_e2b: FakeHandle, sbx: Sandbox) -> None:
    sbx.files.write("fork-me.txt", "inherited")
    forks = sbx.fork(count=2, timeout=120)
    try:
        assert len(forks) == 2
        for child in forks:
            assert isinstance(child, Sandbox)
            assert child.sandbox_id != sbx.sandbox_id
            assert child.files.read("fork-me.txt") == "inherited"
    finally:
        for child in forks:
            if isinstance(child, Sandbox):
                child.kill()


def test_list_started_after(fake_e2b: FakeHandle, sbx: Sandbox) -> None:
    started = sbx.get_info().started_at
    before = SandboxQuery(started_after=started - datetime.timedelta(seconds=1))
    after = SandboxQuery(started_after=started + datetime.timedelta(seconds=1))
    assert sbx.sandbox_id in {x.sandbox_id for x in Sandbox.list(query=before, **fake_e2b.options()).next_items()}
    assert sbx.sandbox_id not in {x.sandbox_id for x in Sandbox.list(query=after, **fake_e2b.options()).next_items()}


def test_volumes_with_the_sdk(fake_e2b: FakeHandle) -> None:
    # spec/openapi.yml /volumes and NewSandbox.volumeMounts, through the SDK's own Volume.
    opts = fake_e2b.options()
    name = f"sdk-vol-{uuid.uuid4().hex[:8]}"
    volume = Volume.create(name, **opts)
    try:
        assert volume.name == name
        assert volume.token
        assert name in {v.name for v in Volume.list(**opts)}
        assert Volume.get_info(volume.volume_id, **opts).name == name
        with pytest.raises(VolumeException) as taken:  # names are unique per team: a 400
            Volume.create(name, **opts)
        assert "already exists" in str(taken.value)
        first = fresh(fake_e2b, volume_mounts={"/data": volume})
        assert first.commands.run("stat -c %u /data; ls -A /data").stdout == "0\n"  # empty, root's
        first.commands.run("echo kept > /data/kept.txt", user="root")
        first.kill()
        second = fresh(fake_e2b, volume_mounts={"/data": name})  # by name works too
        try:
            assert second.files.read("/data/kept.txt") == "kept\n"
        finally:
            second.kill()
        with pytest.raises(SandboxException) as unknown:
            fresh(fake_e2b, volume_mounts={"/data": f"no-such-{name}"})
        assert "volume mount #0" in str(unknown.value)
        assert "not found" in str(unknown.value)
    finally:
        destroyed = Volume.destroy(volume.volume_id, **opts)
    assert destroyed is True
    assert Volume.destroy(volume.volume_id, **opts) is False
    assert name not in {v["name"] for v in fake_e2b.state()["volumes"]}


def test_cli_runs_as_a_subprocess() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.e2b_server", "--port", str(port), "--personality", "e2b"],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "listening on" in proc.stdout.readline()
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 204
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


# -- fault injection -------------------------------------------------------------------------------


def test_fault_429_is_rate_limit(fake_e2b: FakeHandle) -> None:
    fake_e2b.set_fault("status", status=429, path="^/v2/sandboxes$", method="GET")
    with pytest.raises(RateLimitException):
        Sandbox.list(**fake_e2b.options(retries=0)).next_items()


def test_fault_500_is_sandbox_exception(fake_e2b: FakeHandle) -> None:
    fake_e2b.set_fault("status", status=500, path="^/v2/sandboxes$", times=1)
    with pytest.raises(SandboxException, match="500"):
        Sandbox.create("base", **fake_e2b.options())


def test_fault_503_retry_after_is_retried_then_service_busy(fake_e2b: FakeHandle) -> None:
    fake_e2b.set_fault("status", status=503, retry_after=1, path="^/v2/sandboxes$", times=1)
    t0 = time.monotonic()
    # The SDK honours Retry-After and retries once: the call succeeds after ~1 s.
    Sandbox.list(**fake_e2b.options()).next_items()
    assert time.monotonic() - t0 >= 0.9
    fake_e2b.set_fault("status", status=503, retry_after=7, path="^/v2/sandboxes$")
    with pytest.raises(ServiceBusyException):
        Sandbox.list(**fake_e2b.options(retries=0)).next_items()
    r = fake_e2b.http().get("/v2/sandboxes")
    assert (r.status_code, r.headers["Retry-After"]) == (503, "7")


def test_fault_latency(fake_e2b: FakeHandle) -> None:
    fake_e2b.set_fault("latency", delay=0.6, path="^/v2/sandboxes$", times=1)
    t0 = time.monotonic()
    Sandbox.list(**fake_e2b.options()).next_items()
    assert time.monotonic() - t0 >= 0.6


def test_fault_repeating_page_token(fake_e2b: FakeHandle) -> None:
    created = [fresh(fake_e2b) for _ in range(2)]
    try:
        fake_e2b.set_fault("repeat_token")
        pages = Sandbox.list(limit=1, **fake_e2b.options())
        pages.next_items()
        first_token = pages.next_token
        pages.next_items()
        assert pages.has_next
        assert pages.next_token == first_token  # a client without a guard loops forever
    finally:
        for s in created:
            s.kill()


def test_fault_dropped_stream(fake_e2b: FakeHandle, sbx: Sandbox) -> None:
    fake_e2b.set_fault("drop_stream", path="Process/Start", after_events=1, times=1)
    # Cut after the start event: the SDK probes /health (204) and reports the stream as lost.
    with pytest.raises(TimeoutException):
        sbx.commands.run("echo never seen; sleep 1")
    assert fake_e2b.state()["faults"][0]["fired"] == 1
    assert sbx.commands.run("echo fine").stdout == "fine\n"


def test_stream_deadline_from_connect_timeout_ms(sbx: Sandbox) -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 10", timeout=1)
    assert time.monotonic() - t0 < 5


def test_fault_on_envd_rpc_is_rate_limit(fake_e2b: FakeHandle, sbx: Sandbox) -> None:
    fake_e2b.set_fault("status", status=429, plane="envd", path="Process/List", times=1)
    with pytest.raises(RateLimitException):
        sbx.commands.list()


# -- Cube personality ---------------------------------------------------------------------------


@pytest.mark.cube
def test_cube_old_envd_forces_the_basic_auth_user(cube_sbx: Sandbox) -> None:
    assert cube_sbx.get_info().envd_version == "0.2.0"
    assert cube_sbx.commands.run("id -un").stdout == "user\n"
    written = cube_sbx.files.write("cube.txt", b"\x00cube\xff")
    assert written.path == "/home/user/cube.txt"
    assert cube_sbx.files.read("cube.txt", format="bytes") == b"\x00cube\xff"


@pytest.mark.cube
def test_cube_health_prefix_and_unpaginated_list(fake_cube: FakeHandle, cube_sbx: Sandbox) -> None:
    with fake_cube.http() as http:
        health = http.get("/health")
        assert health.status_code == 200
        assert health.json()["status"] == "ok"
        r = http.get("/cubeapi/v1/v2/sandboxes", params={"limit": 1, "nextToken": "ignored"})
        assert r.status_code == 200
        assert "x-next-token" not in r.headers
        assert r.json()[0]["diskSizeMB"] == 0
    pages = Sandbox.list(limit=1, **fake_cube.options())
    assert len(pages.next_items()) == 1
    assert not pages.has_next


@pytest.mark.cube
def test_cube_metadata_filter_quirk(fake_cube: FakeHandle) -> None:
    s = fresh(fake_cube, metadata={"plain": "yes", "spaced": "a b"})
    try:
        plain = Sandbox.list(query=SandboxQuery(metadata={"plain": "yes"}), **fake_cube.options())
        assert s.sandbox_id in {x.sandbox_id for x in plain.next_items()}
        # The SDK percent-escapes the value; Cube does not decode it, so it never matches.
        spaced = Sandbox.list(query=SandboxQuery(metadata={"spaced": "a b"}), **fake_cube.options())
        assert spaced.next_items() == []
    finally:
        s.kill()


@pytest.mark.cube
def test_cube_tokens_connect_and_pausing(fake_cube: FakeHandle, cube_host_root: Path) -> None:
    with fake_cube.http() as http:
        mount = json.dumps([{"hostPath": str(cube_host_root), "mountPath": "/mnt/data", "readOnly": True}])
        meta = {"k": "v", "host-mount": mount}
        # A traffic token only for private ports (CubeMaster id2ip.go @30b4e25a).
        private = {"allowPublicTraffic": False}
        created = http.post("/sandboxes", json={"templateID": "base", "metadata": meta, "network": private})
        assert created.status_code == 201
        body = created.json()
        sid = body["sandboxID"]
        # Cube lifts `host-mount` out of the labels: it never comes back as metadata.
        assert http.get(f"/sandboxes/{sid}").json()["metadata"] == {"k": "v"}
        assert body["trafficAccessToken"]
        assert body["envdAccessToken"] is None
        try:
            assert http.post(f"/sandboxes/{sid}/pause", json={"memory": False}).status_code == 204
            connected = http.post(f"/v2/sandboxes/{sid}/connect", json={})
            # Cube answers 200 even when it resumed, and never repeats the traffic token.
            assert connected.status_code == 200
            assert connected.json()["trafficAccessToken"] is None
            assert http.post(f"/v2/sandboxes/{sid}/connect", json={"memory": False}).status_code == 400
            fake_cube.force_state(sid, "pausing")
            with pytest.raises(ValueError, match="pausing"):
                Sandbox.list(**fake_cube.options()).next_items()
            busy = http.delete(f"/sandboxes/{sid}")
            assert (busy.status_code, busy.headers["Retry-After"]) == (503, "2")
            fake_cube.force_state(sid, "running")
        finally:
            assert http.delete(f"/sandboxes/{sid}").status_code == 204


@pytest.mark.cube
def test_cube_data_plane_gone_and_resume_failure(fake_cube: FakeHandle) -> None:
    s = fresh(fake_cube)
    envd = {"Host": f"49983-{s.sandbox_id}.cube.app"}
    with fake_cube.http() as http:
        assert Sandbox.pause(s.sandbox_id, **fake_cube.options()) is True
        fake_cube.configure(resume_failures=1)
        failed = http.get("/health", headers=envd)
        assert (failed.status_code, failed.headers["Retry-After"]) == (503, "5")
        # Cube's proxy resumes a paused sandbox on traffic.
        assert http.get("/health", headers=envd).status_code == 204
        # CubeProxy routes on Host only: E2b-Sandbox-Id alone reaches the control plane.
        by_header = http.get("/health", headers={"E2b-Sandbox-Id": s.sandbox_id})
        assert by_header.status_code == 200
        assert "sandboxes" in by_header.json()
        s.kill()
        assert http.get("/health", headers=envd).status_code == 410


@pytest.mark.cube
def test_cube_snapshot_id_not_name_is_a_template(fake_cube: FakeHandle, cube_sbx: Sandbox) -> None:
    cube_sbx.files.write("/workspace/from-cube.txt", "snap", user="root")
    snap = cube_sbx.create_snapshot(name="cube-skills")
    assert snap.snapshot_id.startswith("snap-")
    child = Sandbox.create(snap.snapshot_id, **fake_cube.options())
    try:
        assert child.files.read("/workspace/from-cube.txt") == "snap"
    finally:
        child.kill()
    with pytest.raises(SandboxException):
        Sandbox.create("cube-skills", **fake_cube.options())
    with fake_cube.http() as http:
        # Rollback swaps the filesystem back to the snapshot's, keeping the sandbox id.
        cube_sbx.files.write("/workspace/from-cube.txt", "changed later", user="root")
        rolled = http.post(f"/sandboxes/{cube_sbx.sandbox_id}/rollback", json={"snapshotID": snap.snapshot_id})
        assert rolled.json()["sandboxID"] == cube_sbx.sandbox_id
        assert cube_sbx.files.read("/workspace/from-cube.txt") == "snap"
        listed = http.get("/snapshots").json()
        assert any(x["snapshotID"] == snap.snapshot_id and x["status"] for x in listed)
        deleted = http.delete(f"/templates/{snap.snapshot_id}")
        assert deleted.status_code == 200
        assert deleted.json()["templateID"] == snap.snapshot_id


@pytest.mark.cube
def test_cube_template_api(fake_cube: FakeHandle) -> None:
    with fake_cube.http() as http:
        job = http.post("/templates", json={"image": DEFAULT_IMAGE, "name": "tpl-test"})
        assert job.status_code == 202
        tid = job.json()["templateID"]
        assert tid.startswith("tpl-")
        assert job.json()["status"] == "READY"
        assert tid in {t["templateID"] for t in http.get("/templates").json()}
        detail = http.get(f"/templates/{tid}").json()
        assert detail["createRequest"]["image"] == DEFAULT_IMAGE
        assert detail["replicas"] == []
        status = http.get(f"/templates/{tid}/builds/{job.json()['jobID']}/status").json()
        assert status["status"] == "READY"
        assert http.patch(f"/templates/{tid}", json={}).status_code == 501
        s = Sandbox.create(tid, **fake_cube.options())
        s.kill()
        assert http.delete(f"/templates/{tid}").status_code == 200
        assert http.get(f"/templates/{tid}").status_code == 404


@pytest.mark.cube
def test_cube_network_and_env_validation(fake_cube: FakeHandle, cube_sbx: Sandbox) -> None:
    rules = [
        {
            "name": "github",
            "match": {"host": "api.github.com"},
            "action": {"allow": True, "inject": [{"header": "Authorization", "secret": "s"}]},
        }
    ]
    with fake_cube.http() as http:
        # No release routes a network update (CubeAPI routes.rs @08f2f5d7): axum's empty 404.
        update = http.put(f"/sandboxes/{cube_sbx.sandbox_id}/network", json={"allowOut": []})
        assert (update.status_code, update.content) == (404, b"")
        network = {"allowOut": ["api.github.com"], "denyOut": ["0.0.0.0/0"], "rules": rules}
        ok = http.post("/sandboxes", json={"templateID": "base", "network": network})
        assert ok.status_code == 201
        made = ok.json()["sandboxID"]
        assert http.get(f"/sandboxes/{made}").json()["network"]["rules"] == rules
        assert http.delete(f"/sandboxes/{made}").status_code == 204
        # E2B's rules shape (an object keyed by domain) is not Cube's (models SandboxNetworkConfig).
        e2b_rules = {"api.github.com": [{"transform": {"headers": {"X": "1"}}}]}
        body = {"templateID": "base", "network": {"rules": e2b_rules}}
        assert http.post("/sandboxes", json=body).status_code == 400
        body = {"templateID": "base", "network": {"allowOut": ["example.com"]}}
        assert http.post("/sandboxes", json=body).status_code == 400
        # CubeAPI FORBIDDEN_ENV_NAMES: loader and language paths, not HOME or HOSTNAME.
        for name in ("PATH", "PYTHONPATH", "NODE_PATH", "LD_PRELOAD"):
            bad_env = http.post("/sandboxes", json={"templateID": "base", "envVars": {name: "/x"}})
            assert bad_env.status_code == 400, name
        fine = http.post("/sandboxes", json={"templateID": "base", "envVars": {"HOME": "/h", "HOSTNAME": "h"}})
        assert fine.status_code == 201
        assert http.delete(f"/sandboxes/{fine.json()['sandboxID']}").status_code == 204


@pytest.mark.cube
def test_cube_05_takes_rules_as_a_list_only(fake_cube_05_server: FakeHandle) -> None:
    e2b_rules = {"api.github.com": [{"transform": {"headers": {"X": "1"}}}]}
    with fake_cube_05_server.http() as http:
        made = http.post("/sandboxes", json={"templateID": "base", "network": {"rules": e2b_rules}})
        assert made.status_code == 400
        assert "sequence" in made.json()["message"]


@pytest.mark.cube
def test_cube_host_mount_is_a_bind_mount_of_the_host_path(fake_cube: FakeHandle, cube_host_root: Path) -> None:
    # CubeMaster hostdir_mount.go: `host-mount` entries are bind mounts, readOnly respected.
    rw, ro = cube_host_root / f"rw-{uuid.uuid4().hex[:6]}", cube_host_root / f"ro-{uuid.uuid4().hex[:6]}"
    rw.mkdir()
    ro.mkdir()
    (ro / "given.txt").write_text("from the host\n")
    mounts = [
        {"hostPath": str(rw), "mountPath": "/mnt/rw", "readOnly": False},
        {"hostPath": str(ro), "mountPath": "/mnt/ro", "readOnly": True},
    ]
    s = fresh(fake_cube, metadata={"host-mount": json.dumps(mounts), "plain": "yes"})
    try:
        assert s.get_info().metadata == {"plain": "yes"}  # lifted into an annotation
        s.commands.run("echo from the sandbox > /mnt/rw/made.txt", user="root")
        assert (rw / "made.txt").read_text() == "from the sandbox\n"
        assert s.commands.run("cat /mnt/ro/given.txt").stdout == "from the host\n"
        with pytest.raises(CommandExitException):
            s.commands.run("touch /mnt/ro/nope", user="root")
    finally:
        s.kill()
        shutil.rmtree(rw)
        shutil.rmtree(ro)


@pytest.mark.cube
def test_cube_refuses_bad_host_mounts_and_has_no_volumes(fake_cube: FakeHandle, cube_host_root: Path) -> None:
    before = _ids(fake_cube)
    with fake_cube.http() as http:
        for mounts, problem in (
            ([{"hostPath": "relative", "mountPath": "/mnt/x"}], "hostPath must be an absolute path"),
            ([{"hostPath": str(cube_host_root / "missing"), "mountPath": "/mnt/x"}], ""),
            ("not json", "invalid"),
        ):
            value = mounts if isinstance(mounts, str) else json.dumps(mounts)
            r = http.post("/sandboxes", json={"templateID": "base", "metadata": {"host-mount": value}})
            # CubeAPI answers every failed create with 500 (services/sandboxes.rs internal_error).
            assert r.status_code == 500, r.text
            assert problem in r.json()["message"]
        assert http.get("/volumes").status_code == 404  # absent in C-May, not modelled for C-later
    assert _ids(fake_cube) == before


@pytest.mark.cube
def test_cube_may_has_no_v2_paths() -> None:
    server = FakeServer("cube", cube_version="may").start()
    try:
        with httpx.Client(base_url=server.api_url, headers={"X-API-Key": server.api_key}) as http:
            assert http.post("/v2/sandboxes", json={"templateID": "base"}).status_code == 405
            # axum: a path with other methods is 405, an unknown path 404, both bodiless.
            missing = http.post("/v2/sandboxes/x/connect", json={})
            assert (missing.status_code, missing.content) == (404, b"")
    finally:
        server.stop()


def _ids(fake: FakeHandle) -> set[str]:
    return {x["sandboxID"] for x in fake.state()["sandboxes"]}


def _wait_state(fake: FakeHandle, sandbox_id: str, state: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    current = None
    while time.monotonic() < deadline:
        current = next((x["state"] for x in fake.state()["sandboxes"] if x["sandboxID"] == sandbox_id), None)
        if current == state:
            return
        time.sleep(0.1)
    raise AssertionError(f"sandbox {sandbox_id} is {current}, expected {state}")


@pytest.mark.cube
def test_cube_07_reads_idle_behaviour_from_lifecycle_only(fake_cube_server: FakeHandle) -> None:
    # CubeAPI models SandboxLifecycleConfig: "absent lifecycle keeps today's behaviour: idle
    # sandboxes are killed"; top-level autoPause is not a field of NewSandbox any more.
    bodies: dict[str, dict[str, Any]] = {
        "top-level": {"autoPause": True, "autoResume": {"enabled": True}},
        "lifecycle": {"lifecycle": {"onTimeout": "pause", "autoResume": True}},
    }
    with fake_cube_server.http() as http:
        seen = {}
        for name, extra in bodies.items():
            made = http.post("/sandboxes", json={"templateID": "base", **extra})
            assert made.status_code == 201
            sandbox_id = made.json()["sandboxID"]
            seen[name] = http.get(f"/sandboxes/{sandbox_id}").json()["lifecycle"]
            http.delete(f"/sandboxes/{sandbox_id}")
        bad = http.post("/sandboxes", json={"templateID": "base", "lifecycle": {"onTimeout": "sleep"}})
        assert bad.status_code == 400
    assert seen == {
        "top-level": {"autoResume": False, "onTimeout": "kill"},
        "lifecycle": {"autoResume": True, "onTimeout": "pause"},
    }


@pytest.mark.cube
def test_cube_022_egress_switch_templates_and_missing_routes(fake_cube_022_server: FakeHandle) -> None:
    # v0.2.2 build_cubevs_context (CubeAPI services/sandboxes.rs @b1b7ec65): allowPublicTraffic
    # overrides allow_internet_access as the egress switch; CreateTemplateRequest needs
    # templateID; GET /snapshots has no route.
    with fake_cube_022_server.http() as http:
        made = http.post(
            "/sandboxes",
            json={"templateID": "base", "allow_internet_access": False, "network": {"allowPublicTraffic": True}},
        )
        assert made.status_code == 201
        sandbox_id = made.json()["sandboxID"]
        row = next(r for r in fake_cube_022_server.state()["sandboxes"] if r["sandboxID"] == sandbox_id)
        assert row["egress"] is True  # inbound "on" opened the internet
        http.delete(f"/sandboxes/{sandbox_id}")
        assert http.post("/templates", json={"image": DEFAULT_IMAGE}).status_code == 400
        snapshots = http.get("/snapshots")
        assert (snapshots.status_code, snapshots.content) == (404, b"")


def test_metrics_rows_read_by_the_sdk(sbx: Sandbox) -> None:
    # SDK 2.63 get_metrics() reads every SandboxMetric field the spec requires (memCache
    # included, e2b-dev/infra spec/openapi.yml @54693ff SandboxMetric): without it, KeyError.
    metrics = sbx.get_metrics()
    assert metrics, "no metrics row"
    row = metrics[-1]
    assert row.mem_cache >= 0
    assert row.mem_total > 0
    assert row.cpu_count > 0

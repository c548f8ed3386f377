"""The sandbox contract, written once and run against every backend.

A backend's test module subclasses `BackendConformance` and provides two fixtures:
`backend` (a contract `Backend`, at least class-scoped) and `template_id` (a template every
sandbox of the suite starts from). `test_run_id` (tests/sandboxes/conftest.py) labels
everything the suite creates so the backend's own fixtures can sweep leftovers.

Tests that do not change a sandbox's lifecycle share one sandbox; the others make their own.
A capability the backend lacks (accessor returns None) skips its tests with the reason.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandboxes.backends.base import (
    Backend,
    ErrorKind,
    ExecRequest,
    ListQuery,
    NetworkCapabilities,
    NetworkSpec,
    RemoteError,
    SandboxInfo,
    SandboxSpec,
    SandboxState,
)
from sandboxes.backends.capabilities import (
    FilesCapability,
    InboundCapability,
    LogsCapability,
    PtyCapability,
    SandboxLogs,
    SandboxStats,
    SnapshotsCapability,
    StatsCapability,
    TemplatesCapability,
    VolumesCapability,
)

OFFLINE = NetworkSpec(allow_internet_access=False, allow_public_traffic=False)
MISSING_SANDBOX_ID = "doesnotexist0123456789abcdef"

SandboxFactory = Callable[..., SandboxInfo]


@contextlib.contextmanager
def sandbox_factory(backend: Backend, template_id: str, test_run_id: str) -> Iterator[SandboxFactory]:
    """`make(adapter=backend, **spec fields)`: an offline sandbox of `template_id` labelled with
    the test run (`metadata=` adds labels); each one made is deleted at the end by the adapter
    that made it."""
    created: list[tuple[Backend, str]] = []

    def make(adapter: Backend = backend, **overrides: object) -> SandboxInfo:
        metadata = {"test-run": test_run_id, **overrides.pop("metadata", {})}  # type: ignore[dict-item]
        spec_args: dict[str, object] = {"template_id": template_id, "network": OFFLINE}
        spec_args.update(overrides)
        info = adapter.create(SandboxSpec(metadata=metadata, **spec_args))  # type: ignore[arg-type]
        created.append((adapter, info.sandbox_id))
        return info

    try:
        yield make
    finally:
        for adapter, sandbox_id in created:
            adapter.delete(sandbox_id)


def shell_request(line: str, **options: Any) -> ExecRequest:
    """An ExecRequest for a shell line (the sandbox's shell, never the host's)."""
    return ExecRequest(shell=line, **options)


def run(backend: Backend, sandbox_id: str, line: str, **options: Any) -> str:
    """Run a shell line that must succeed; its stdout as text."""
    result = backend.exec(sandbox_id, shell_request(line, **options))
    assert result.exit_code == 0, (line, result)
    return result.stdout.decode()


class BackendConformance:
    """Contract tests; subclasses provide the `backend` and `template_id` fixtures."""

    # Fixtures ------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    def make_sandbox(self, backend: Backend, template_id: str, test_run_id: str) -> Iterator[SandboxFactory]:
        """Creates sandboxes labelled with the test run and deletes them at the end."""
        with sandbox_factory(backend, template_id, test_run_id) as make:
            yield make

    @pytest.fixture(scope="class")
    def sandbox(self, make_sandbox: SandboxFactory) -> SandboxInfo:
        """One sandbox shared by the tests that leave its lifecycle alone."""
        return make_sandbox(metadata={"console-session": f"shared-{uuid.uuid4().hex}"})

    @pytest.fixture
    def files(self, backend: Backend) -> FilesCapability:
        capability = backend.files()
        if capability is None:
            pytest.skip(f"{backend.label} has no files capability")
        return capability

    @pytest.fixture
    def snapshots(self, backend: Backend) -> SnapshotsCapability:
        capability = backend.snapshots()
        if capability is None:
            pytest.skip(f"{backend.label} has no snapshots capability")
        return capability

    @pytest.fixture
    def volumes(self, backend: Backend) -> VolumesCapability:
        capability = backend.volumes()
        if capability is None:
            pytest.skip(f"{backend.label} has no volumes capability")
        return capability

    # Capabilities and health -----------------------------------------------------------

    def test_capability_accessors_return_capability_or_none(self, backend: Backend) -> None:
        expected = {
            "files": FilesCapability,
            "snapshots": SnapshotsCapability,
            "templates": TemplatesCapability,
            "inbound": InboundCapability,
            "pty": PtyCapability,
            "volumes": VolumesCapability,
            "stats": StatsCapability,
            "logs": LogsCapability,
        }
        for name, capability_type in expected.items():
            first, second = getattr(backend, name)(), getattr(backend, name)()
            assert (first is None) == (second is None), f"{name}() answers inconsistently"
            assert first is None or isinstance(first, capability_type), name
        assert isinstance(backend.network_capabilities(), NetworkCapabilities)

    def test_stats_of_a_running_sandbox(self, backend: Backend, sandbox: SandboxInfo) -> None:
        capability = backend.stats()
        if capability is None:
            pytest.skip(f"{backend.label} does not report resource use")
        stats = capability.read(sandbox.sandbox_id)
        assert isinstance(stats, SandboxStats)
        assert stats.memory_bytes is not None, "memory in use is the least a stats capability reports"
        assert stats.memory_bytes > 0
        assert stats.cpu_percent is None or stats.cpu_percent >= 0
        # Memory alone (the Pools page's reading): the same figure, within what an idle sandbox moves.
        memory = capability.memory_bytes(sandbox.sandbox_id)
        assert memory is not None
        assert stats.memory_bytes / 2 < memory < stats.memory_bytes * 2
        for read in (capability.read, capability.memory_bytes):
            with pytest.raises(RemoteError) as missing:
                read(MISSING_SANDBOX_ID)
            assert missing.value.kind == ErrorKind.NOT_FOUND

    def test_logs_of_a_sandbox(self, backend: Backend, sandbox: SandboxInfo) -> None:
        capability = backend.logs()
        if capability is None:
            pytest.skip(f"{backend.label} does not offer a sandbox's output")
        logs = capability.read(sandbox.sandbox_id, tail=10)
        assert isinstance(logs, SandboxLogs)
        assert len(logs.data.splitlines()) <= 10
        with pytest.raises(RemoteError) as missing:
            capability.read(MISSING_SANDBOX_ID)
        assert missing.value.kind == ErrorKind.NOT_FOUND

    def test_health_answers(self, backend: Backend) -> None:
        health = backend.health()
        assert health.ok, health.detail
        assert health.version

    # Lifecycle and listing -------------------------------------------------------------

    def test_create_carries_metadata_and_lists_back(self, backend: Backend, sandbox: SandboxInfo) -> None:
        assert sandbox.state == SandboxState.RUNNING
        session = sandbox.metadata["console-session"]
        page = backend.list(ListQuery(metadata={"console-session": session}))
        assert [item.sandbox_id for item in page.items] == [sandbox.sandbox_id]
        assert page.items[0].metadata["console-session"] == session
        assert backend.get(sandbox.sandbox_id).metadata == sandbox.metadata

    def test_list_filters_by_state(self, backend: Backend, sandbox: SandboxInfo) -> None:
        session = {"console-session": sandbox.metadata["console-session"]}
        running = backend.list(ListQuery(metadata=session, states=frozenset({SandboxState.RUNNING})))
        paused = backend.list(ListQuery(metadata=session, states=frozenset({SandboxState.PAUSED})))
        assert [item.sandbox_id for item in running.items] == [sandbox.sandbox_id]
        assert paused.items == ()

    def test_list_pages_without_repeats(self, backend: Backend, make_sandbox: SandboxFactory, test_run_id: str) -> None:
        group = {"console-space": f"paging-{uuid.uuid4().hex[:8]}"}
        made = {make_sandbox(metadata=group).sandbox_id for _ in range(3)}
        first = backend.list(ListQuery(metadata=group, limit=2))
        assert len(first.items) == 2
        assert first.next_token
        second = backend.list(ListQuery(metadata=group, limit=2, page_token=first.next_token))
        seen = [item.sandbox_id for item in first.items + second.items]
        assert sorted(seen) == sorted(made)
        assert second.next_token is None
        assert {info.sandbox_id for info in backend.iter_sandboxes(ListQuery(metadata=group, limit=1))} == made

    def test_delete_twice_succeeds(self, backend: Backend, make_sandbox: SandboxFactory) -> None:
        info = make_sandbox()
        backend.delete(info.sandbox_id)
        backend.delete(info.sandbox_id)
        with pytest.raises(RemoteError) as caught:
            backend.get(info.sandbox_id)
        assert caught.value.kind in (ErrorKind.NOT_FOUND, ErrorKind.GONE)

    # Exec ------------------------------------------------------------------------------

    def test_exec_runs_as_the_sandbox_user_and_root_on_request(self, backend: Backend, sandbox: SandboxInfo) -> None:
        assert run(backend, sandbox.sandbox_id, "id -u").strip() == "1000"
        assert run(backend, sandbox.sandbox_id, "id -u", user="root").strip() == "0"

    def test_exec_passes_stdin_cwd_env_and_argv(self, backend: Backend, sandbox: SandboxInfo) -> None:
        payload = b"line one\nline two\x00\xff\n"
        result = backend.exec(sandbox.sandbox_id, ExecRequest(argv=("cat",), stdin=payload))
        assert result.exit_code == 0
        assert result.stdout == payload
        result = backend.exec(
            sandbox.sandbox_id,
            ExecRequest(argv=("sh", "-c", 'pwd; echo "$GREETING"'), cwd="/tmp", env={"GREETING": "hi there"}),
        )
        assert result.stdout.decode().split("\n")[:2] == ["/tmp", "hi there"]

    def test_exec_streams_large_stdin_while_output_flows(self, backend: Backend, sandbox: SandboxInfo) -> None:
        # cat writes while it reads: stdin and stdout must both keep moving, or both block.
        payload = bytes(range(256)) * (16 * 1024)  # 4 MiB
        result = backend.exec(
            sandbox.sandbox_id, ExecRequest(argv=("cat",), stdin=payload, max_output_bytes=len(payload))
        )
        assert result.exit_code == 0
        assert result.stdout == payload
        assert not result.truncated

    def test_exec_reports_non_zero_exit_and_stderr(self, backend: Backend, sandbox: SandboxInfo) -> None:
        result = backend.exec(sandbox.sandbox_id, shell_request("echo out; echo err >&2; exit 7"))
        assert (result.exit_code, result.stdout, result.stderr) == (7, b"out\n", b"err\n")
        assert not result.timed_out
        assert result.duration_s >= 0

    def test_exec_timeout_is_reported_and_the_sandbox_still_works(self, backend: Backend, sandbox: SandboxInfo) -> None:
        started = time.monotonic()
        result = backend.exec(sandbox.sandbox_id, shell_request("sleep 120", timeout_s=1))
        assert result.timed_out
        assert time.monotonic() - started < 15
        assert run(backend, sandbox.sandbox_id, "echo alive") == "alive\n"

    def test_output_cap_sets_truncated(self, backend: Backend, sandbox: SandboxInfo) -> None:
        result = backend.exec(sandbox.sandbox_id, shell_request("head -c 100000 /dev/zero", max_output_bytes=1000))
        assert result.truncated
        assert len(result.stdout) == 1000
        small = backend.exec(sandbox.sandbox_id, shell_request("echo short", max_output_bytes=1000))
        assert not small.truncated

    # Files -----------------------------------------------------------------------------

    def test_files_round_trip_binary_content_and_mode(
        self, backend: Backend, sandbox: SandboxInfo, files: FilesCapability
    ) -> None:
        every_byte = bytes(range(256)) * 4
        path = f"/workspace/conformance-{uuid.uuid4().hex[:8]}/tool.bin"
        files.write(sandbox.sandbox_id, path, every_byte, mode=0o755)
        assert files.read(sandbox.sandbox_id, path) == every_byte
        assert files.read(sandbox.sandbox_id, path, max_bytes=10) == every_byte[:10]
        info = files.stat(sandbox.sandbox_id, path)
        assert (info.size, info.mode & 0o777, info.is_dir) == (len(every_byte), 0o755, False)
        assert run(backend, sandbox.sandbox_id, f"test -x {path} && stat -c %u {path}").strip() == "1000"

    def test_files_list_make_dir_remove(self, backend: Backend, sandbox: SandboxInfo, files: FilesCapability) -> None:
        folder = f"/workspace/listing-{uuid.uuid4().hex[:8]}"
        files.make_dir(sandbox.sandbox_id, f"{folder}/inner")
        files.write(sandbox.sandbox_id, f"{folder}/a.txt", b"a")
        entries = {entry.name: entry for entry in files.list(sandbox.sandbox_id, folder)}
        assert set(entries) == {"a.txt", "inner"}
        assert entries["inner"].is_dir
        assert not entries["a.txt"].is_dir
        files.remove(sandbox.sandbox_id, folder)
        with pytest.raises(RemoteError) as caught:
            files.stat(sandbox.sandbox_id, folder)
        assert caught.value.kind == ErrorKind.NOT_FOUND

    def test_files_reject_bad_and_missing_paths(self, sandbox: SandboxInfo, files: FilesCapability) -> None:
        with pytest.raises(RemoteError) as caught:
            files.read(sandbox.sandbox_id, "relative/path.txt")
        assert caught.value.kind == ErrorKind.INVALID
        with pytest.raises(RemoteError) as caught:
            files.read(sandbox.sandbox_id, "/workspace/no-such-file")
        assert caught.value.kind == ErrorKind.NOT_FOUND

    # Idle and resume -------------------------------------------------------------------

    def test_pause_then_connect_keeps_files_and_processes(self, backend: Backend, make_sandbox: SandboxFactory) -> None:
        info = make_sandbox()
        run(backend, info.sandbox_id, "echo kept > /workspace/kept.txt")
        run(backend, info.sandbox_id, "setsid nohup sleep 1000 > /dev/null 2>&1 < /dev/null &")
        paused = backend.pause(info.sandbox_id)
        assert paused.state in (SandboxState.PAUSED, SandboxState.STOPPED)
        assert backend.pause(info.sandbox_id).state == paused.state  # idempotent
        resumed = backend.connect(info.sandbox_id)
        assert resumed.state == SandboxState.RUNNING
        assert backend.connect(info.sandbox_id).state == SandboxState.RUNNING
        assert run(backend, info.sandbox_id, "cat /workspace/kept.txt") == "kept\n"
        if paused.state == SandboxState.PAUSED:  # a stopped sandbox loses its processes by design
            assert "sleep 1000" in run(backend, info.sandbox_id, "ps -eo args")

    # Persistent workspace --------------------------------------------------------------

    def test_workspace_volume_outlives_its_sandbox(
        self, backend: Backend, make_sandbox: SandboxFactory, volumes: VolumesCapability
    ) -> None:
        name = f"conformance-ws-{uuid.uuid4().hex[:10]}"
        owners = "stat -c %u /workspace /workspace/input /workspace/output"
        try:
            first = make_sandbox(workspace_volume=name)
            assert run(backend, first.sandbox_id, owners).split() == ["1000"] * 3
            run(backend, first.sandbox_id, "echo persisted > /workspace/output/state.txt")
            backend.delete(first.sandbox_id)
            second = make_sandbox(workspace_volume=name)
            kept = "cat /workspace/output/state.txt; stat -c %u /workspace/output/state.txt"
            assert run(backend, second.sandbox_id, kept) == "persisted\n1000\n"
            assert run(backend, second.sandbox_id, owners).split() == ["1000"] * 3
            backend.delete(second.sandbox_id)
        finally:
            volumes.delete(name)
        volumes.delete(name)  # idempotent
        third = make_sandbox(workspace_volume=name)  # deleted means gone: a fresh workspace
        try:
            assert run(backend, third.sandbox_id, "ls -A /workspace").split() == ["input", "output"]
            backend.delete(third.sandbox_id)
        finally:
            volumes.delete(name)

    # Snapshots -------------------------------------------------------------------------

    def test_snapshot_keeps_the_source_running_and_seeds_new_sandboxes(
        self,
        backend: Backend,
        make_sandbox: SandboxFactory,
        snapshots: SnapshotsCapability,
        test_run_id: str,
    ) -> None:
        source = make_sandbox()
        run(backend, source.sandbox_id, "echo from-source > /workspace/seed.txt")
        snapshot = snapshots.create(source.sandbox_id, name="conformance", labels={"test-run": test_run_id})
        try:
            assert snapshot.snapshot_id.startswith("snap-")
            assert backend.get(source.sandbox_id).state == SandboxState.RUNNING
            assert run(backend, source.sandbox_id, "echo still-here") == "still-here\n"
            assert snapshot.snapshot_id in {item.snapshot_id for item in snapshots.list()}
            child = make_sandbox(template_id=snapshot.snapshot_id)
            assert run(backend, child.sandbox_id, "cat /workspace/seed.txt") == "from-source\n"
            backend.delete(child.sandbox_id)
        finally:
            snapshots.delete(snapshot.snapshot_id)
        snapshots.delete(snapshot.snapshot_id)  # idempotent
        assert snapshot.snapshot_id not in {item.snapshot_id for item in snapshots.list()}

    # Errors ----------------------------------------------------------------------------

    def test_get_of_a_missing_sandbox_is_not_found(self, backend: Backend) -> None:
        with pytest.raises(RemoteError) as caught:
            backend.get(MISSING_SANDBOX_ID)
        assert caught.value.kind == ErrorKind.NOT_FOUND

    def test_exec_on_a_deleted_sandbox_is_not_found_or_gone(
        self, backend: Backend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox()
        backend.delete(info.sandbox_id)
        with pytest.raises(RemoteError) as caught:
            backend.exec(info.sandbox_id, ExecRequest(argv=("true",)))
        assert caught.value.kind in (ErrorKind.NOT_FOUND, ErrorKind.GONE)

    def test_create_from_an_unknown_template_names_it(self, backend: Backend, make_sandbox: SandboxFactory) -> None:
        with pytest.raises(RemoteError) as caught:
            make_sandbox(template_id="no-such-template-for-conformance")
        assert caught.value.kind in (ErrorKind.NOT_FOUND, ErrorKind.INVALID)
        assert "no-such-template-for-conformance" in caught.value.message

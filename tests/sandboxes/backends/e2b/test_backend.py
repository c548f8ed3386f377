"""The E2B backend against the fake E2B server: the conformance suite plus E2B's own rules.

The adapter is pointed at the fake only through its BackendConfig (endpoint, domain, API key,
`options["sandbox_url"]`, private endpoints allowed); everything else is the production path,
guarded transport included. The fake's containers run with network "none".
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import replace

import pytest

from sandboxes.backends.base import (
    ErrorKind,
    ExecRequest,
    ExecResult,
    ListQuery,
    NetworkSpec,
    PtySize,
    RemoteError,
    SandboxSpec,
    SandboxState,
    TemplateBuildSpec,
)
from sandboxes.backends.capabilities import PtyHandle
from sandboxes.backends.e2b.backend import E2BBackend
from sandboxes.backends.e2b.common import parse_time
from sandboxes.backends.e2b.settings import E2BOptions
from tests.fakes.fixtures import FakeHandle
from tests.personas import World
from tests.support.backend_conformance import (
    OFFLINE,
    BackendConformance,
    SandboxFactory,
    run,
    sandbox_factory,
    shell_request,
)

pytestmark = [pytest.mark.docker, pytest.mark.e2b]


@pytest.fixture(scope="module")
def template_id() -> str:
    return "base"


@pytest.fixture(scope="module")
def backend(fake_e2b_server: FakeHandle) -> Iterator[E2BBackend]:
    adapter = E2BBackend(fake_e2b_server.backend_config("e2b"))
    yield adapter
    adapter.close()


class TestE2BConformance(BackendConformance):
    """The shared contract, run against the fake E2B control plane and envd."""


# E2B-specific behaviour ---------------------------------------------------------------------


def fresh_backend(fake: FakeHandle, **options: str) -> tuple[E2BBackend, list[float]]:
    """A backend of its own whose retry waits are recorded instead of slept."""
    adapter = E2BBackend(fake.backend_config("e2b", **options))
    waits: list[float] = []
    adapter.sleep = waits.append
    return adapter, waits


@pytest.fixture
def make_sandbox(backend: E2BBackend, test_run_id: str) -> Iterator[SandboxFactory]:
    with sandbox_factory(backend, "base", test_run_id) as make:
        yield make


def read_until_error(handle: PtyHandle) -> None:
    for _ in range(100):
        handle.read(timeout=10)


def write_then_read_until_error(handle: PtyHandle, data: bytes) -> None:
    handle.write(data)
    read_until_error(handle)


class TestE2BRetries:
    """rate_limited and unavailable are retried with backoff for idempotent calls only."""

    def test_rate_limited_list_is_retried_honouring_retry_after(self, fake_e2b: FakeHandle) -> None:
        adapter, waits = fresh_backend(fake_e2b)
        fake_e2b.set_fault("status", status=429, retry_after=1, path=r"^/v2/sandboxes$", method="GET", times=2)
        adapter.list(ListQuery(metadata={"test-run": "nothing-here"}))
        assert waits == [1.0, 1.0]
        adapter.close()

    def test_backoff_grows_without_retry_after(self, fake_e2b: FakeHandle) -> None:
        adapter, waits = fresh_backend(fake_e2b)
        fake_e2b.set_fault("status", status=429, path=r"^/v2/sandboxes$", method="GET", times=3)
        adapter.list(ListQuery(metadata={"test-run": "nothing-here"}))
        assert len(waits) == 3
        assert 0 < waits[0] <= waits[1] <= waits[2] <= 1.0
        adapter.close()

    def test_unavailable_is_retried(self, fake_e2b: FakeHandle, make_sandbox: SandboxFactory) -> None:
        info = make_sandbox()
        adapter, waits = fresh_backend(fake_e2b)
        fake_e2b.set_fault("status", status=503, retry_after=2, path=f"^/sandboxes/{info.sandbox_id}$", times=2)
        assert adapter.get(info.sandbox_id).sandbox_id == info.sandbox_id
        assert waits == [2.0, 2.0]
        adapter.close()

    def test_retries_give_up_with_the_kind_and_retry_after(self, fake_e2b: FakeHandle) -> None:
        adapter, waits = fresh_backend(fake_e2b, retries="2")
        fake_e2b.set_fault("status", status=429, retry_after=3, path=r"^/v2/sandboxes$", method="GET")
        with pytest.raises(RemoteError) as caught:
            adapter.list(ListQuery())
        assert (caught.value.kind, caught.value.retryable, caught.value.retry_after) == (
            ErrorKind.RATE_LIMITED,
            True,
            3.0,
        )
        assert waits == [3.0, 3.0]
        adapter.close()

    def test_non_idempotent_calls_are_not_retried(self, fake_e2b: FakeHandle, make_sandbox: SandboxFactory) -> None:
        info = make_sandbox()
        adapter, waits = fresh_backend(fake_e2b)
        fake_e2b.set_fault("status", status=503, retry_after=1, path=r"/snapshots$", method="POST", times=1)
        snapshots = adapter.snapshots()
        assert snapshots is not None
        with pytest.raises(RemoteError) as caught:
            snapshots.create(info.sandbox_id, name="never")
        assert caught.value.kind == ErrorKind.UNAVAILABLE
        assert waits == []
        adapter.close()

    @pytest.mark.parametrize(
        ("status", "kind"),
        [
            (400, ErrorKind.INVALID),
            (401, ErrorKind.UNAUTHORIZED),
            (403, ErrorKind.FORBIDDEN),
            (404, ErrorKind.NOT_FOUND),
            (409, ErrorKind.CONFLICT),
            (410, ErrorKind.GONE),
            (429, ErrorKind.RATE_LIMITED),
            (500, ErrorKind.INTERNAL),
            (501, ErrorKind.UNSUPPORTED),
            (502, ErrorKind.UNAVAILABLE),
            (503, ErrorKind.UNAVAILABLE),
            (504, ErrorKind.TIMEOUT),
            (507, ErrorKind.QUOTA),
        ],
    )
    def test_every_status_maps_to_a_kind(self, fake_e2b: FakeHandle, status: int, kind: ErrorKind) -> None:
        adapter, _ = fresh_backend(fake_e2b, retries="0")
        fake_e2b.set_fault("status", status=status, path=r"^/v2/sandboxes$", method="GET", times=1)
        with pytest.raises(RemoteError) as caught:
            adapter.list(ListQuery())
        assert caught.value.kind == kind
        assert f"HTTP {status}" in caught.value.message
        adapter.close()

    def test_an_answer_of_the_wrong_shape_is_internal_not_a_vendor_error(self, fake_e2b: FakeHandle) -> None:
        adapter, _ = fresh_backend(fake_e2b, retries="0")
        # A 200 whose body is an object where the API promises a list.
        fake_e2b.set_fault("status", status=200, path=r"^/v2/sandboxes$", method="GET", times=1)
        with pytest.raises(RemoteError) as caught:
            adapter.list(ListQuery())
        assert caught.value.kind == ErrorKind.INTERNAL
        adapter.close()

    def test_wrong_key_is_unauthorized_and_health_says_so(self, fake_e2b: FakeHandle) -> None:
        adapter = E2BBackend(replace(fake_e2b.backend_config("e2b"), api_key="e2b_" + "1" * 40))
        with pytest.raises(RemoteError) as caught:
            adapter.list(ListQuery())
        assert caught.value.kind == ErrorKind.UNAUTHORIZED
        assert not adapter.health().ok
        adapter.close()

    def test_closed_port_is_unavailable(self, fake_e2b: FakeHandle) -> None:
        with socket.socket() as probe:  # a loopback port nobody listens on
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        config = replace(fake_e2b.backend_config("e2b", retries="1"), endpoint=f"http://127.0.0.1:{port}")
        adapter = E2BBackend(config)
        adapter.sleep = lambda _: None
        with pytest.raises(RemoteError) as caught:
            adapter.get("anything")
        assert caught.value.kind == ErrorKind.UNAVAILABLE
        assert not adapter.health().ok
        adapter.close()


class TestE2BFaults:
    """Listing loops, dropped streams and paused sandboxes."""

    def test_a_repeating_page_token_stops_the_listing(
        self, fake_e2b: FakeHandle, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        group = {"console-space": f"loop-{uuid.uuid4().hex[:8]}"}
        for _ in range(2):
            make_sandbox(metadata=group)
        fake_e2b.set_fault("repeat_token")
        with pytest.raises(RemoteError) as caught:
            list(backend.iter_sandboxes(ListQuery(metadata=group, limit=1)))
        assert caught.value.kind == ErrorKind.INTERNAL
        assert "repeated page token" in caught.value.message

    def test_a_dropped_pty_stream_is_reported(
        self, fake_e2b: FakeHandle, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox()
        ptys = backend.pty()
        fake_e2b.set_fault("drop_stream", after_events=2, path=r"Process/Start$", plane="envd", times=1)
        handle = ptys.open(info.sandbox_id, PtySize(cols=80, rows=24))
        with pytest.raises(RemoteError) as caught:
            # The cut may come before this input is sent (a prompt in two pieces) or after it;
            # the writer and the reader report it alike.
            write_then_read_until_error(handle, b"echo one; sleep 0.2; echo two; sleep 0.2; echo three\n")
        assert caught.value.kind == ErrorKind.UNAVAILABLE
        assert "cut" in caught.value.message
        assert not handle.is_running()
        handle.kill()

    def test_input_to_a_terminal_whose_stream_was_cut_reports_the_cut(
        self, fake_e2b: FakeHandle, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox()
        fake_e2b.set_fault("drop_stream", after_events=1, path=r"Process/Start$", plane="envd", times=1)
        handle = backend.pty().open(info.sandbox_id, PtySize(cols=80, rows=24))
        with suppress(RemoteError):
            handle.write(b"echo one\n")  # its output, if not a prompt before it, is the cut
        deadline = time.monotonic() + 10
        while handle.is_running():
            assert time.monotonic() < deadline, "the cut stream was not noticed"
            time.sleep(0.02)
        with pytest.raises(RemoteError) as caught:
            handle.write(b"echo two\n")
        assert caught.value.kind == ErrorKind.UNAVAILABLE
        assert "cut" in caught.value.message
        handle.kill()

    def test_a_dropped_exec_stream_is_reported(
        self, fake_e2b: FakeHandle, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox()
        fake_e2b.set_fault("drop_stream", after_events=1, path=r"Process/Start$", plane="envd", times=1)
        with pytest.raises(RemoteError) as caught:
            backend.exec(info.sandbox_id, shell_request("sleep 0.2; echo late"))
        assert caught.value.kind == ErrorKind.UNAVAILABLE

    def test_exec_on_a_paused_sandbox_without_auto_resume_is_a_conflict(
        self, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox(auto_resume=False)
        backend.pause(info.sandbox_id)
        with pytest.raises(RemoteError) as caught:
            backend.exec(info.sandbox_id, shell_request("true"))
        assert caught.value.kind == ErrorKind.CONFLICT
        backend.connect(info.sandbox_id)
        assert run(backend, info.sandbox_id, "echo back") == "back\n"

    def test_ttl_auto_pause_then_auto_resume_on_traffic(
        self, fake_e2b: FakeHandle, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox(auto_pause=True, auto_resume=True)
        run(backend, info.sandbox_id, "echo kept > /workspace/ttl.txt")
        fake_e2b.expire(info.sandbox_id)
        deadline = time.monotonic() + 10
        while backend.get(info.sandbox_id).state != SandboxState.PAUSED:
            assert time.monotonic() < deadline, "the TTL did not pause the sandbox"
            time.sleep(0.1)
        # Data-plane traffic resumes an auto-resume sandbox.
        assert run(backend, info.sandbox_id, "cat /workspace/ttl.txt") == "kept\n"
        assert backend.get(info.sandbox_id).state == SandboxState.RUNNING


class TestE2BMapping:
    """How the contract maps onto E2B: network switches, snapshots, templates, terminals."""

    def test_network_switches_are_always_sent_explicitly(
        self, fake_e2b: FakeHandle, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox(
            network=NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=True, deny_out=("10.0.0.0/8",))
        )
        with fake_e2b.http() as http:
            detail = http.get(f"/sandboxes/{info.sandbox_id}").json()
        assert detail["allowInternetAccess"] is True
        # No allow list: everything but the deny entries and netpolicy's always-denied IPv4
        # classes, which E2B gets as denyOut entries (an allowOut entry would beat them);
        # never a range starting at 0.0.0.0 but the deny-all itself.
        network = detail["network"]
        assert (network["allowPublicTraffic"], network["allowOut"]) == (True, [])
        assert network["denyOut"][0] == "10.0.0.0/8"
        for always in ("169.254.0.0/16", "127.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"):
            assert always in network["denyOut"], always
        assert not [entry for entry in network["denyOut"] if entry.startswith("0.0.0.0")]
        assert detail["lifecycle"] == {"autoResume": True, "onTimeout": "pause"}

    def test_an_allow_list_means_only_those_and_private_addresses_are_never_opened(
        self, fake_e2b: FakeHandle, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        # A non-empty allow list lets out only its entries. E2B lets an allowOut entry beat
        # denyOut, so "only these" is allowOut=list + denyOut=everything; a plain domain is
        # the name and its subdomains (E2B matches a plain name exactly: x and *.x); an allow
        # CIDR is sent as the parts netpolicy opens (0.0.0.0/0 never opens 10.0.0.0/8, link-
        # local or loopback), IPv4 only.
        only = make_sandbox(
            network=NetworkSpec.parse(
                allow_internet_access=True,
                allow_public_traffic=False,
                allow_out=("pypi.org", "203.0.113.0/24", "2001:db8::/32"),
            )
        )
        wide = make_sandbox(
            network=NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=("0.0.0.0/0",))
        )
        with fake_e2b.http() as http:
            first = http.get(f"/sandboxes/{only.sandbox_id}").json()["network"]
            second = http.get(f"/sandboxes/{wide.sandbox_id}").json()["network"]
        assert (first["allowOut"], first["denyOut"]) == (["pypi.org", "*.pypi.org", "203.0.113.0/24"], ["0.0.0.0/0"])
        opened = [ipaddress.IPv4Network(entry) for entry in second["allowOut"]]
        for public in ("8.8.8.8", "203.0.113.7", "1.1.1.1"):
            assert any(ipaddress.ip_address(public) in n for n in opened), public
        for never in ("10.1.2.3", "169.254.169.254", "127.0.0.1", "0.0.0.1", "172.17.0.1"):
            assert not any(ipaddress.ip_address(never) in n for n in opened), never
        assert not [str(n) for n in opened if n.network_address == ipaddress.ip_address("0.0.0.0")]
        # E2B never reaches a private address: a private exception or an allow entry inside a
        # private range is refused before anything is created, and not advertised.
        caps = backend.network_capabilities()
        assert (caps.deny_wins, caps.allow_private, caps.live_update) == (False, False, False)
        for network in (
            NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_private=("10.9.0.0/16",)),
            NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=("10.9.0.0/16",)),
        ):
            with pytest.raises(RemoteError) as caught:
                backend.create(SandboxSpec(template_id="base", network=network))
            assert caught.value.kind == ErrorKind.UNSUPPORTED
            assert "cannot open private addresses" in caught.value.message

    def test_what_e2b_cannot_do_is_refused_and_not_advertised(self, backend: E2BBackend) -> None:
        caps = backend.network_capabilities()
        assert (caps.deny_out_domain, caps.l7_rules) == (False, False)
        assert (caps.outbound_toggle, caps.inbound_toggle, caps.allow_out_domain) == (True, True, True)
        for network in (
            NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=True, deny_out=("example.com",)),
            NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=True, l7_rules=("allow a.com",)),
            # A deny CIDR beside allowed names: an allowed name's addresses would get through.
            NetworkSpec.parse(
                allow_internet_access=True,
                allow_public_traffic=True,
                allow_out=("api.example.com",),
                deny_out=("203.0.113.0/24",),
            ),
        ):
            with pytest.raises(RemoteError) as caught:
                backend.create(SandboxSpec(template_id="base", network=network))
            assert caught.value.kind == ErrorKind.UNSUPPORTED
        with pytest.raises(RemoteError) as caught:  # a name that is no E2B volume name
            backend.create(SandboxSpec(template_id="base", network=OFFLINE, workspace_volume="../ws"))
        assert caught.value.kind == ErrorKind.INVALID

    def test_a_workspace_is_an_e2b_volume_mounted_at_workspace(
        self, fake_e2b: FakeHandle, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        name = f"mapping-ws-{uuid.uuid4().hex[:8]}"
        volumes = backend.volumes()
        assert volumes is not None
        try:
            first = make_sandbox(workspace_volume=name)
            second = make_sandbox(workspace_volume=name)  # the volume exists now: found by name
            with fake_e2b.http() as http:
                listed = [row for row in http.get("/volumes").json() if row["name"] == name]
                detail = http.get(f"/sandboxes/{second.sandbox_id}").json()
            assert len(listed) == 1
            assert detail["volumeMounts"] == [{"name": name, "path": "/workspace"}]
            run(backend, first.sandbox_id, "echo shared > /workspace/output/both.txt")
            assert run(backend, second.sandbox_id, "cat /workspace/output/both.txt") == "shared\n"
        finally:
            volumes.delete(name)  # E2B deletes a mounted volume too
        with fake_e2b.http() as http:
            assert name not in {row["name"] for row in http.get("/volumes").json()}
        volumes.delete(name)

    def test_a_team_without_volumes_is_told_so(self, fake_e2b: FakeHandle, backend: E2BBackend) -> None:
        # E2B answers 403 while volumes are not enabled for the team (infra volume_create.go).
        fake_e2b.set_fault(
            "status", status=403, path=r"^/volumes$", method="POST", message="use of volumes is not enabled"
        )
        with pytest.raises(RemoteError) as caught:
            backend.create(
                SandboxSpec(template_id="base", network=OFFLINE, workspace_volume=f"ws-{uuid.uuid4().hex[:8]}")
            )
        assert caught.value.kind == ErrorKind.UNSUPPORTED
        assert "use of volumes is not enabled" in caught.value.message

    def test_traffic_token_and_public_url(self, backend: E2BBackend, make_sandbox: SandboxFactory) -> None:
        info = make_sandbox(network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False))
        inbound = backend.inbound()
        assert inbound is not None
        assert info.traffic_token
        assert inbound.traffic_token(info.sandbox_id) == info.traffic_token
        assert inbound.public_url(info.sandbox_id, 8080) == f"https://8080-{info.sandbox_id}.{backend.domain}"

    def test_snapshot_ids_are_presented_as_snap_and_kept_out_of_templates(
        self, fake_e2b: FakeHandle, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox()
        snapshots, templates = backend.snapshots(), backend.templates()
        assert snapshots is not None
        assert templates is not None
        snapshot = snapshots.create(info.sandbox_id, name="mapping")
        try:
            # E2B's own id (team/name:tag) behind the snap- prefix, faithfully.
            raw = snapshot.snapshot_id.removeprefix("snap-")
            with fake_e2b.http() as http:
                listed = [row["snapshotID"] for row in http.get("/snapshots").json()]
            assert raw in listed
            assert "/" in raw
            template_ids = {t.template_id for t in templates.list()}
            assert "base" in template_ids
            assert raw not in template_ids
            assert snapshot.snapshot_id not in template_ids
            with pytest.raises(RemoteError) as caught:
                templates.get(snapshot.snapshot_id)
            assert caught.value.kind == ErrorKind.NOT_FOUND
            with pytest.raises(RemoteError) as caught:
                templates.create(TemplateBuildSpec(name="x"))
            assert caught.value.kind == ErrorKind.UNSUPPORTED
        finally:
            snapshots.delete(snapshot.snapshot_id)

    def test_exec_timeout_kills_the_whole_process_group(
        self, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox()
        result = backend.exec(info.sandbox_id, shell_request("sleep 300 & sleep 301; wait", timeout_s=1))
        assert (result.timed_out, result.exit_code) == (True, 137)
        assert run(backend, info.sandbox_id, "pgrep -f 'sleep 30[01]' || true") == ""

    def test_pty_is_long_lived_writes_resizes_and_is_killed(
        self, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox()
        handle = backend.pty().open(info.sandbox_id, PtySize(cols=80, rows=24))
        assert handle.is_running()
        handle.resize(PtySize(cols=100, rows=30))
        handle.write(b"stty size; id -u\n")
        seen = b""
        deadline = time.monotonic() + 15
        while b"30 100" not in seen or b"1000" not in seen:
            assert time.monotonic() < deadline, seen
            seen += handle.read(timeout=10)
        handle.kill()
        assert not handle.is_running()
        handle.kill()  # idempotent


# The E2B wire both ways: encoding as infra decodes, proto3-JSON defaults ---------------------


@pytest.fixture(scope="class")
def spec_backend(fake_e2b_spec_server: FakeHandle) -> Iterator[E2BBackend]:
    adapter = E2BBackend(fake_e2b_spec_server.backend_config("e2b"))
    yield adapter
    adapter.close()


class TestE2BSpecConformance(BackendConformance):
    """The shared contract against a control plane built from the published spec (no SDK
    /v2 create or connect): the adapter falls back to the spec's operations."""

    @pytest.fixture(scope="class")
    def backend(self, spec_backend: E2BBackend) -> E2BBackend:
        return spec_backend


def _api_calls(fake: FakeHandle) -> list[tuple[str, str]]:
    return [(method, path) for plane, method, path in fake.requests() if plane == "api"]


class TestE2BProtocol:
    def test_a_spec_control_plane_gets_the_spec_create_and_it_is_remembered(
        self, fake_e2b_spec_server: FakeHandle, test_run_id: str
    ) -> None:
        # POST /v2/sandboxes is not in e2b-dev/infra's spec: such a server answers 405.
        adapter = E2BBackend(fake_e2b_spec_server.backend_config("e2b"))
        spec = SandboxSpec(template_id="base", network=OFFLINE, metadata={"test-run": test_run_id})
        first = adapter.create(spec)
        fake_e2b_spec_server.forget_requests()
        second = adapter.create(spec)
        try:
            assert adapter.protocol == "e2b-v1"
            assert ("POST", "/v2/sandboxes") not in _api_calls(fake_e2b_spec_server)
            assert run(adapter, second.sandbox_id, "echo spec") == "spec\n"
            health = adapter.health()
            assert (health.ok, health.protocol) == (True, "e2b-v1")
        finally:
            adapter.delete(first.sandbox_id)
            adapter.delete(second.sandbox_id)
            adapter.close()

    def test_the_cloud_is_detected_as_v2(self, fake_e2b: FakeHandle) -> None:
        adapter = E2BBackend(fake_e2b.backend_config("e2b"))
        assert adapter.health().protocol == "e2b-v2"
        adapter.close()

    def test_a_pinned_flavour_is_kept(self, fake_e2b_spec_server: FakeHandle) -> None:
        config = fake_e2b_spec_server.backend_config("e2b", protocol="e2b-v2", protocol_pinned="1")
        adapter = E2BBackend(config)
        with pytest.raises(RemoteError) as caught:
            adapter.create(SandboxSpec(template_id="base", network=OFFLINE))
        assert caught.value.kind == ErrorKind.UNSUPPORTED
        assert "no such operation" in caught.value.message
        adapter.close()

    def test_connect_is_one_call_and_keeps_the_traffic_token(
        self, fake_e2b: FakeHandle, backend: E2BBackend, make_sandbox: SandboxFactory
    ) -> None:
        # The connect answer carries what a warm resolve needs; its trafficAccessToken was
        # dropped (a second call, GET /sandboxes/{id}, has none).
        info = make_sandbox(
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False), metadata={"k": "v"}
        )
        fresh = E2BBackend(fake_e2b.backend_config("e2b"))  # knows nothing of the sandbox
        fake_e2b.forget_requests()
        connected = fresh.connect(info.sandbox_id)
        assert _api_calls(fake_e2b) == [("POST", f"/sandboxes/{info.sandbox_id}/connect")]
        assert connected.sandbox_id == info.sandbox_id
        assert connected.state == SandboxState.RUNNING
        assert connected.traffic_token == info.traffic_token is not None
        inbound = fresh.inbound()
        assert inbound is not None
        assert inbound.traffic_token(info.sandbox_id) == info.traffic_token
        assert backend.connect(info.sandbox_id).metadata["k"] == "v"
        fresh.close()

    @pytest.mark.parametrize("value", ["a&b=c", "a+b", "100%", "x y=z&w", "%2B", "ü/?#"])
    def test_metadata_filters_round_trip_any_value(
        self, backend: E2BBackend, make_sandbox: SandboxFactory, value: str
    ) -> None:
        # infra's parseFilters unescapes the whole value, splits on & and =, then unescapes
        # each key and value: one level of escaping short, `a&b=c` read as {a, b: c}.
        group = {"console-session": f"{value}-{uuid.uuid4().hex[:6]}", "k&=+": value}
        info = make_sandbox(metadata=group)
        page = backend.list(ListQuery(metadata=group))
        assert [item.sandbox_id for item in page.items] == [info.sandbox_id]

    def test_a_process_killed_by_a_signal_exits_137(self, backend: E2BBackend, make_sandbox: SandboxFactory) -> None:
        # envd (protojson) leaves `exited: false` out; it was read as exited, code -1.
        info = make_sandbox()
        results: list[ExecResult] = []
        worker = threading.Thread(
            target=lambda: results.append(backend.exec(info.sandbox_id, ExecRequest(argv=("sleep", "30")))),
            daemon=True,
        )
        worker.start()
        deadline = time.monotonic() + 10
        pids: list[int] = []
        while not pids:
            assert time.monotonic() < deadline, "the command did not start"
            listed = backend.rpc(info.sandbox_id, "process.Process/List", {}, "listing processes")
            pids = [
                p["pid"] for p in listed.get("processes") or [] if "sleep" in (p.get("config") or {}).get("args", [])
            ]
            time.sleep(0.1)
        backend.rpc(
            info.sandbox_id,
            "process.Process/SendSignal",
            {"process": {"pid": pids[0]}, "signal": "SIGNAL_SIGKILL"},
            "killing",
        )
        worker.join(15)
        assert results
        assert (results[0].exit_code, results[0].timed_out) == (137, False)


@pytest.mark.django_db
def test_create_and_connect_send_the_configs_idle_timeout(fake_e2b: FakeHandle, test_run_id: str) -> None:
    # Every connect sent 300 s: a config's 3600 s idle timeout collapsed after a warm resolve.
    from sandboxes.catalog.bridge import backend_config_for
    from tests.factories import make_config, make_space

    config = make_config(
        make_space(),
        **fake_e2b.platform_fields(sandbox_url=fake_e2b.proxy_url),
        default_template="base",
        idle_timeout_s=3600,
    )
    adapter = E2BBackend(backend_config_for(config))
    info = adapter.create(
        SandboxSpec(template_id="base", network=OFFLINE, metadata={"test-run": test_run_id}, timeout_s=3600)
    )
    try:
        with fake_e2b.http() as http:
            http.post(f"/sandboxes/{info.sandbox_id}/timeout", json={"timeout": 5})
        connected = adapter.connect(info.sandbox_id)
        remaining = (backend_end_at(fake_e2b, info.sandbox_id) - time.time()) if connected else 0
        assert remaining > 3000
    finally:
        adapter.delete(info.sandbox_id)
        adapter.close()


def backend_end_at(fake: FakeHandle, sandbox_id: str) -> float:
    row = next(row for row in fake.state()["sandboxes"] if row["sandboxID"] == sandbox_id)
    end = parse_time(row["endAt"])
    assert end is not None
    return end.timestamp()


@pytest.mark.django_db
def test_the_connection_test_records_the_protocol_and_the_page_shows_it(
    world: World, fake_e2b_spec_server: FakeHandle
) -> None:
    # The config never recorded what it talks to; a pinned protocol is passed to the adapter.
    from sandboxes.catalog.bridge import backend_config_for
    from sandboxes.catalog.services import run_connection_test
    from tests.factories import make_config

    config = make_config(
        world.space_a,
        **fake_e2b_spec_server.platform_fields(sandbox_url=fake_e2b_spec_server.proxy_url),
        default_template="base",
    )
    steps = run_connection_test(config, lambda step: None)
    assert all(step.ok for step in steps), [step.as_json() for step in steps]
    config.refresh_from_db()
    assert config.backend_protocol == "e2b-v1"
    assert E2BOptions.parse(backend_config_for(config).options).protocol == "e2b-v1"
    page = world.client_for("alice").get(config.get_absolute_url()).content.decode()
    assert "<code>e2b-v1</code> (detected)" in page
    config.protocol_pin = "e2b-v2"
    config.save(update_fields=["protocol_pin"])
    assert E2BOptions.parse(backend_config_for(config).options).protocol_pinned is True
    page = world.client_for("alice").get(config.get_absolute_url()).content.decode()
    assert "<code>e2b-v2</code> (pinned)" in page


@pytest.mark.parametrize("header", ["X-API-Key", "X-Access-Token"])
def test_an_error_answer_that_repeats_a_credential_is_shown_without_it(header: str) -> None:
    """Error messages reach health details, job errors and pages a space admin sees; a
    server (or a proxy in front of it) that echoes the key it was sent must not leak it."""
    import httpx

    from sandboxes.backends.e2b.common import status_error

    secret = "e2b_0123456789abcdef0123456789abcdef"
    request = httpx.Request("GET", "https://api.example.com/v2/sandboxes", headers={header: secret})
    for response in (
        httpx.Response(401, json={"code": 401, "message": f"Invalid API key {secret}"}, request=request),
        httpx.Response(502, text=f"upstream refused key={secret}", request=request),
    ):
        error = status_error(response, "listing sandboxes")
        assert secret not in error.message
        assert "***" in error.message

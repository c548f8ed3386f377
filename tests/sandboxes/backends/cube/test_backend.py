"""The Cube backend against the fake Cube server (its newest release): the conformance suite
plus one test per Cube quirk the adapter handles (each names the quirk it pins). What differs
per release is in test_releases.py."""

from __future__ import annotations

import ipaddress
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxes.backends.base import (
    ErrorKind,
    ExecRequest,
    ListQuery,
    NetworkSpec,
    RemoteError,
    SandboxSpec,
    SandboxState,
    TemplateBuildSpec,
)
from sandboxes.backends.cube.backend import CubeBackend
from sandboxes.backends.cube.rules import CUBE_MAX_RULES, MAX_CONSOLE_RULES, cube_rules
from sandboxes.catalog.network import unsupported_policy_switches
from tests.fakes.cube_egress import egress_allows, rules_error
from tests.fakes.fixtures import FakeHandle
from tests.support.backend_conformance import (
    OFFLINE,
    BackendConformance,
    SandboxFactory,
    run,
    sandbox_factory,
    shell_request,
)
from tests.support.remote_egress import remote_verdict

pytestmark = [pytest.mark.docker, pytest.mark.e2b, pytest.mark.cube]


@pytest.fixture(scope="module")
def template_id() -> str:
    return "base"


def workspace_options(root: Path, test_run_id: str) -> dict[str, str]:
    """What backend_config_for passes a Cube config with a workspace host root."""
    return {
        "workspace_host_root": str(root),
        "workspace_template": "base",
        "housekeeping_metadata": json.dumps({"test-run": test_run_id}),
    }


@pytest.fixture(scope="module")
def backend(fake_cube_server: FakeHandle, cube_host_root: Path, test_run_id: str) -> Iterator[CubeBackend]:
    adapter = CubeBackend(fake_cube_server.backend_config("cube", **workspace_options(cube_host_root, test_run_id)))
    yield adapter
    adapter.close()


class TestCubeConformance(BackendConformance):
    """The shared contract, run against every Cube release the fake answers as (envd 0.2.0)."""

    @pytest.fixture(scope="class")
    def backend(self, fake_cube_release: FakeHandle, cube_host_root: Path, test_run_id: str) -> Iterator[CubeBackend]:
        adapter = CubeBackend(
            fake_cube_release.backend_config("cube", **workspace_options(cube_host_root, test_run_id))
        )
        yield adapter
        adapter.close()


# Cube quirks: each test names the quirk it pins and fails without the adapter's handling.


@pytest.fixture
def make_sandbox(backend: CubeBackend, test_run_id: str) -> Iterator[SandboxFactory]:
    with sandbox_factory(backend, "base", test_run_id) as make:
        yield make


def recording_backend(fake: FakeHandle, *, really_sleep: bool = False) -> tuple[CubeBackend, list[float]]:
    adapter = CubeBackend(fake.backend_config("cube"))
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if really_sleep:
            time.sleep(seconds)

    adapter.sleep = sleep
    return adapter, waits


class TestCubeQuirks:
    def test_health_records_the_cube_release(self, backend: CubeBackend) -> None:
        # Quirk: releases differ; the probed release is the version (tests/.../test_releases.py).
        health = backend.health()
        assert health.ok
        assert health.version.startswith("CubeSandbox v0.6.0 or later:")
        assert health.protocol == "cube-0.6"

    def test_list_pages_client_side(
        self, fake_cube: FakeHandle, backend: CubeBackend, make_sandbox: SandboxFactory
    ) -> None:
        # Quirk: Cube lists have no cursor (no X-Next-Token, nextToken ignored).
        group = {"console-space": f"pages-{uuid.uuid4().hex[:8]}"}
        made = {make_sandbox(metadata=group).sandbox_id for _ in range(3)}
        with fake_cube.http() as http:
            raw = http.get("/v2/sandboxes", params={"limit": 1})
        assert "x-next-token" not in raw.headers
        first = backend.list(ListQuery(metadata=group, limit=2))
        assert len(first.items) == 2
        assert first.next_token
        second = backend.list(ListQuery(metadata=group, limit=2, page_token=first.next_token))
        assert {i.sandbox_id for i in first.items + second.items} == made
        assert second.next_token is None

    def test_metadata_needing_escapes_still_lists(self, backend: CubeBackend, make_sandbox: SandboxFactory) -> None:
        # Quirk: Cube's metadata filter skips the per-pair URL decoding, so escaped values
        # never match server-side; the adapter filters them client-side.
        value = f"a b=c&d {uuid.uuid4().hex[:6]}"
        info = make_sandbox(metadata={"console-session": value})
        page = backend.list(ListQuery(metadata={"console-session": value}))
        assert [item.sandbox_id for item in page.items] == [info.sandbox_id]
        assert page.items[0].metadata["console-session"] == value

    def test_pausing_state_is_listed_and_delete_waits_it_out(
        self, fake_cube: FakeHandle, make_sandbox: SandboxFactory
    ) -> None:
        # Quirk: `pausing` (which the SDK cannot parse) and DELETE 503 + Retry-After while pausing.
        adapter, waits = recording_backend(fake_cube, really_sleep=True)
        info = make_sandbox()
        fake_cube.configure(cube_pause_seconds=3)
        assert adapter.pause(info.sandbox_id).state == SandboxState.PAUSING
        page = adapter.list(ListQuery(metadata=dict(info.metadata), states=frozenset({SandboxState.PAUSING})))
        assert [item.sandbox_id for item in page.items] == [info.sandbox_id]
        adapter.delete(info.sandbox_id)
        assert waits
        assert waits[0] == 2.0
        with pytest.raises(RemoteError) as caught:
            adapter.get(info.sandbox_id)
        assert caught.value.kind == ErrorKind.NOT_FOUND
        adapter.close()

    def test_a_killed_sandbox_is_gone_on_the_data_plane(
        self, fake_cube: FakeHandle, backend: CubeBackend, make_sandbox: SandboxFactory
    ) -> None:
        # Quirk: CubeProxy answers 410 for a killed sandbox: gone, rebuild.
        info = make_sandbox()
        run(backend, info.sandbox_id, "true")  # the adapter knows the sandbox's envd
        with fake_cube.http() as http:  # killed behind the console's back (TTL, node loss)
            assert http.delete(f"/sandboxes/{info.sandbox_id}").status_code == 204
        with pytest.raises(RemoteError) as caught:
            backend.exec(info.sandbox_id, shell_request("true"))
        assert caught.value.kind == ErrorKind.GONE
        files = backend.files()
        with pytest.raises(RemoteError) as caught:
            files.read(info.sandbox_id, "/etc/hostname")
        assert caught.value.kind == ErrorKind.GONE

    def test_resume_failure_503_on_the_data_plane_is_retried(
        self, fake_cube: FakeHandle, make_sandbox: SandboxFactory
    ) -> None:
        # Quirk: a failed resume-on-traffic answers 503 + Retry-After: 5; the call is retried.
        adapter, waits = recording_backend(fake_cube)
        info = make_sandbox()
        adapter.pause(info.sandbox_id)
        fake_cube.configure(resume_failures=1)
        assert run(adapter, info.sandbox_id, "echo resumed") == "resumed\n"
        assert waits == [5.0]
        adapter.pause(info.sandbox_id)
        fake_cube.configure(resume_failures=1)
        assert adapter.files().read(info.sandbox_id, "/etc/hostname")  # reads are retried too
        assert waits == [5.0, 5.0]
        adapter.close()

    def test_traffic_token_only_at_create_is_kept(self, backend: CubeBackend, make_sandbox: SandboxFactory) -> None:
        # Quirk: the traffic token is only in the create answer (never on connect or get).
        info = make_sandbox()
        assert info.traffic_token
        backend.pause(info.sandbox_id)
        backend.connect(info.sandbox_id)
        inbound = backend.inbound()
        assert inbound is not None
        assert inbound.traffic_token(info.sandbox_id) == info.traffic_token
        assert inbound.public_url(info.sandbox_id, 3000) == f"https://3000-{info.sandbox_id}.cube.app"

    def test_l7_rules_are_sent_as_cube_list_meaning_the_console_rules(
        self, fake_cube: FakeHandle, backend: CubeBackend, make_sandbox: SandboxFactory
    ) -> None:
        # Quirk: Cube's L7 rules are a list (E2B's object keyed by domain is a 400), first
        # match wins, no match refused, hosts exact or `*.x` (CubeEgress access_phase.lua).
        # The rules sent must mean the console's: a plain domain covers its subdomains, a
        # path is a prefix, a host no rule names follows the lists (here: open).
        network = NetworkSpec.parse(
            allow_internet_access=True,
            allow_public_traffic=True,
            l7_rules=(
                {"domain": "api.example.test", "methods": ["get"], "path_prefix": "/v1", "action": "allow"},
                {"domain": "*.wild.test", "action": "deny"},
            ),
        )
        info = make_sandbox(network=network)
        with fake_cube.http() as http:
            detail = http.get(f"/sandboxes/{info.sandbox_id}").json()
        rules = detail["network"]["rules"]
        assert rules_error(rules) == ""  # unique names, within CubeEgress's limit
        assert len({r["name"] for r in rules}) == len(rules)

        def verdict(url: str, method: str = "GET") -> bool:
            scheme, rest = url.split("://", 1)
            host, _, path = rest.partition("/")
            tls = scheme == "https"
            return egress_allows(
                rules, scheme=scheme, sni=host if tls else None, host=host, method=method, path="/" + path
            )

        assert verdict("http://api.example.test/v1/x")
        assert verdict("http://v2.api.example.test/v1x")  # a plain domain: its subdomains too
        assert verdict("http://API.example.test./v1/x")  # a Host with a trailing dot
        assert not verdict("http://api.example.test/v1/x", "POST")  # named, matched by no rule
        assert not verdict("http://api.example.test/v2")
        assert not verdict("http://x.wild.test/")
        assert verdict("http://wild.test/")  # *.x never the name itself: no rule names it
        assert verdict("http://other.test/anything", "DELETE")  # no rule names it: the lists decide
        assert verdict("https://api.example.test/v2")  # TLS: by SNI, an allow decides
        assert not verdict("https://x.wild.test/")
        assert verdict("https://other.test/")
        assert detail["allowInternetAccess"] is True
        caps = backend.network_capabilities()
        assert (caps.l7_rules, caps.deny_out_domain, caps.inbound_toggle) == (True, False, True)

    def test_http_rules_name_nothing_the_lists_refuse(
        self, fake_cube: FakeHandle, backend: CubeBackend, make_sandbox: SandboxFactory, test_run_id: str
    ) -> None:
        # Quirk: every name a rule's host/sni carries becomes an L7 target that Cube's packet
        # filter sends to the proxy before the lists (network-agent
        # extractL7AllowOutTargetsFromRules, CubeNet classify_egress_flow). So a rule is cut
        # to what the allow list lets out, no rules go with outbound off, and deny CIDRs
        # beside rules are refused with words.
        def sent(network: NetworkSpec) -> dict[str, Any]:
            info = make_sandbox(network=network)
            (row,) = [r for r in fake_cube.state()["sandboxes"] if r["sandboxID"] == info.sandbox_id]
            return {"allow_internet_access": row["allow_internet_access"], "network": row["network"]}

        def reached(body: dict[str, Any], url: str) -> bool:
            host = url.split("://", 1)[1].split("/", 1)[0]
            return remote_verdict(
                body,
                name=host,
                address=ipaddress.ip_address("203.0.113.9"),
                web=True,
                http=True,
                tls=url.startswith("https"),
                method=None if url.startswith("https") else "GET",
                path="/" + url.split("://", 1)[1].partition("/")[2],
            )

        allow_list = sent(
            NetworkSpec.parse(
                allow_internet_access=True,
                allow_public_traffic=False,
                allow_out=("example.zone.test", "*.wild.zone.test"),
                l7_rules=("allow other.zone.test", "allow *.zone.test GET /v1/", "deny api.example.zone.test"),
            )
        )
        assert not reached(allow_list, "http://other.zone.test/")  # outside the allow list
        assert not reached(allow_list, "https://other.zone.test/")
        assert not reached(allow_list, "http://wild.zone.test/v1/")  # *.wild.zone.test: not wild.zone.test
        assert reached(allow_list, "http://x.wild.zone.test/v1/a")
        assert reached(allow_list, "http://example.zone.test/v1/a")
        assert not reached(allow_list, "http://api.example.zone.test/v2/")
        hosts = {str(r["match"].get("host") or r["match"].get("sni")) for r in allow_list["network"]["rules"]}
        assert not any("other.zone.test" in h or h.rstrip(".") in ("zone.test", "*.zone.test") for h in hosts), hosts

        off = sent(
            NetworkSpec.parse(
                allow_internet_access=False, allow_public_traffic=False, l7_rules=("allow other.zone.test",)
            )
        )
        assert "rules" not in off["network"]
        assert not reached(off, "http://other.zone.test/")

        denied = NetworkSpec.parse(
            allow_internet_access=True,
            allow_public_traffic=False,
            deny_out=("203.0.113.0/24",),
            l7_rules=("allow other.zone.test",),
        )
        caps = backend.network_capabilities()
        assert caps.l7_within_deny is False
        (problem,) = unsupported_policy_switches(denied, caps)
        assert problem.startswith("deny entries (203.0.113.0/24) beside HTTP (L7) rules")
        with pytest.raises(RemoteError) as caught:
            backend.create(SandboxSpec(template_id="base", network=denied, metadata={"test-run": test_run_id}))
        assert caught.value.kind == ErrorKind.UNSUPPORTED
        assert "whatever the deny list says" in str(caught.value)

    def test_more_http_rules_than_cube_holds_are_refused_with_words(
        self, fake_cube: FakeHandle, backend: CubeBackend, test_run_id: str
    ) -> None:
        # Quirk: CubeEgress holds at most 256 rules per sandbox (policy.lua); each console rule
        # takes up to 12 there, so beyond MAX_CONSOLE_RULES the policy is refused, not cut.
        caps = backend.network_capabilities()
        assert caps.max_l7_rules == MAX_CONSOLE_RULES
        lines = [f"deny host{n}.example.test GET /p{n}" for n in range(MAX_CONSOLE_RULES + 1)]
        network = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=True, l7_rules=lines)
        problems = unsupported_policy_switches(network, caps)
        assert problems == [f"more than {MAX_CONSOLE_RULES} HTTP (L7) rules ({MAX_CONSOLE_RULES + 1})"]
        before = len(fake_cube.state()["sandboxes"])
        with pytest.raises(RemoteError) as caught:
            backend.create(SandboxSpec(template_id="base", network=network, metadata={"test-run": test_run_id}))
        assert caught.value.kind == ErrorKind.UNSUPPORTED
        assert "at most 256 rules" in str(caught.value)
        assert len(fake_cube.state()["sandboxes"]) == before
        fitting = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=True, l7_rules=lines[:-1])
        assert len(cube_rules(fitting.l7_rules)) <= CUBE_MAX_RULES
        # Cut to an allow list, one rule can become several (one per allow entry inside it).
        wide = NetworkSpec.parse(
            allow_internet_access=True,
            allow_public_traffic=True,
            allow_out=tuple(f"h{n}.wide.test" for n in range(30)),
            l7_rules=("deny *.wide.test GET /admin",),
        )
        with pytest.raises(RemoteError) as caught:
            backend.create(SandboxSpec(template_id="base", network=wide, metadata={"test-run": test_run_id}))
        assert "cut to the allow list's domains they become" in str(caught.value)

    def test_a_domain_allow_list_is_sent_with_the_deny_all_cube_requires(
        self, fake_cube: FakeHandle, backend: CubeBackend, make_sandbox: SandboxFactory
    ) -> None:
        # Quirk: CubeAPI rejects a domain in allowOut unless outbound is off or 0.0.0.0/0 is
        # denied (a 400). A non-empty allow list means "only these", which the
        # adapter sends as allowOut=list + denyOut=0.0.0.0/0: accepted.
        # A plain domain is the name and its subdomains: Cube gets `x` and `*.x`.
        network = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=True, allow_out=("example.com",))
        info = make_sandbox(network=network)
        # Cube reaches private addresses: a private exception is an allowOut entry beside the
        # always-denied denyOut (where the space allows everything else).
        exception = make_sandbox(
            network=NetworkSpec.parse(
                allow_internet_access=True, allow_public_traffic=True, allow_private=("10.9.0.0/16",)
            )
        )
        with fake_cube.http() as http:
            detail = http.get(f"/sandboxes/{info.sandbox_id}").json()
            second = http.get(f"/sandboxes/{exception.sandbox_id}").json()["network"]
        assert (detail["network"]["allowOut"], detail["network"]["denyOut"]) == (
            ["example.com", "*.example.com"],
            ["0.0.0.0/0"],
        )
        assert second["allowOut"] == ["10.9.0.0/16"]
        assert "10.0.0.0/8" in second["denyOut"]
        assert not [entry for entry in second["denyOut"] if entry.startswith("0.0.0.0")]
        caps = backend.network_capabilities()
        assert (caps.deny_wins, caps.allow_private, caps.live_update) == (False, True, False)

    def test_host_mount_metadata_is_reserved(self, backend: CubeBackend) -> None:
        # Quirk: Cube lifts `host-mount` out of the labels into a host bind mount.
        with pytest.raises(RemoteError) as caught:
            backend.create(SandboxSpec(template_id="base", network=OFFLINE, metadata={"host-mount": "[]"}))
        assert caught.value.kind == ErrorKind.INVALID

    def test_a_workspace_is_a_host_directory_made_and_removed_by_housekeeping(
        self, fake_cube: FakeHandle, backend: CubeBackend, make_sandbox: SandboxFactory, cube_host_root: Path
    ) -> None:
        # Quirk: `host-mount` binds a node directory, which Cube neither makes (the bind mount
        # of a missing one fails) nor removes: housekeeping sandboxes do both.
        name = f"quirk-ws-{uuid.uuid4().hex[:8]}"
        info = make_sandbox(workspace_volume=name)
        host_dir = cube_host_root / name
        assert host_dir.is_dir()
        assert host_dir.stat().st_uid == 1000
        state = {row["sandboxID"]: row for row in fake_cube.state()["sandboxes"]}
        assert json.loads(state[info.sandbox_id]["annotations"]["host-mount"]) == [
            {"hostPath": str(host_dir), "mountPath": "/workspace", "readOnly": False}
        ]
        assert "host-mount" not in backend.get(info.sandbox_id).metadata  # never echoed
        # The housekeeping sandbox that made the directory is gone again.
        assert not [row for row in state.values() if row["metadata"].get("console-purpose")]
        run(backend, info.sandbox_id, "echo hi > /workspace/output/hi.txt")
        assert (host_dir / "output" / "hi.txt").read_text() == "hi\n"
        backend.delete(info.sandbox_id)
        volumes = backend.volumes()
        assert volumes is not None
        volumes.delete(name)
        assert not host_dir.exists()
        volumes.delete(name)  # idempotent

    def test_a_missing_host_root_fails_the_create_and_leaves_nothing(
        self, fake_cube: FakeHandle, cube_host_root: Path, test_run_id: str
    ) -> None:
        # Quirk: a root that does not exist on the node cannot be bind-mounted either: the
        # create fails with both reasons, and no sandbox is left behind.
        missing = cube_host_root / f"missing-{uuid.uuid4().hex[:6]}"
        adapter = CubeBackend(fake_cube.backend_config("cube", **workspace_options(missing, test_run_id)))
        before = {row["sandboxID"] for row in fake_cube.state()["sandboxes"]}
        with pytest.raises(RemoteError) as caught:
            adapter.create(SandboxSpec(template_id="base", network=OFFLINE, workspace_volume="ws-nowhere"))
        assert caught.value.kind == ErrorKind.INTERNAL
        assert "making the workspace directory failed too" in caught.value.message
        assert {row["sandboxID"] for row in fake_cube.state()["sandboxes"]} == before
        adapter.close()

    def test_without_a_host_root_there_is_no_persistent_workspace(self, fake_cube: FakeHandle) -> None:
        adapter = CubeBackend(fake_cube.backend_config("cube"))
        assert adapter.volumes() is None
        with pytest.raises(RemoteError) as caught:
            adapter.create(SandboxSpec(template_id="base", network=OFFLINE, workspace_volume="ws"))
        assert caught.value.kind == ErrorKind.UNSUPPORTED
        for root in ("relative/dir", "/", "/srv/../etc", "/srv/with space", "/srv/trailing/"):
            with pytest.raises(RemoteError) as caught:
                CubeBackend(fake_cube.backend_config("cube", workspace_host_root=root))
            assert caught.value.kind == ErrorKind.INVALID, root
        adapter.close()

    def test_old_envd_gets_the_user_named_explicitly(self, backend: CubeBackend, make_sandbox: SandboxFactory) -> None:
        # Quirk: envd 0.2.0 has no default user (the SDK forces `user`): files written as
        # root must be root's, and the Start `stdin` flag is omitted below envd 0.3.0.
        info = make_sandbox()
        files = backend.files()
        files.write(info.sandbox_id, "/root/owned.txt", b"root's", user="root")
        assert run(backend, info.sandbox_id, "stat -c %u /root/owned.txt", user="root").strip() == "0"
        result = backend.exec(info.sandbox_id, ExecRequest(argv=("cat",)))  # no stdin: EOF, not a hang
        assert (result.exit_code, result.stdout) == (0, b"")

    def test_snapshot_ids_are_cube_snap_ids_usable_as_templates(
        self, backend: CubeBackend, make_sandbox: SandboxFactory
    ) -> None:
        # Quirk: only the snap- id works as templateID (the snapshot name does not).
        info = make_sandbox()
        snapshots, templates = backend.snapshots(), backend.templates()
        assert snapshots is not None
        assert templates is not None
        snapshot = snapshots.create(info.sandbox_id, name="cube-quirk")
        try:
            assert snapshot.snapshot_id.startswith("snap-")
            assert not snapshot.snapshot_id.startswith("snap-snap-")
            assert snapshot.snapshot_id not in {t.template_id for t in templates.list()}
            child = make_sandbox(template_id=snapshot.snapshot_id)
            assert backend.get(child.sandbox_id).template_id == snapshot.snapshot_id
            with pytest.raises(RemoteError) as caught:
                make_sandbox(template_id=snapshot.name)
            assert caught.value.kind in (ErrorKind.NOT_FOUND, ErrorKind.INVALID, ErrorKind.INTERNAL)
            backend.delete(child.sandbox_id)
        finally:
            snapshots.delete(snapshot.snapshot_id)

    def test_templates_are_built_through_cubes_template_api(
        self, backend: CubeBackend, make_sandbox: SandboxFactory, docker_base_image: str
    ) -> None:
        # Quirk: Cube has its own template API (POST /templates from an image), not E2B's builds.
        templates = backend.templates()
        assert templates is not None
        template = templates.create(TemplateBuildSpec(name="cube-crud", labels={"image": docker_base_image}))
        try:
            assert template.template_id.startswith("tpl-")
            assert template.template_id in {t.template_id for t in templates.list()}
            info = make_sandbox(template_id=template.template_id)
            with pytest.raises(RemoteError) as caught:
                templates.delete(template.template_id)
            assert caught.value.kind == ErrorKind.CONFLICT
            backend.delete(info.sandbox_id)
            with pytest.raises(RemoteError) as caught:
                templates.create(TemplateBuildSpec(name="pkgs", debian_packages=("curl",)))
            assert caught.value.kind == ErrorKind.UNSUPPORTED
        finally:
            templates.delete(template.template_id)
        templates.delete(template.template_id)  # idempotent
        assert template.template_id not in {t.template_id for t in templates.list()}


class TestCubeDataPlaneAndListing:
    def test_the_data_plane_is_routed_by_host(self, fake_cube: FakeHandle, make_sandbox: SandboxFactory) -> None:
        # CubeProxy ignores E2b-Sandbox-Id: the adapter names the sandbox in Host.
        info = make_sandbox()
        fake_cube.forget_requests()
        assert run(CubeBackend(fake_cube.backend_config("cube")), info.sandbox_id, "echo routed") == "routed\n"
        assert ("envd", "POST", "/process.Process/Start") in fake_cube.requests()

    def test_listing_sees_past_one_page(
        self, fake_cube: FakeHandle, make_sandbox: SandboxFactory, test_run_id: str
    ) -> None:
        # CubeAPI lists one CubeMaster page (start 0) and filters it: with more sandboxes than
        # the page size, matches beyond it were never seen (the reaper stopped at 1000).
        group = {"console-space": f"past-page-{uuid.uuid4().hex[:8]}"}
        made = {make_sandbox(metadata=group).sandbox_id for _ in range(3)}
        adapter = CubeBackend(fake_cube.backend_config("cube", list_limit="2"))
        found = {info.sandbox_id for info in adapter.iter_sandboxes(ListQuery(metadata=group, limit=2))}
        assert found == made
        # A walk page by page fetches once (Cube has no cursor; the pages are cut here).
        fake_cube.forget_requests()
        assert len(list(adapter.iter_sandboxes(ListQuery(metadata=group, limit=1)))) == 3
        assert [r for r in fake_cube.requests() if r == ("api", "GET", "/v2/sandboxes")] == [
            ("api", "GET", "/v2/sandboxes")
        ]
        adapter.close()

"""Every consumer of a network policy agrees with its one meaning: the agreement table
(`agreement_table.py`, verdicts written by hand from the semantics) held against `decide`,
explain (the console's function and its API answer), the E2B and Cube translations (what the
adapter sends, read back from the fake control plane), the Docker renderers' output read back
from this host (the nftables ruleset, the space network's dnsmasq configuration, squid's) and,
for a sample, real connections from a Docker sandbox to servers the test starts here.

Each column prints a summary line (cases asked, cases agreeing) and fails listing every
disagreeing case.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

import netpolicy
from netpolicy.decide import TLS_PORT
from sandboxes.backends.base import META_SPACE, NetworkSpec, RemoteError, SandboxSpec
from sandboxes.backends.docker.egress.firewall import bridge_name
from tests.factories import set_policy
from tests.fakes.fixtures import FakeHandle
from tests.personas import World
from tests.support.agreement import ZONE, asked, network_spec, reserved, substitute, upstream_answers
from tests.support.agreement_lab import Targets, probe
from tests.support.agreement_table import CASES, NAMES, PLACEHOLDERS, POLICIES, Case, Tally
from tests.support.docker_readback import Enforced
from tests.support.egress_support import LISTENER_PORT
from tests.support.remote_egress import remote_verdict


@pytest.fixture(scope="module")
def report(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Summary lines, written to the terminal when the module ends."""
    lines: list[str] = []
    yield lines
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if terminal is None or not lines:
        return
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        terminal.write_line("")
        terminal.write_line(f"policy agreement, {len(CASES)} cases over {len(POLICIES)} policies:")
        for line in lines:
            terminal.write_line(f"  {line}")


def settle(tally: Tally, report: list[str]) -> None:
    report.append(tally.line())
    assert not tally.wrong, f"{tally.line()}; disagreeing:\n" + "\n".join(tally.wrong)


def test_the_table_is_large_and_names_every_policy() -> None:
    assert len(CASES) >= 200
    assert {case.policy for case in CASES} == set(POLICIES)
    assert len({case.label for case in CASES}) == len(CASES), "a case is written twice"


def test_decide_agrees(report: list[str]) -> None:
    tally = Tally("decide")
    for case in CASES:
        policy = network_spec(POLICIES[case.policy], PLACEHOLDERS)
        decision = netpolicy.decide(policy, asked(case, PLACEHOLDERS).destination, reserved=reserved(PLACEHOLDERS))
        tally.judge(case, decision.allowed, decision.sentence)
    settle(tally, report)


# --- explain: the console's function and the API's answer ------------------------------------


def _explain_applies(case: Case, policy: netpolicy.Policy) -> str:
    """Why explain cannot be held to this case ("" when it can): it takes no HTTP method, and
    it judges a name before resolution (saying that its addresses are checked after)."""
    if case.method not in (None, "GET"):
        return "explain takes no HTTP method"
    destination = asked(case, PLACEHOLDERS).destination
    if destination.name is not None:
        unresolved = replace(destination, addresses=())
        places = reserved(PLACEHOLDERS)
        if netpolicy.decide(policy, unresolved, reserved=places).allowed != case.allowed:
            return "the verdict depends on the address the name resolves to (explain does not resolve)"
    return ""


def test_explain_function_agrees(report: list[str]) -> None:
    from sandboxes.network.explain import explain, parse_target

    tally = Tally("explain (console function)")
    for case in CASES:
        policy = network_spec(POLICIES[case.policy], PLACEHOLDERS)
        why = _explain_applies(case, policy)
        if why:
            tally.judge(case, None, why)
            continue
        answer = explain(parse_target(asked(case, PLACEHOLDERS).text), policy, reserved=reserved(PLACEHOLDERS))
        tally.judge(case, answer.allowed, answer.rule)
    settle(tally, report)


@pytest.mark.django_db
@pytest.mark.docker
def test_explain_api_agrees(report: list[str], world: World, docker_world: DockerWorld) -> None:
    """The API's answer for a space with a Docker config, whose backend names the host's
    addresses and the sandbox networks (`$GW` is the other sandbox's gateway here: an address
    of the host like any network's)."""
    from console.services import Actor
    from sandboxes.api.tokens import do_create_api_token
    from tests.factories import make_config

    make_config(world.space_a, name="docker", default_template=docker_world.image)
    places = {k: v for k, v in docker_world.places.items() if k != ZONE}
    places |= {"$GW": docker_world.other_gateway, "$GW_NET": places["$OTHER_NET"]}
    _, token = do_create_api_token(world.space_a, name="agreement", actor=Actor(user=world.alice))
    client, headers = Client(), {"Authorization": f"Bearer {token}"}
    url = f"/api/v1/spaces/{world.space_a.id}/network/explain"
    tally = Tally("explain (API answer)")
    for name, spec in POLICIES.items():
        set_policy(
            world.space_a,
            allow_internet_access=spec.outbound,
            allow_out=[substitute(t, places) for t in spec.allow_out],
            deny_out=[substitute(t, places) for t in spec.deny_out],
            allow_private=[substitute(t, places) for t in spec.allow_private],
            l7_rules=[substitute(t, places) for t in spec.l7_rules],
        )
        policy = network_spec(spec, places)
        for case in (c for c in CASES if c.policy == name):
            why = _explain_applies(case, policy)
            if why:
                tally.judge(case, None, why)
                continue
            answer = client.get(url, {"destination": asked(case, places).text}, headers=headers)
            assert answer.status_code == 200, (case.label, answer.content)
            tally.judge(case, answer.json()["allowed"], answer.json()["rule"])
    settle(tally, report)


# --- E2B and Cube: the translation the adapter sends ------------------------------------------


def _remote_column(kind: str, fake: FakeHandle, adapter: Any, test_run_id: str, problems_of: Any) -> Tally:
    tally = Tally(f"{kind} translation")
    bodies: dict[str, dict[str, Any] | str] = {}
    for name, spec in POLICIES.items():
        policy = network_spec(spec, PLACEHOLDERS)
        problems = problems_of(policy, adapter.network_capabilities())
        if problems:
            bodies[name] = "the console refuses its sessions (policy beyond the backend)"
            continue
        try:
            info = adapter.create(SandboxSpec(template_id="base", network=policy, metadata={"test-run": test_run_id}))
        except RemoteError as exc:
            bodies[name] = f"the adapter refuses it ({exc.kind})"
            continue
        try:
            (found,) = [s for s in fake.state()["sandboxes"] if s["sandboxID"] == info.sandbox_id]
            bodies[name] = {"allow_internet_access": found["allow_internet_access"], "network": found["network"]}
        finally:
            adapter.delete(info.sandbox_id)
    for case in CASES:
        body = bodies[case.policy]
        if case.docker_only:
            tally.judge(case, None, "the Docker host's and sandboxes' addresses")
            continue
        if isinstance(body, str):
            tally.judge(case, None, body)
            continue
        destination = asked(case, PLACEHOLDERS).destination
        if netpolicy.unmapped(destination.addresses[0]).version == 6:
            tally.judge(case, None, "IPv6: whether E2B/Cube sandboxes have IPv6 egress is not documented")
            continue
        limit = REMOTE_LIMITS.get(case.label)
        if limit:
            tally.judge(case, None, f"a documented limit: {limit}")
            continue
        port = destination.port
        tally.judge(
            case,
            remote_verdict(
                body,
                name=destination.name,
                address=destination.addresses[0],
                web=port is None or destination.web_port is not None,
                http=destination.web_port is not None,
                tls=destination.web_port == TLS_PORT,
                method=destination.method,
                path=destination.path,
            ),
            f"sent {body['network']}",
        )
    return tally


# Where E2B and Cube cannot mean what the table says, by their own documentation (shared
# reference "e2b-cube-protocol" 3.4): they filter names only as the HTTP Host or TLS SNI of
# ports 80 and 443, and have no resolver of the console's to refuse a name.
REMOTE_LIMITS = {
    "allow-cidr-only: example.test": "no resolver refuses a name whose address an allowed CIDR holds",
    "allow-everything-cidr: example.test": "no resolver refuses a name whose address an allowed CIDR holds",
    "http-rules-allow-list: example.test:8080": "domain entries hold for HTTP (80) and TLS (443) only",
    # 0.0.0.0/8 is never sent (a control plane may read any 0.0.0.0/n as "all traffic"); a
    # connection to 0.0.0.0 stays inside the sandbox's own machine.
    "open: 0.0.0.0": "0.0.0.0/8 cannot be sent",
}


def _problems(policy: netpolicy.Policy, capabilities: Any) -> list[str]:
    from sandboxes.catalog.network import unsupported_policy_switches

    return list(unsupported_policy_switches(policy, capabilities))  # type: ignore[arg-type]


@pytest.mark.docker
@pytest.mark.e2b
def test_e2b_translation_agrees(report: list[str], fake_e2b_server: FakeHandle, test_run_id: str) -> None:
    from sandboxes.backends.e2b.backend import E2BBackend

    adapter = E2BBackend(fake_e2b_server.backend_config("e2b"))
    try:
        tally = _remote_column("E2B", fake_e2b_server, adapter, test_run_id, _problems)
    finally:
        adapter.close()
    settle(tally, report)


@pytest.mark.docker
@pytest.mark.e2b
def test_cube_translation_agrees(report: list[str], fake_cube_server: FakeHandle, test_run_id: str) -> None:
    from sandboxes.backends.cube.backend import CubeBackend

    adapter = CubeBackend(fake_cube_server.backend_config("cube"))
    try:
        tally = _remote_column("Cube", fake_cube_server, adapter, test_run_id, _problems)
    finally:
        adapter.close()
    settle(tally, report)


def _case(label: str) -> Case:
    return next(c for c in CASES if c.label == label)


# --- Docker: the renderers' output read back from this host, and real connections -------------


@dataclass
class DockerWorld:
    backend: Any
    engine: Any
    places: dict[str, str]
    squid_conf: Path
    host_port: int
    image: str
    run_id: str
    other_gateway: str


@pytest.fixture(scope="module")
def docker_world(docker_base_image: str, test_run_id: str) -> Iterator[DockerWorld]:
    """The target namespace, the upstream resolver answering the table's names (in a zone of
    this run's own), a banner server on every address of the host, a Docker backend with its
    own squid, and a sandbox of another space with a listener (the `$OTHER` address)."""
    import docker as docker_sdk

    from tests.support.egress_lab import LocalResolver
    from tests.support.egress_support import docker0_address, docker_backend, start_listener, upstream_dns
    from tests.support.netns import BannerServer, require_root_networking

    require_root_networking()
    zone = f"ag{uuid.uuid4().hex[:6]}"
    names = [substitute(n, {ZONE: zone}) for n in NAMES]
    targets = Targets([*names, *(f"*.{n}" for n in names)]).start()
    engine = docker_sdk.APIClient(timeout=60)
    state = tempfile.mkdtemp(prefix="agreement-proxy-")
    try:
        places = {**PLACEHOLDERS, **targets.places(), ZONE: zone, "$DOCKER0": docker0_address()}
        answers = upstream_answers(places)
        squid_dns = LocalResolver(answers, address=f"127.0.{random.randrange(100, 250)}.{random.randrange(2, 250)}")
        squid_dns.start()
        try:
            with (
                upstream_dns(answers) as upstream,
                BannerServer("0.0.0.0") as host_server,
                docker_backend(
                    test_run_id,
                    dns_upstream=upstream,
                    options={"proxy_state_dir": state, "proxy_dns": squid_dns.address},
                ) as backend,
            ):
                other = backend.create(
                    SandboxSpec(
                        template_id=docker_base_image,
                        network=NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False),
                        metadata={"test-run": test_run_id, META_SPACE: f"agr-other-{zone}"},
                    )
                )
                try:
                    start_listener(backend, other.sandbox_id)
                    settings = _network_of(engine, other.sandbox_id)
                    places |= {"$OTHER": settings["IPAddress"], "$OTHER_NET": settings["subnet"]}
                    yield DockerWorld(
                        backend,
                        engine,
                        places,
                        Path(state) / "squid.conf",
                        host_server.port,
                        docker_base_image,
                        test_run_id,
                        settings["Gateway"],
                    )
                finally:
                    backend.delete(other.sandbox_id)
                    proxy = backend.outbound.proxy
                    for policy in proxy.policies():
                        proxy.remove_space(policy.name)
                    proxy.stop()
        finally:
            squid_dns.stop()
    finally:
        engine.close()
        targets.stop()
        shutil.rmtree(state, ignore_errors=True)


def _network_of(engine: Any, sandbox_id: str) -> dict[str, str]:
    """The one network a sandbox is on: its name, the sandbox's addresses, gateway and subnet
    (empty when outbound is off and it has none)."""
    networks = engine.inspect_container(sandbox_id)["NetworkSettings"]["Networks"]
    found = {name: s for name, s in networks.items() if name not in ("none", "")}
    if not found:
        return {}
    ((name, settings),) = found.items()
    ipam = engine.inspect_network(name)["IPAM"]["Config"] or []
    subnet = next((c["Subnet"] for c in ipam if ":" not in c.get("Subnet", ":")), "")
    return {
        "name": name,
        "IPAddress": settings["IPAddress"],
        "GlobalIPv6Address": settings.get("GlobalIPv6Address") or "",
        "Gateway": settings["Gateway"],
        "subnet": subnet,
    }


def _connectable(case: Case) -> bool:
    """Cases whose destination is a server of this test (the sample of real connections): a
    name (the test's resolver answers it with a target's address) or a `$` place. Never a
    literal address: those may be anywhere."""
    if "$" in case.destination:
        return True
    return netpolicy.parse_destination(case.destination).name is not None


def _attempt(case: Case, world: DockerWorld, places: dict[str, str]) -> tuple[str, str, int, bool, str, str]:
    found = asked(case, places)
    destination = found.destination
    host = found.original_name if destination.name is not None else str(destination.addresses[0])
    if "$GW" in case.destination or "$DOCKER0" in case.destination:
        port = world.host_port
    elif "$OTHER" in case.destination:
        port = LISTENER_PORT
    else:
        port = destination.port or destination.web_port or 8080
    return (case.label, host, port, port == 443, destination.method or "GET", destination.path or "/")


@pytest.mark.docker
def test_docker_enforcement_agrees(report: list[str], docker_world: DockerWorld) -> None:
    """Column (c): each policy attached to a real sandbox, the host's nftables table, the
    network's dnsmasq configuration and squid's read back and interpreted per case; column
    (e): the connectable cases tried for real from that sandbox."""
    world = docker_world
    deciding: Counter[str] = Counter()
    rendered, connected = Tally("Docker rendered (nft + dnsmasq + squid read back)"), Tally("Docker real connections")
    for index, (name, spec) in enumerate(POLICIES.items()):
        space = f"agr-{world.places[ZONE]}-{index}"
        places = dict(world.places)
        info = world.backend.create(
            SandboxSpec(
                template_id=world.image,
                network=network_spec(spec, places),
                metadata={"test-run": world.run_id, META_SPACE: space},
            )
        )
        try:
            settings = _network_of(world.engine, info.sandbox_id)
            if settings:
                places |= {"$GW": settings["Gateway"], "$GW_NET": settings["subnet"]}
                if network_spec(spec, places) != network_spec(spec, world.places):
                    egress = world.backend.egress()
                    assert egress is not None
                    egress.update(info.sandbox_id, network_spec(spec, places))
            enforced = Enforced.read(
                bridge_name(settings["name"]) if settings else "",
                settings.get("IPAddress", ""),
                settings.get("GlobalIPv6Address", ""),
                settings.get("Gateway", ""),
                world.squid_conf,
            )
            cases = [c for c in CASES if c.policy == name]
            for case in cases:
                found = asked(case, places)
                allowed, words = enforced.judge(found.destination, found.original_name)
                rendered.judge(case, allowed, words)
                deciding[words.split(":")[0].split(" ")[0]] += 1
            sample = [c for c in cases if _connectable(c)]
            if sample:
                answers = probe(world.backend, info.sandbox_id, [_attempt(c, world, places) for c in sample])
                for case in sample:
                    connected.judge(case, answers[case.label] == "reached", answers[case.label])
        finally:
            world.backend.delete(info.sandbox_id)
    layers = ", ".join(f"{layer} {count}" for layer, count in sorted(deciding.items()))
    report.append(f"{rendered.line()}; decided by: {layers}")
    report.append(connected.line())
    assert connected.asked >= 30
    problems = [*rendered.wrong, *connected.wrong]
    assert not problems, f"{rendered.line()}\n{connected.line()}\ndisagreeing:\n" + "\n".join(problems)

"""HTTP rules and TLS by SNI on Docker, end to end: a real sandbox, a real squid, real servers.

Every destination is a server this module starts in a network namespace of its own
(tests/support/egress_lab.py: veth pair, documentation ranges, the route checked before
any traffic); squid's own lookups go to a dnsmasq on 127.0.0.77 with fixed answers. The sandbox
itself has no resolver: its programs connect to the address and name the host in the Host
header or the SNI, which is what the transparent proxy sees.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker.types
import pytest

from netpolicy import parse_l7_rule
from sandboxes.backends.base import (
    META_SPACE,
    BackendConfig,
    ExecRequest,
    NetworkSpec,
    SandboxSpec,
)
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.common import KIND_NETWORK, LABEL_NETWORK_SPACE
from sandboxes.backends.docker.egress.firewall import bridge_name
from sandboxes.backends.docker.egress.proxy import PROXY_HTTP_PORT, PROXY_TLS_PORT, squid_available
from sandboxes.backends.docker.image import LABEL_KIND, LABEL_MANAGED
from tests.sandboxes.conftest import docker_test_network_name
from tests.support.egress_lab import LocalResolver, TargetNamespace, input_exception

pytestmark = [pytest.mark.docker]

NAMES = ("web.test", "tls-ok.test", "tls-bad.test", "secret.test", "other.test")
RULES = (
    parse_l7_rule({"domain": "web.test", "methods": ("GET",), "path_prefix": "/public", "action": "allow"}),
    parse_l7_rule({"domain": "web.test", "methods": ("GET",), "path_prefix": "/admin", "action": "deny"}),
    parse_l7_rule({"domain": "tls-ok.test", "action": "allow"}),
    parse_l7_rule({"domain": "tls-bad.test", "action": "deny"}),
    parse_l7_rule({"domain": "secret.test", "methods": ("POST",), "path_prefix": "/", "action": "deny"}),
)

# Runs inside the sandbox: plain sockets and http.client, no proxy settings consulted.
PROBE = r"""
import http.client, socket, ssl, sys
kind, address, host = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    if kind == "http":
        method, path = sys.argv[4], sys.argv[5]
        conn = http.client.HTTPConnection(address, 80, timeout=5)
        conn.request(method, path, headers={"Host": host})
        answer = conn.getresponse()
        print(answer.status, answer.read().decode(errors="replace").splitlines()[0][:80])
    else:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with context.wrap_socket(socket.create_connection((address, 443), timeout=5), server_hostname=host) as tls:
            tls.sendall(f"GET /over-tls HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            print("tls", tls.recv(200).decode(errors="replace").splitlines()[0])
except Exception as exc:
    print("failed", type(exc).__name__)
"""


@dataclass
class Lab:
    backend: DockerBackend
    sandbox_id: str
    address: str  # the sandbox's address on its space network
    target: TargetNamespace

    def probe(self, *args: str) -> str:
        result = self.backend.exec(self.sandbox_id, ExecRequest(argv=("python3", "-c", PROBE, *args), timeout_s=30))
        assert result.exit_code == 0, result
        return result.stdout.decode().strip()

    def http(self, method: str, host: str, path: str, address: str = "") -> str:
        return self.probe("http", address or self.target.address, host, method, path)

    def tls(self, host: str, address: str = "") -> str:
        return self.probe("tls", address or self.target.address, host)


@pytest.fixture(scope="module")
def lab(docker_base_image: str, test_run_id: str) -> Iterator[Lab]:
    if not squid_available():
        pytest.fail("squid-openssl is not installed (.ci/docker-up installs it)")
    target = TargetNamespace(NAMES).start()
    resolver = LocalResolver(
        dict.fromkeys(NAMES, target.address)
        | {"spoof.test": target.other_address, "self.test": target.host_address, "v6.test": target.address6}
    ).start()
    state = tempfile.mkdtemp(prefix="egress-proxy-")
    backend = DockerBackend(
        BackendConfig(
            kind="docker",
            options={
                "network": docker_test_network_name(test_run_id),
                "proxy_state_dir": state,
                "proxy_dns": resolver.address,
            },
        )
    )
    sandbox_id = ""
    try:
        with input_exception([PROXY_HTTP_PORT, PROXY_TLS_PORT]):
            info = backend.create(
                SandboxSpec(
                    template_id=docker_base_image,
                    network=NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, l7_rules=RULES),
                    metadata={"test-run": test_run_id, META_SPACE: f"l7-{uuid.uuid4().hex[:6]}"},
                )
            )
            sandbox_id = info.sandbox_id
            networks = backend.api.inspect_container(sandbox_id)["NetworkSettings"]["Networks"]
            address = next(iter(networks.values()))["IPAddress"]
            yield Lab(backend, sandbox_id, address, target)
    finally:
        if sandbox_id:
            backend.delete(sandbox_id)
        proxy = backend.outbound.proxy
        for policy in proxy.policies():
            proxy.remove_space(policy.name)  # also empties the redirect table
        proxy.stop()
        backend.close()
        resolver.stop()
        target.stop()
        shutil.rmtree(state, ignore_errors=True)


def refusals_since(lab: Lab, cursor: str) -> tuple[list[tuple[str, str, str, str]], str]:
    found, cursor = lab.backend.outbound.proxy.refusals(
        cursor, sandbox_of=lambda address: lab.sandbox_id if address == lab.address else address
    )
    return [(r.sandbox_id, r.layer, r.destination, r.rule) for r in found], cursor


def test_capabilities_claim_http_rules(lab: Lab) -> None:
    assert lab.backend.network_capabilities().l7_rules


def test_squid_listens_only_on_the_gateway_and_loopback(lab: Lab) -> None:
    pids = set(
        subprocess.run(
            ["pgrep", "-f", lab.backend.outbound.proxy.state_dir], capture_output=True, text=True
        ).stdout.split()
    )
    assert pids
    # Every gateway of the space network (IPv4, and IPv6 where the network has it).
    gateways = lab.backend.outbound.proxy.policies()[0].gateways
    expected = {f"[{g}]:{port}" if ":" in g else f"{g}:{port}" for g in gateways for port in (3129, 3130)}
    listening: set[str] = set()
    deadline = time.monotonic() + 15  # a squid just (re)configured binds its ports a moment later
    while time.monotonic() < deadline and not expected <= listening:
        listening = set()
        for line in subprocess.run(["ss", "-Htulnp"], capture_output=True, text=True, check=True).stdout.splitlines():
            if any(f"pid={pid}," in line for pid in pids):
                listening.add(line.split()[4])
        time.sleep(0.2)
    assert listening == expected | {"127.0.0.1:3131"} | {
        entry
        for entry in listening
        if entry.startswith("127.0.0.1:")  # its DNS client socket
    }, listening


def test_method_and_path_rules_decide_plain_http(lab: Lab) -> None:
    _, cursor = refusals_since(lab, "")
    assert lab.http("GET", "web.test", "/public/index.html") == "200 served GET /public/index.html port 80"
    assert lab.http("GET", "web.test", "/admin/users?token=secret").startswith("403 ")
    assert lab.http("POST", "web.test", "/public/form").startswith("403 ")  # named host, no rule matches
    assert lab.http("GET", "other.test", "/") == "200 served GET / port 80"  # named by no rule
    found, _ = refusals_since(lab, cursor)
    assert found == [
        (lab.sandbox_id, "http", "http://web.test/admin/users", "HTTP rule 2 (deny GET web.test/admin)"),
        (
            lab.sandbox_id,
            "http",
            "http://web.test/public/form",
            "no HTTP rule matches this request (its host is named by rules)",
        ),
    ]


def test_tls_is_decided_by_sni(lab: Lab) -> None:
    _, cursor = refusals_since(lab, "")
    assert lab.tls("tls-ok.test") == "tls HTTP/1.1 200 OK"
    assert lab.tls("web.test") == "tls HTTP/1.1 200 OK"  # an allow rule names it (path unseen)
    assert lab.tls("tls-bad.test") == "failed SSLZeroReturnError"
    assert lab.tls("secret.test").startswith("failed")  # only a method-restricted deny names it
    found, _ = refusals_since(lab, cursor)
    assert found == [
        (lab.sandbox_id, "tls", "tls-bad.test", "HTTP rule 4 (deny any method tls-bad.test)"),
        (lab.sandbox_id, "tls", "secret.test", "no HTTP rule allows this host (TLS is checked by SNI only)"),
    ]


def test_a_program_ignoring_proxy_variables_is_still_filtered(lab: Lab) -> None:
    # bash's /dev/tcp with proxy variables pointing nowhere: nothing here reads them, the
    # redirect happens in the host's packet path.
    line = (
        f"exec 3<>/dev/tcp/{lab.target.address}/80; "
        "printf 'GET /admin/ HTTP/1.0\\r\\nHost: web.test\\r\\n\\r\\n' >&3; head -1 <&3"
    )
    env = {"http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "no_proxy": "*"}
    result = lab.backend.exec(lab.sandbox_id, ExecRequest(argv=("bash", "-c", line), env=env, timeout_s=30))
    assert result.stdout.decode().split()[:2] == ["HTTP/1.1", "403"], result


def test_a_host_header_naming_another_address_is_refused(lab: Lab) -> None:
    # "web.test" resolves to the target's first address; sent to its second one, squid
    # refuses (host_verify_strict) instead of letting the name of an allowed host through.
    assert lab.http("GET", "web.test", "/public/x", address=lab.target.other_address).startswith("409 ")
    assert lab.http("GET", "spoof.test", "/", address=lab.target.other_address) == "200 served GET / port 80"


def test_the_hosts_own_addresses_are_refused_by_the_proxy(lab: Lab) -> None:
    _, cursor = refusals_since(lab, "")
    answer = lab.http("GET", "self.test", "/", address=lab.target.host_address)
    assert answer.startswith("403 "), answer
    found, _ = refusals_since(lab, cursor)
    assert [row[3] for row in found] == ["always denied: the Docker host"]  # netpolicy's words


def test_a_rule_change_reaches_the_running_sandbox_within_5_s(lab: Lab) -> None:
    assert lab.http("GET", "web.test", "/admin/").startswith("403 ")
    changed = (
        RULES[0],
        parse_l7_rule({"domain": "web.test", "methods": ("GET",), "path_prefix": "/admin", "action": "allow"}),
        *RULES[2:],
    )
    network = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, l7_rules=changed)
    started = time.monotonic()
    lab.backend.outbound.update_http_rules(lab.sandbox_id, network)
    while not lab.http("GET", "web.test", "/admin/").startswith("200 "):
        assert time.monotonic() - started < 5, "the changed rule did not reach the sandbox within 5 s"
        time.sleep(0.1)
    took = time.monotonic() - started
    print(f"rule change in force after {took:.2f} s")
    assert lab.tls("tls-ok.test") == "tls HTTP/1.1 200 OK"
    original = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, l7_rules=RULES)
    lab.backend.outbound.update_http_rules(lab.sandbox_id, original)
    deadline = time.monotonic() + 5
    while not lab.http("GET", "web.test", "/admin/").startswith("403 "):
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_each_space_has_its_own_rules(lab: Lab, docker_base_image: str, test_run_id: str) -> None:
    # A second space joins the running squid (reconfigured: a new gateway to listen on);
    # its rules hold for its sandboxes only.
    other_rules = (parse_l7_rule({"domain": "web.test", "action": "deny"}),)
    info = lab.backend.create(
        SandboxSpec(
            template_id=docker_base_image,
            network=NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, l7_rules=other_rules),
            metadata={"test-run": test_run_id, META_SPACE: f"l7b-{uuid.uuid4().hex[:6]}"},
        )
    )
    try:
        other = Lab(lab.backend, info.sandbox_id, "", lab.target)
        assert other.http("GET", "web.test", "/public/x").startswith("403 ")
        assert other.http("GET", "other.test", "/") == "200 served GET / port 80"
        assert lab.http("GET", "web.test", "/public/x") == "200 served GET /public/x port 80"
        assert len(lab.backend.outbound.proxy.policies()) == 2
    finally:
        lab.backend.delete(info.sandbox_id)
    # Its network is released with its last sandbox, and squid stops listening there.
    assert len(lab.backend.outbound.proxy.policies()) == 1
    assert lab.http("GET", "web.test", "/public/x") == "200 served GET /public/x port 80"


def test_ipv6_is_redirected_and_decided_the_same(lab: Lab, docker_base_image: str, test_run_id: str) -> None:
    # A dual-stack space network (made here the way the backend names and bridges it).
    space = f"l7v6-{uuid.uuid4().hex[:6]}"
    name = lab.backend.space_network_name(space)
    lab.backend.api.create_network(
        name,
        driver="bridge",
        enable_ipv6=True,
        ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet="fd00:5100:77::/64")]),
        options={"com.docker.network.bridge.enable_icc": "false", "com.docker.network.bridge.name": bridge_name(name)},
        labels={LABEL_MANAGED: "1", LABEL_KIND: KIND_NETWORK, LABEL_NETWORK_SPACE: space},
    )
    rules = (parse_l7_rule({"domain": "v6.test", "methods": ("GET",), "path_prefix": "/public", "action": "allow"}),)
    info = lab.backend.create(
        SandboxSpec(
            template_id=docker_base_image,
            network=NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, l7_rules=rules),
            metadata={"test-run": test_run_id, META_SPACE: space},
        )
    )
    try:
        v6 = Lab(lab.backend, info.sandbox_id, "", lab.target)
        assert v6.http("GET", "v6.test", "/public/x", address=lab.target.address6) == "200 served GET /public/x port 80"
        assert v6.http("GET", "v6.test", "/private", address=lab.target.address6).startswith("403 ")
        log = Path(lab.backend.outbound.proxy.access_log).read_text()
        assert "TCP_DENIED/403 GET http://v6.test/private" in log  # it went through squid
    finally:
        lab.backend.delete(info.sandbox_id)


def test_an_sni_naming_another_address_is_refused(lab: Lab) -> None:
    # "tls-ok.test" resolves to the target's first address; claimed towards its second one,
    # squid's Host verification (applied to the SNI's CONNECT) refuses the connection.
    _, cursor = refusals_since(lab, "")
    assert lab.tls("tls-ok.test", address=lab.target.other_address).startswith("failed")
    assert lab.tls("spoof.test", address=lab.target.other_address) == "tls HTTP/1.1 200 OK"
    found, _ = refusals_since(lab, cursor)
    assert [row[1:] for row in found] == [
        ("tls", "tls-ok.test", "the name sent (SNI) does not resolve to the address connected to")
    ]


def test_a_sandboxs_http_requests_follow_its_own_lists_not_another_sessions(
    lab: Lab, docker_base_image: str, test_run_id: str
) -> None:
    """Two sandboxes of one space whose lists differ (a session grant adds other.test to one):
    the other sandbox's HTTP request to other.test is refused, as `decide` says for its spec."""
    from netpolicy import decide, parse_destination

    space = f"l7c-{uuid.uuid4().hex[:6]}"
    rules = (parse_l7_rule({"domain": "web.test", "methods": ("GET",), "action": "allow"}),)
    plain = NetworkSpec.parse(
        allow_internet_access=True, allow_public_traffic=False, allow_out=("web.test",), l7_rules=rules
    )
    granted = NetworkSpec.parse(
        allow_internet_access=True, allow_public_traffic=False, allow_out=("web.test", "other.test"), l7_rules=rules
    )
    made = []
    try:
        for spec in (plain, granted):
            made.append(
                lab.backend.create(
                    SandboxSpec(
                        template_id=docker_base_image,
                        network=spec,
                        metadata={"test-run": test_run_id, META_SPACE: space},
                    )
                )
            )
        target = parse_destination("http://other.test/").resolved(lab.target.address)
        assert not decide(plain, target).allowed
        first = Lab(lab.backend, made[0].sandbox_id, "", lab.target)
        assert first.http("GET", "web.test", "/") == "200 served GET / port 80"
        assert not first.http("GET", "other.test", "/").startswith("200 ")
        # The granted one reaches it (its own policy, the same squid and gateway).
        second = Lab(lab.backend, made[1].sandbox_id, "", lab.target)
        assert decide(granted, target).allowed
        assert second.http("GET", "other.test", "/") == "200 served GET / port 80"
        assert first.http("GET", "other.test", "/").startswith("403 ")  # still its own, after the second's
    finally:
        for sandbox in made:
            lab.backend.delete(sandbox.sandbox_id)


# The space's lists against its HTTP rules, live through squid on ports 80/443: a deny CIDR wins
# over an HTTP allow rule, and an HTTP allow rule does not widen the allow list.


def _apply(lab: Lab, **lists: tuple[str, ...]) -> None:
    network = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, l7_rules=RULES, **lists)
    lab.backend.outbound.update_http_rules(lab.sandbox_id, network)
    time.sleep(1)  # squid's reconfigure (the rule-change test shows < 1 s)


def _restore(lab: Lab) -> None:
    _apply(lab)


def test_a_deny_cidr_wins_over_an_http_allow_rule_live(lab: Lab) -> None:
    assert lab.http("GET", "web.test", "/public/a").startswith("200 ")  # control: the rule allows it
    try:
        _apply(lab, deny_out=(f"{lab.target.address}/32",))
        assert lab.http("GET", "web.test", "/public/a").startswith("403 ")
    finally:
        _restore(lab)


def test_an_http_allow_rule_does_not_widen_the_allow_list_live(lab: Lab) -> None:
    try:
        _apply(lab, allow_out=("other.test",))
        assert lab.http("GET", "other.test", "/").startswith("200 ")  # control: the allow list
        assert lab.http("GET", "web.test", "/public/a").startswith("403 ")
    finally:
        _restore(lab)

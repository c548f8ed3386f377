"""A space network's resolver (dnsmasq, configured by `egress.dns.render_config` from the typed
policy) answers what `netpolicy.decide` says, for a plain domain's subdomains both ways and
for an allowed name a deny entry covers. A real dnsmasq of the test's own on loopback,
forwarding to another one that answers every `.test` name; nothing leaves the machine."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

import netpolicy
from netpolicy import Domain, parse_domain
from sandboxes.backends.base import NetworkSpec
from sandboxes.backends.docker.egress.dns import DnsPolicy, policy_for, render_config
from tests.support.egress_support import free_port, upstream_dns

ANSWERS = {"example.test": "203.0.113.5", "x.test": "203.0.113.6"}


def _answers(port: int, name: str) -> int:
    """The answer count of an A query to 127.0.0.1:port (0: refused, NXDOMAIN)."""
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00\x00\x01\x00\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(3)
        sock.sendto(b"\x43\x21\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + question, ("127.0.0.1", port))
        reply = sock.recv(512)
    return int(struct.unpack("!H", reply[6:8])[0])


def _forwarded(spec: NetworkSpec, name: str, upstream: str, folder: Path) -> bool:
    policy = policy_for([(spec.allow_only, spec.domains("allow_out"), spec.domains("deny_out"))])
    text = render_config("127.0.0.1", upstream, policy, str(folder / "log"), str(folder / "pid"))
    # Our own instance on loopback: no nftset (the shared table is not touched), no port 53.
    lines = [line for line in text.splitlines() if not line.startswith(("nftset=", "port=", "except-interface"))]
    port = free_port()
    (folder / "conf").write_text("\n".join([*lines, f"port={port}"]) + "\n")
    binary = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
    done = subprocess.run([binary, f"--conf-file={folder / 'conf'}"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    try:
        return _answers(port, name) > 0
    finally:
        subprocess.run(["kill", (folder / "pid").read_text().strip()], check=False)


@pytest.mark.parametrize(
    ("allow", "deny", "name"),
    [
        (("example.test",), (), "api.example.test"),  # allow covers the subdomain: forwarded
        ((), ("example.test",), "api.example.test"),  # deny covers it: refused
        (("*.example.test",), (), "example.test"),  # a wildcard is the subdomains only
        (("*.example.test",), (), "a.b.example.test"),
        (("api.x.test",), ("x.test",), "api.x.test"),  # deny wins over a narrower allow
        (("x.test",), ("api.x.test",), "www.x.test"),
        (("x.test",), ("api.x.test",), "api.x.test"),
        (("*.x.test",), ("x.test",), "a.x.test"),
        (("x.test",), ("*.x.test",), "x.test"),
        (("Example.TEST.",), (), "api.example.test"),  # case and the trailing dot
    ],
)
def test_the_resolver_answers_what_decide_says(
    allow: tuple[str, ...], deny: tuple[str, ...], name: str, tmp_path: Path
) -> None:
    if shutil.which("dnsmasq") is None and not Path("/usr/sbin/dnsmasq").exists():
        pytest.fail("needs dnsmasq")
    spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=allow, deny_out=deny)
    decided = netpolicy.decide(spec, netpolicy.parse_destination(name))
    with upstream_dns(ANSWERS) as upstream:
        forwarded = _forwarded(spec, name, upstream, tmp_path)
    assert forwarded is decided.allowed, (decided, forwarded)


# Deny wins for names, as dnsmasq matches them: a denied name inside an allowed one is refused by
# the resolver itself.


def dom(*names: str) -> tuple[Domain, ...]:
    return tuple(parse_domain(n) for n in names)


# --- the resolver itself: deny wins for names, as dnsmasq matches them ------------------------


def _query(port: int, name: str) -> int:
    """The RCODE and answer count of an A query to 127.0.0.1:port (0 answers: refused)."""
    import socket
    import struct

    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00\x00\x01\x00\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(3)
        sock.sendto(b"\x43\x21\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + question, ("127.0.0.1", port))
        reply = sock.recv(512)
    return int(struct.unpack("!H", reply[6:8])[0])


@pytest.mark.parametrize(
    ("allowed", "denied", "name"),
    [
        (("example.test",), ("*.example.test",), "a.example.test"),
        (("*.example.test",), ("a.example.test",), "a.example.test"),
        (("example.test",), ("a.example.test",), "b.a.example.test"),
    ],
)
def test_the_resolver_refuses_a_denied_name_inside_an_allowed_one(
    allowed: tuple[str, ...], denied: tuple[str, ...], name: str, tmp_path: Any
) -> None:
    import shutil
    import subprocess

    from tests.support.egress_support import free_port, upstream_dns

    if shutil.which("dnsmasq") is None and not Path("/usr/sbin/dnsmasq").exists():
        pytest.fail("needs dnsmasq")
    with upstream_dns({"example.test": "203.0.113.5"}) as upstream:
        port = free_port()
        policy = DnsPolicy(False, dom(*allowed), dom(*denied))
        text = render_config("127.0.0.1", upstream, policy, str(tmp_path / "log"), str(tmp_path / "pid"))
        # Our own instance on loopback: no nftset (the shared table is not touched), no port 53.
        lines = [line for line in text.splitlines() if not line.startswith(("nftset=", "port=", "except-interface"))]
        (tmp_path / "conf").write_text("\n".join([*lines, f"port={port}"]) + "\n")
        binary = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
        done = subprocess.run([binary, f"--conf-file={tmp_path / 'conf'}"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        try:
            assert _query(port, "example.test" if "example.test" in allowed else "z.example.test") == 1  # control
            assert _query(port, name) == 0
        finally:
            pid = int((tmp_path / "pid").read_text().strip())
            subprocess.run(["kill", str(pid)], check=False)

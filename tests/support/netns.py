"""Destinations of the test's own on this machine: a network namespace joined by a veth pair,
a dummy interface with a link-local address, and small TCP servers bound to them.

Nothing here sends a packet anywhere: it only makes places to listen. Before a helper hands
out an address it checks the host's route to it goes to the interface it made (or is local),
so a failed setup can never turn a test's connection into traffic off the machine. Needs
root (CAP_NET_ADMIN) and `ip`; each helper removes what it made.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import pytest

from tests.conftest import IN_CI

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
# TEST-NET-2: documentation addresses, never routed anywhere; here only between the host and
# a namespace of the test's own.
NETNS_POOL = ipaddress.IPv4Network("198.51.100.0/24")
# The metadata range, but never 169.254.169.254 itself: 169.254.170.0/24 on a dummy link.
LINK_LOCAL_POOL = ipaddress.IPv4Network("169.254.170.0/24")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def require_root_networking() -> None:
    """Skip outside CI, fail in CI (which runs as root), like tests/conftest.require_service."""
    if os.geteuid() == 0 and shutil.which("ip"):
        return
    problem = "root and `ip` (iproute2) to make network namespaces and dummy interfaces"
    if IN_CI:
        pytest.fail(f"[CI] required: {problem}", pytrace=False)
    pytest.skip(f"needs {problem}")


def route_device(address: str) -> tuple[str, str]:
    """(type, device) of the host's route to `address`: ("local", "lo") or ("unicast", "vethX")."""
    route = json.loads(ip("-j", "route", "get", address).stdout)[0]
    return str(route.get("type", "unicast")), str(route.get("dev", ""))


@dataclass
class Namespace:
    name: str
    address: str  # inside the namespace
    host_address: str  # the host's end of the veth pair
    host_device: str

    def run(self, make: Callable[[], T]) -> T:
        """Call `make` in a thread that entered this namespace: sockets it creates live there."""
        box: dict[str, object] = {}

        def enter() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    box["error"] = OSError(ctypes.get_errno(), "setns failed")
                    return
                box["value"] = make()
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc
            finally:
                os.close(fd)

        thread = threading.Thread(target=enter, name=f"netns-{self.name}")
        thread.start()
        thread.join(30)
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]


@contextlib.contextmanager
def namespace(address: str | None = None) -> Iterator[Namespace]:
    """A namespace with one veth pair; `address` (inside it) is routed to it from the host.

    Default: a free /30 of TEST-NET-2 (host end .1, namespace end .2). With `address` given
    (e.g. a link-local one), the host gets a route to it alone through the veth.
    """
    require_root_networking()
    tag = secrets.token_hex(4)
    name, host_dev, inner_dev = f"sct-{tag}", f"sctv{tag}h", f"sctv{tag}n"
    ip("netns", "add", name)
    try:
        ip("link", "add", host_dev, "type", "veth", "peer", "name", inner_dev, "netns", name)
        subnets = list(NETNS_POOL.subnets(new_prefix=30))
        random.shuffle(subnets)
        ip("link", "set", host_dev, "up")
        for subnet in subnets:  # another run may hold one: take the first free one
            host_ip, inner_ip = (str(a) for a in list(subnet.hosts())[:2])
            if ip("addr", "add", f"{host_ip}/30", "dev", host_dev, check=False).returncode != 0:
                continue
            # A more specific route another test added (a /32 in the range) takes the address
            # elsewhere: that subnet is not free either.
            if route_device(inner_ip) == ("unicast", host_dev):
                break
            ip("addr", "del", f"{host_ip}/30", "dev", host_dev, check=False)
        else:
            raise RuntimeError("no free /30 in 198.51.100.0/24")
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "addr", "add", f"{inner_ip}/30", "dev", inner_dev)
        ip("-n", name, "link", "set", inner_dev, "up")
        ip("-n", name, "route", "add", "default", "via", host_ip)
        served = inner_ip
        if address is not None:
            ip("-n", name, "addr", "add", f"{address}/32", "dev", inner_dev)
            ip("route", "add", f"{address}/32", "via", inner_ip, "dev", host_dev)
            served = address
        kind, device = route_device(served)
        assert (kind, device) == ("unicast", host_dev), f"{served} is not routed to the test namespace"
        yield Namespace(name=name, address=served, host_address=host_ip, host_device=host_dev)
    finally:
        ip("link", "del", host_dev, check=False)
        ip("netns", "del", name, check=False)


@contextlib.contextmanager
def dummy_link_local() -> Iterator[str]:
    """A dummy interface (an empty bridge where the kernel has no dummy driver) holding one
    free address of 169.254.170.0/24 (never .254), as /32."""
    require_root_networking()
    device = f"sctd{secrets.token_hex(4)}"
    if ip("link", "add", device, "type", "dummy", check=False).returncode != 0:
        # A kernel without the dummy driver: an empty bridge holds a local address the same way.
        ip("link", "add", device, "type", "bridge")
    try:
        candidates = [str(a) for a in LINK_LOCAL_POOL.hosts() if a.packed[-1] not in (0, 254, 255)]
        random.shuffle(candidates)
        for address in candidates:
            if ip("addr", "add", f"{address}/32", "dev", device, check=False).returncode == 0:
                break
        else:
            raise RuntimeError("no free address in 169.254.170.0/24")
        ip("link", "set", device, "up")
        assert route_device(address)[0] == "local", f"{address} is not local to this host"
        yield address
    finally:
        ip("link", "del", device, check=False)


class BannerServer:
    """A TCP server that sends `banner` to every client and records who connected."""

    def __init__(self, host: str, banner: bytes = b"reached\n") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.banner = banner
        self.clients: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"banner-{host}", daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except OSError:
                continue
            self.clients.append(peer[0])
            with conn, contextlib.suppress(OSError):
                conn.sendall(self.banner)

    def __enter__(self) -> BannerServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def host_addresses() -> list[str]:
    """This host's own global IPv4 addresses, whatever interface holds them (not loopback)."""
    found = []
    for link in json.loads(ip("-j", "addr").stdout):
        for addr in link.get("addr_info", []):
            if addr.get("family") == "inet" and not addr["local"].startswith("127."):
                if link["ifname"].startswith(("sctd", "sctv")):
                    continue  # other tests' helpers
                found.append(str(addr["local"]))
    return found

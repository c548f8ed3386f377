"""Targets for egress tests that never leave this machine.

`TargetNamespace` makes a network namespace joined to the host by a veth pair with
addresses in documentation ranges (a /29 of 203.0.113.0/24, a /64 of 2001:db8::/32) and runs, inside it, an
HTTP server on ports 80 and 8080 (echoes method and path; `/bytes/N` answers N bytes) and a
TLS server on 443 (self-signed, names given). Before any traffic it checks that the host's
route to the namespace's address goes through the veth it made.

`LocalResolver` is a dnsmasq on a loopback address of its own with fixed answers and no
upstream (squid's own lookups in tests).

`input_exception` lets sandbox bridges reach the proxy ports on their gateway through the
live `inet sandbox_console` input chain (inserted rule, deleted again by its handle).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

SERVER = textwrap.dedent(
    """
    import http.server, socketserver, ssl, sys, threading

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *args):
            pass
        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if self.path.startswith("/bytes/"):
                size = int(self.path.split("/")[2])
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                chunk = b"x" * 65536
                while size > 0:
                    self.wfile.write(chunk[: min(size, len(chunk))])
                    size -= len(chunk)
                return
            body = f"served {self.command} {self.path} port {self.server.server_address[1]}\\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _answer

    import socket

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        address_family = socket.AF_INET6

        def server_bind(self):
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            super().server_bind()

    address, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]
    servers = [Server((address, 80), Handler), Server((address, 8080), Handler)]
    tls = Server((address, 443), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    tls.socket = context.wrap_socket(tls.socket, server_side=True)
    servers.append(tls)
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    servers[0].serve_forever()
    """
)


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=30)


class TargetNamespace:
    def __init__(self, names: Sequence[str]) -> None:
        tag = uuid.uuid4().hex[:6]
        self.netns = f"eplab-{tag}"
        self.host_if = f"eph-{tag}"
        self.ns_if = f"epn-{tag}"
        # A /29 of 203.0.113.0/24 and a /64 of 2001:db8::/32 (documentation ranges), drawn at
        # random so that concurrent runs (and other suites' namespaces) do not overlap.
        base = 8 * random.randrange(1, 31)
        self.prefixlen = 29
        self.host_address = f"203.0.113.{base + 1}"
        self.address = f"203.0.113.{base + 2}"
        self.other_address = f"203.0.113.{base + 3}"  # the same servers, a second address
        net6 = f"2001:db8:51{random.randrange(256):02x}:{random.randrange(65536):x}"
        self.host_address6 = f"{net6}::1"
        self.address6 = f"{net6}::2"
        self.names = tuple(names)
        self.folder = Path(tempfile.mkdtemp(prefix="eplab-"))
        self.server: subprocess.Popen[str] | None = None

    def start(self) -> TargetNamespace:
        _sh("ip", "netns", "add", self.netns)
        _sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _sh("ip", "link", "set", self.ns_if, "netns", self.netns)
        _sh("ip", "addr", "add", f"{self.host_address}/{self.prefixlen}", "dev", self.host_if)
        _sh("ip", "link", "set", self.host_if, "up")
        inside = ("ip", "netns", "exec", self.netns)
        _sh(*inside, "ip", "addr", "add", f"{self.address}/{self.prefixlen}", "dev", self.ns_if)
        _sh(*inside, "ip", "addr", "add", f"{self.other_address}/{self.prefixlen}", "dev", self.ns_if)
        _sh(*inside, "ip", "link", "set", self.ns_if, "up")
        _sh(*inside, "ip", "link", "set", "lo", "up")
        _sh(*inside, "ip", "route", "add", "default", "via", self.host_address)
        _sh("ip", "addr", "add", f"{self.host_address6}/64", "dev", self.host_if, "nodad")
        _sh(*inside, "ip", "addr", "add", f"{self.address6}/64", "dev", self.ns_if, "nodad")
        _sh(*inside, "ip", "-6", "route", "add", "default", "via", self.host_address6)
        for address in (self.address, self.other_address, self.address6):
            route = json.loads(_sh("ip", "-j", "route", "get", address).stdout)
            if route[0].get("dev") != self.host_if:
                raise AssertionError(f"the route to {address} leaves by {route[0].get('dev')}, not {self.host_if}")
        cert, key = self.folder / "cert.pem", self.folder / "key.pem"
        san = ",".join(f"DNS:{name}" for name in self.names)
        _sh(
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", f"/CN={self.names[0]}", "-addext", f"subjectAltName={san}",
            "-keyout", str(key), "-out", str(cert),
        )  # fmt: skip
        script = self.folder / "server.py"
        script.write_text(SERVER)
        self.server = subprocess.Popen(
            [*inside, sys.executable, str(script), "::", str(cert), str(key)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.server.stdout is not None
        line = self.server.stdout.readline()
        if line.strip() != "ready":
            raise AssertionError(
                f"target servers did not start: {line} {self.server.stderr.read() if self.server.stderr else ''}"
            )
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait(timeout=10)
        _sh("ip", "link", "del", self.host_if, check=False)
        _sh("ip", "netns", "del", self.netns, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


class LocalResolver:
    """dnsmasq answering fixed names on 127.0.0.N:53, no upstream, nothing else."""

    def __init__(self, answers: dict[str, str], address: str = "127.0.0.77") -> None:
        self.answers = answers
        self.address = address
        self.folder = Path(tempfile.mkdtemp(prefix="eplab-dns-"))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> LocalResolver:
        binary = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
        args = [
            binary, "--keep-in-foreground", "--no-resolv", "--no-hosts", "--no-poll",
            f"--listen-address={self.address}", "--bind-interfaces", "--port=53",
            f"--pid-file={self.folder / 'pid'}", "--user=root",
            *(f"--host-record={name},{address}" for name, address in self.answers.items()),
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"dnsmasq exited: {self.process.stderr.read() if self.process.stderr else b''!r}")
            if _udp_answers(self.address):
                return self
            time.sleep(0.05)
        raise AssertionError("dnsmasq did not answer")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def _udp_answers(address: str) -> bool:
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x04test\x00\x00\x01\x00\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.2)
        try:
            sock.sendto(query, (address, 53))
            return sock.recv(512)[:2] == b"\x12\x34"
        except OSError:
            return False


def _exception_handle(tag: str) -> int | None:
    listed = _sh("nft", "-j", "-a", "list", "chain", "inet", "sandbox_console", "sandbox_to_host", check=False)
    if listed.returncode != 0:
        return None
    for item in json.loads(listed.stdout)["nftables"]:
        found = item.get("rule")
        if found and found.get("comment") == tag:
            return int(found["handle"])
    return None


@contextlib.contextmanager
def input_exception(ports: Sequence[int]) -> Iterator[None]:
    """Accept tcp `ports` from sandbox bridges in the live input chain while inside.

    The table is shared by everyone on this machine and re-applied whole by whoever renders
    it (then the inserted rule is gone): a watcher puts it back within a quarter second.
    Once the renderer itself accepts the proxy ports from online sandboxes this is a no-op
    duplicate."""
    tag = f"eplab-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    rule = ["tcp", "dport", "{", ", ".join(str(p) for p in ports), "}", "accept", "comment", f'"{tag}"']
    listed = _sh("nft", "list", "chain", "inet", "sandbox_console", "sandbox_to_host", check=False)
    if listed.returncode != 0:
        raise AssertionError(f"the table inet sandbox_console is not loaded: {listed.stderr}")

    def ensure() -> None:
        if _exception_handle(tag) is None:
            _sh("nft", "insert", "rule", "inet", "sandbox_console", "sandbox_to_host", *rule, check=False)

    ensure()
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.25):
            ensure()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=5)
        handle = _exception_handle(tag)
        if handle is not None:
            _sh(
                "nft",
                "delete",
                "rule",
                "inet",
                "sandbox_console",
                "sandbox_to_host",
                "handle",
                str(handle),
                check=False,
            )

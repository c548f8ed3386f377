"""Web terminal: keystroke echo and bulk throughput through Daphne + consumer + Docker PTY,
against the same measured directly on the backend's PTY, in one run.

Setup: a throw-away SQLite database and var dir, one user, space, Docker config and session;
Daphne serves `console.asgi:application` in a subprocess on a free loopback port; a minimal
websocket client (this file, raw sockets) connects with the user's session cookie and a
ticket, exactly like the browser does.

- echo: inside `cat > /dev/null` (the kernel's line discipline echoes each byte), send one
  byte and wait for it to come back, N times (default 200); p50/p95 in ms.
- throughput: `head -c SIZE /dev/zero | tr '\\0' x` in the shell, timed until the end
  marker arrives (default 50 MB; pass a smaller size on a slow machine).

The last line is JSON: {"echo_p50_ms", "echo_p95_ms", "direct_echo_p50_ms",
"direct_echo_p95_ms", "ws_mb_s", "direct_mb_s", "throughput_ratio", "bytes", "keystrokes"}.

Usage: python bench/terminal.py [KEYSTROKES] [BYTES]   (needs the Docker engine)
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEYSTROKES = int(sys.argv[1]) if len(sys.argv) > 1 else 200
BULK_BYTES = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000_000
MARK = b"<<DONE>>"
BULK_COMMAND = f"head -c {BULK_BYTES} /dev/zero | tr '\\0' x; printf '%s' '<<''DONE>>'\n".encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- A minimal websocket client (RFC 6455): enough for binary/text frames, ping and close ---


class WebSocket:
    def __init__(self, host: str, port: int, path: str, headers: dict[str, str]) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.reader = self.sock.makefile("rb", buffering=1024 * 1024)
        status = self.reader.readline()
        if b" 101 " not in status:
            raise RuntimeError(f"handshake refused: {status!r}")
        while self.reader.readline() not in (b"\r\n", b""):
            pass

    def send(self, payload: bytes, opcode: int = 2) -> None:
        mask = secrets.token_bytes(4)
        n = len(payload)
        if n < 126:
            header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 65536:
            header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def send_json(self, message: dict[str, Any]) -> None:
        self.send(json.dumps(message).encode(), opcode=1)

    def recv(self) -> tuple[int, bytes]:
        """(opcode, payload) of the next data frame; answers pings; raises on close."""
        while True:
            first, second = self.reader.read(2)
            opcode, n = first & 0x0F, second & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self.reader.read(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self.reader.read(8))
            payload = self.reader.read(n)
            if opcode == 9:
                self.send(payload, opcode=10)
            elif opcode == 8:
                raise ConnectionError(f"closed by the server: {payload!r}")
            elif opcode in (1, 2):
                return opcode, payload

    def recv_bytes_until(self, needle: bytes) -> int:
        """Read PTY bytes until `needle` shows up; returns how many bytes came."""
        total, tail = 0, b""
        while True:
            opcode, payload = self.recv()
            if opcode != 2:
                print(f"control: {payload.decode(errors='replace')}", file=sys.stderr)
                continue
            total += len(payload)
            if os.environ.get("BENCH_DEBUG"):
                print(f"pty: {payload[:200]!r}", file=sys.stderr)
            window = tail + payload
            if needle in window:
                return total
            tail = window[-len(needle) :]

    def close(self) -> None:
        try:
            self.send(struct.pack("!H", 1000), opcode=8)
        finally:
            self.sock.close()


# --- The two paths behind one small interface ------------------------------------------------


class WsPath:
    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    def write(self, data: bytes) -> None:
        self.ws.send(data)

    def read_until(self, needle: bytes) -> int:
        return self.ws.recv_bytes_until(needle)


class DirectPath:
    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def write(self, data: bytes) -> None:
        self.handle.write(data)

    def read_until(self, needle: bytes) -> int:
        total, tail = 0, b""
        while True:
            chunk = self.handle.read(65536, timeout=30)
            if not chunk:
                raise ConnectionError("the PTY closed")
            total += len(chunk)
            if os.environ.get("BENCH_DEBUG"):
                print(f"direct: {chunk[:200]!r}", file=sys.stderr)
            window = tail + chunk
            if needle in window:
                return total
            tail = window[-len(needle) :]


def measure(path: WsPath | DirectPath) -> tuple[list[float], float]:
    """(echo round trips in ms, bulk MB/s) on one shell."""
    path.write(b"echo rea''dy-$((40+2))\n")
    path.read_until(b"ready-42")
    path.write(b"cat > /dev/null\n")
    time.sleep(0.5)
    path.write(b"z")
    path.read_until(b"z")  # cat is reading: from here on each byte is echoed by the kernel
    samples = []
    for _ in range(KEYSTROKES):
        started = time.perf_counter()
        path.write(b"k")
        path.read_until(b"k")
        samples.append((time.perf_counter() - started) * 1000)
    path.write(b"\x03")  # Ctrl-C ends cat; the line discipline flushes input typed before it
    path.read_until(b"^C")
    time.sleep(0.3)
    path.write(b"echo back-$((1+1))\n")
    path.read_until(b"back-2")
    started = time.perf_counter()
    path.write(BULK_COMMAND)
    received = path.read_until(MARK)
    elapsed = time.perf_counter() - started
    assert received >= BULK_BYTES, received
    return samples, BULK_BYTES / elapsed / 1e6


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # still clean up when killed
    workdir = Path(tempfile.mkdtemp(prefix="bench-terminal-"))
    run_id = f"bench-{uuid.uuid4().hex[:10]}"
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "console.settings.base",
        # A throwaway console still needs its own keys: the default one is refused outside DEBUG.
        "SECRET_KEY": secrets.token_urlsafe(50),
        "FIELD_ENCRYPTION_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "CONSOLE_VAR_DIR": str(workdir),
        "DATABASE_URL": f"sqlite:///{workdir / 'bench.sqlite3'}",
        "CONSOLE_INSTALLATION_ID": run_id,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "REDIS_URL": "",
        "LOG_LEVEL": "DEBUG" if os.environ.get("BENCH_DEBUG") else "WARNING",
    }
    os.environ.update(env)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from console.models import Membership, NetworkPolicy, Role, Space
    from sandboxes.backends.base import META_INSTALLATION, ListQuery, PtySize
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE, build_base_image
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import PlatformBackend, SandboxConfig
    from sandboxes.sessions.lookup import get_or_create_session
    from sandboxes.sessions.runtime import Runtime
    from sandboxes.terminal.tickets import create_terminal, issue_ticket

    call_command("migrate", verbosity=0)
    build_base_image()
    user = get_user_model().objects.create_user(username="bench")  # logs in by session only
    space = Space.objects.create(name="Bench", slug="bench")
    NetworkPolicy.objects.create(space=space)
    Membership.objects.create(space=space, user=user, role=Role.MEMBER)
    local = PlatformBackend.objects.create(name="bench local engine", kind="docker")
    local.spaces.add(space)
    config = SandboxConfig.objects.create(
        space=space, name="bench", backend=local, default_template=DEFAULT_BASE_IMAGE, is_default=True
    )
    session = get_or_create_session(space, "bench-terminal")
    resolved = Runtime().resolve_session(session)
    backend = get_backend(config)

    daphne = subprocess.Popen(
        [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port), "console.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=None if os.environ.get("BENCH_DEBUG") else subprocess.DEVNULL,
    )
    ws: WebSocket | None = None
    handle = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or daphne.poll() is not None:
                    raise RuntimeError("Daphne did not start") from None
                time.sleep(0.1)

        client = Client()
        client.force_login(user)
        cookie = client.cookies["sessionid"].value
        terminal = create_terminal(user, session)
        ticket = issue_ticket(terminal)
        ws = WebSocket(
            "127.0.0.1",
            port,
            f"/ws/terminals/{terminal.id}/?ticket={ticket}",
            {"Origin": f"http://127.0.0.1:{port}", "Cookie": f"sessionid={cookie}"},
        )
        while True:
            opcode, payload = ws.recv()
            if opcode == 1 and json.loads(payload).get("state") == "ready":
                break
        ws.send_json({"type": "resize", "cols": 120, "rows": 40})
        time.sleep(0.5)
        ws_echo, ws_mb_s = measure(WsPath(ws))

        ptys = backend.pty()
        assert ptys is not None
        handle = ptys.open(resolved.sandbox.sandbox_id, PtySize(cols=120, rows=40))
        direct_echo, direct_mb_s = measure(DirectPath(handle))
    finally:
        if ws is not None:
            ws.close()
        if handle is not None:
            handle.kill()
        time.sleep(0.5)  # the consumer ends its shell on the normal close
        daphne.terminate()
        daphne.wait(timeout=15)
        for info in backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: run_id})):
            backend.delete(info.sandbox_id)
        volumes = backend.volumes()
        if volumes is not None:
            volumes.delete(session.workspace_volume)
        shutil.rmtree(workdir, ignore_errors=True)

    result = {
        "echo_p50_ms": round(statistics.median(ws_echo), 3),
        "echo_p95_ms": round(percentile(ws_echo, 0.95), 3),
        "direct_echo_p50_ms": round(statistics.median(direct_echo), 3),
        "direct_echo_p95_ms": round(percentile(direct_echo, 0.95), 3),
        "ws_mb_s": round(ws_mb_s, 1),
        "direct_mb_s": round(direct_mb_s, 1),
        "throughput_ratio": round(ws_mb_s / direct_mb_s, 3),
        "bytes": BULK_BYTES,
        "keystrokes": KEYSTROKES,
    }
    print(f"{'path':<28}{'echo p50 ms':>12}{'echo p95 ms':>12}{'MB/s':>10}")
    print(
        f"{'Daphne + consumer + PTY':<28}{result['echo_p50_ms']:>12}{result['echo_p95_ms']:>12}{result['ws_mb_s']:>10}"
    )
    print(
        f"{'backend PTY directly':<28}{result['direct_echo_p50_ms']:>12}"
        f"{result['direct_echo_p95_ms']:>12}{result['direct_mb_s']:>10}"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

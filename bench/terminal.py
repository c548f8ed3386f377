"""Web terminal: what a person sees, through the console against a direct PTY, in one run.

For whoever tunes the terminal room (sandboxes/terminal/). It answers: how long after a
long output ends is the screen right, and how long does a keystroke take to show, through
Daphne + the consumer + the kept (tmux) shell, against a PTY opened straight on the engine.

Setup: a throw-away SQLite database and var dir, one user, space, Docker config and session;
Daphne serves `console.asgi:application` in a subprocess on a free loopback port (without the
in-process scheduler, which production leaves to Celery beat); a minimal
websocket client (this file, raw sockets) connects with the user's session cookie and a
ticket, exactly like the browser does. Three paths into the same sandbox, 120x40 each:

- `console`: the websocket (a kept shell: tmux's rendering of the shell, as the browser gets);
- `direct`: a PTY from the backend's `pty()` (docker-py, an exec with a TTY), plain `bash -l`;
- `direct_tmux`: the same PTY attached to a tmux session like the console's (`keeper`), to
  tell tmux's share from the console's.

Every byte a path delivers is rendered by `pyte` (a VT100 emulator): the bench judges the
screen, not the byte stream (tmux sends screen updates, not the command's bytes).

- echo: inside `cat > /dev/null` (the kernel's line discipline echoes each byte), send one
  byte and wait until the screen shows it (the cursor one cell further, the key left of it),
  N times (default 200); the time is the arrival of the bytes that completed it; p50/p95 ms.
  `console_cpu_per_key_ms` is the CPU time Daphne's process spent per keystroke meanwhile
  (every thread, from /proc): unlike the wall time it hardly moves with the machine's load.
- bulk: `head -c SIZE /dev/zero | tr '\\0' x`, then the command stamps its end (`date`, in
  the sandbox, written to a file) and prints a unique marker. `screen_lag_ms` runs from that
  end to the arrival of the bytes after which the rendered screen is the final one (full
  rows of x, the last partial row, the marker, the prompt with the cursor after it);
  `bulk_s` runs from sending the command to the same moment.

Rendering 50 MB in pyte would take minutes, so the bytes are recorded with their arrival
time and rendered afterwards, and a run of `x` longer than the screen is shortened by whole
rows before pyte sees it: the screen after it is the same (checked on a sample each run).

The last line is JSON: {"echo_p50_ms", "echo_p95_ms", "direct_echo_p50_ms",
"direct_echo_p95_ms", "direct_tmux_echo_p50_ms", "echo_ratio", "echo_goal_ms", "console_cpu_per_key_ms",
"screen_lag_ms", "direct_screen_lag_ms", "direct_tmux_screen_lag_ms", "bulk_s",
"direct_bulk_s", "bulk_ratio", "console_stream_bytes", "direct_stream_bytes", "bytes",
"keystrokes"}. Ratios are console / direct (lower is better; 1.0 is no cost).

Usage: python bench/terminal.py [KEYSTROKES] [BYTES]   (needs the Docker engine)
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import select
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

import pyte

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEYSTROKES = int(sys.argv[1]) if len(sys.argv) > 1 else 200
BULK_BYTES = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000_000
COLS, ROWS = 120, 40
ECHO_GOAL_MS = 1.0
QUIET_S = 0.3
DEADLINE_S = 600.0
DEBUG = bool(os.environ.get("BENCH_DEBUG"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- A minimal websocket client (RFC 6455): enough for binary/text frames, ping and close ---


class WebSocket:
    def __init__(self, host: str, port: int, path: str, headers: dict[str, str]) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()
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
        while b"\r\n\r\n" not in self.buffer:
            self._fill(30.0)
        head, _, rest = bytes(self.buffer).partition(b"\r\n\r\n")
        self.buffer = bytearray(rest)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"handshake refused: {head[:80]!r}")

    def _fill(self, timeout: float | None) -> bool:
        """Read what the socket has (waiting up to `timeout`); False when nothing came."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return False
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data
        return True

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self._fill(30.0):
                raise TimeoutError("a frame stopped midway")
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

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

    def recv(self, timeout: float | None = None) -> tuple[int, bytes] | None:
        """(opcode, payload) of the next data frame, None when none started in `timeout`;
        answers pings; raises on close."""
        while True:
            if not self.buffer and not self._fill(timeout):
                return None
            first, second = self._take(2)
            opcode, n = first & 0x0F, second & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self._take(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self._take(8))
            payload = self._take(n)
            if opcode == 9:
                self.send(payload, opcode=10)
            elif opcode == 8:
                raise ConnectionError(f"closed by the server: {payload!r}")
            elif opcode in (1, 2):
                return opcode, payload

    def close(self) -> None:
        try:
            with contextlib.suppress(OSError):  # the server may have closed it first
                self.send(struct.pack("!H", 1000), opcode=8)
        finally:
            self.sock.close()


# --- The paths behind one small interface ----------------------------------------------------


class WsPath:
    name = "console"

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    def write(self, data: bytes) -> None:
        self.ws.send(data)

    def recv(self, timeout: float) -> bytes | None:
        """The next PTY bytes, None when nothing came within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self.ws.recv(max(deadline - time.monotonic(), 0))
            if frame is None:
                return None
            opcode, payload = frame
            if opcode == 2:
                return payload
            print(f"control: {payload.decode(errors='replace')}", file=sys.stderr)


class DirectPath:
    def __init__(self, name: str, handle: Any) -> None:
        self.name = name
        self.handle = handle

    def write(self, data: bytes) -> None:
        self.handle.write(data)

    def recv(self, timeout: float) -> bytes | None:
        from sandboxes.backends.base import RemoteError

        try:
            chunk = self.handle.read(1 << 20, timeout=timeout)
        except RemoteError:
            return None
        if not chunk:
            raise ConnectionError("the PTY closed")
        return bytes(chunk)


# --- What the screen shows -------------------------------------------------------------------

# A run of x longer than this (and the rows of x it leaves on screen) can lose whole rows.
RUN = re.compile(rb"x{%d,}" % ((ROWS + 3) * COLS))
KEEP_HEAD = 16  # never cut the first bytes of a run (an escape sequence could end in x)


def shorten(data: bytes) -> bytes:
    """`data` with each long run of x cut by whole rows: pyte's screen (no history) ends the
    same, since the run still fills every row and keeps its alignment."""

    def cut(match: re.Match[bytes]) -> bytes:
        run = len(match.group())
        drop = (run - KEEP_HEAD - (ROWS + 2) * COLS) // COLS * COLS
        return b"x" * (run - drop)

    return RUN.sub(cut, data)


class AnsweringScreen(pyte.Screen):
    """pyte's screen plus what tmux uses and pyte 0.8 lacks: scroll up/down (SU, SD) and
    repeat (REP); it answers the terminal's queries (device attributes, cursor position) as
    xterm.js does, and keeps every sequence it could not render (`unknown`)."""

    def __init__(self, columns: int, lines: int) -> None:
        super().__init__(columns, lines)
        self.answers: list[str] = []
        self.unknown: set[str] = set()
        self.last_char = " "

    def write_process_input(self, data: str) -> None:
        self.answers.append(data)

    def debug(self, *args: Any, **kwargs: Any) -> None:
        self.unknown.add(repr(args)[:60])

    def draw(self, data: str) -> None:
        super().draw(data)
        if data:
            self.last_char = data[-1]

    def repeat(self, count: int | None = None, *args: Any, **kwargs: Any) -> None:
        self.draw(self.last_char * max(count or 1, 1))

    def _scroll(self, count: int | None, up: bool) -> None:
        top, bottom = self.margins or pyte.screens.Margins(0, self.lines - 1)
        x, y = self.cursor.x, self.cursor.y
        self.cursor.y = bottom if up else top
        for _ in range(max(count or 1, 1)):
            self.index() if up else self.reverse_index()
        self.cursor.x, self.cursor.y = x, y

    def scroll_up(self, count: int | None = None, *args: Any, **kwargs: Any) -> None:
        self._scroll(count, up=True)

    def scroll_down(self, count: int | None = None, *args: Any, **kwargs: Any) -> None:
        self._scroll(count, up=False)


class FullStream(pyte.ByteStream):
    csi = {**pyte.ByteStream.csi, "S": "scroll_up", "T": "scroll_down", "b": "repeat"}


class Renderer:
    """A 120x40 VT emulator fed every byte a path delivers; its answers go back to the path."""

    def __init__(self, path: Any) -> None:
        self.path = path
        self.screen = AnsweringScreen(COLS, ROWS)
        self.stream = FullStream(self.screen)

    def feed(self, data: bytes) -> None:
        self.stream.feed(shorten(data))
        if self.screen.answers:
            self.path.write("".join(self.screen.answers).encode())
            self.screen.answers.clear()

    def position(self) -> int:
        return self.screen.cursor.y * COLS + self.screen.cursor.x

    def char_before_cursor(self) -> str:
        position = self.position() - 1
        return str(self.screen.buffer[position // COLS][position % COLS].data)

    def shows(self, text: str) -> bool:
        return any(text in line for line in self.screen.display)


def check_shortening() -> None:
    """The shortened feed renders like the full one (this run's pyte, a 200 kB sample)."""
    sample = b"$ head\r\n" + b"x" * (200_000 + 37) + b"\r\nEND\r\n$ "
    full, short = AnsweringScreen(COLS, ROWS), AnsweringScreen(COLS, ROWS)
    FullStream(full).feed(sample)
    FullStream(short).feed(shorten(sample))
    assert len(shorten(sample)) < len(sample) / 10
    assert full.display == short.display
    assert (full.cursor.x, full.cursor.y) == (short.cursor.x, short.cursor.y)


def final_screen(marker: str) -> list[str]:
    """The screen after the bulk command: rows of x, the last partial row, the marker, the prompt."""
    tail = BULK_BYTES % COLS or COLS
    rows = ["x" * COLS] * (ROWS - 3) + ["x" * tail, marker, "$ "]
    return [row.ljust(COLS) for row in rows]


# --- The measures ----------------------------------------------------------------------------


def read_until(path: Any, screen: Renderer, seen: Any, what: str) -> None:
    """Feed the screen until `seen(screen)`, then until the path is quiet."""
    deadline = time.monotonic() + 60
    while not seen(screen):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name}: no {what} on screen:\n" + "\n".join(screen.screen.display))
        chunk = path.recv(1.0)
        if chunk:
            screen.feed(chunk)
    while (chunk := path.recv(QUIET_S)) is not None:
        screen.feed(chunk)


def prepare(path: Any, screen: Renderer) -> None:
    path.write(b"export PS1='$ ' PROMPT_COMMAND=; unset PROMPT_COMMAND; clear; echo rea''dy-$((40+2))\n")
    read_until(path, screen, lambda s: s.shows("ready-42"), "ready marker")


def measure_echo(path: Any, screen: Renderer, cpu_ns: Any) -> tuple[list[float], float]:
    """Round trips in ms from sending a key to the arrival of the bytes that show it, and
    the CPU time the console's process spent per keystroke (ms; 0 for a direct path)."""
    path.write(b"clear; cat > /dev/null\n")
    time.sleep(0.5)
    read_until(path, screen, lambda s: s.screen.cursor.y <= 2 and s.screen.cursor.x == 0, "cat")
    samples = []
    cpu_before = cpu_ns()
    for _ in range(KEYSTROKES):
        want = screen.position() + 1
        started = time.perf_counter()
        path.write(b"k")
        while True:
            chunk = path.recv(5.0)
            arrived = time.perf_counter()
            if chunk is None:
                raise TimeoutError(f"{path.name}: a keystroke did not echo")
            screen.feed(chunk)
            if DEBUG:
                print(f"{path.name} {(arrived - started) * 1000:.3f} ms {chunk!r}", file=sys.stderr)
            if screen.position() >= want and screen.char_before_cursor() == "k":
                break
        samples.append((arrived - started) * 1000)
    cpu_per_key_ms = (cpu_ns() - cpu_before) / KEYSTROKES / 1e6
    path.write(b"\x03")  # Ctrl-C ends cat; the prompt comes back
    time.sleep(0.3)
    path.write(b"echo back-$((1+1))\n")
    read_until(path, screen, lambda s: s.shows("back-2"), "prompt after cat")
    return samples, cpu_per_key_ms


def measure_bulk(path: Any, screen: Renderer, exec_in_sandbox: Any) -> dict[str, float]:
    """Run the bulk command; time the final screen from the command's end and from its start."""
    token = secrets.token_hex(4)
    marker = f"END-{token}"
    stamp = f"/tmp/bench-end-{token}"
    command = (
        f"clear; head -c {BULK_BYTES} /dev/zero | tr '\\0' x; date +%s%N > {stamp}; printf '\\nEN''D-%s\\n' {token}\n"
    )
    chunks: list[tuple[int, bytes]] = []
    sent_ns = time.time_ns()
    path.write(command.encode())
    needle, tail = marker.encode(), b""
    deadline = time.monotonic() + DEADLINE_S
    seen = False
    while time.monotonic() < deadline:
        chunk = path.recv(QUIET_S if seen else 3.0)
        if chunk is None:
            # Quiet after the marker; or quiet with the command over (a marker drawn in pieces).
            if seen or exec_in_sandbox(f"test -s {stamp} && echo over").strip() == "over":
                break
            continue
        chunks.append((time.time_ns(), chunk))
        window = tail + chunk
        seen = seen or needle in window
        tail = window[-len(needle) :]
    else:
        raise TimeoutError(f"{path.name}: the bulk command did not finish")
    end_ns = int(exec_in_sandbox(f"cat {stamp}; rm -f {stamp}").strip())
    expected = final_screen(marker)
    # Bytes that came before the command ended cannot show its marker: render them at once.
    first = next((i for i, (t, _) in enumerate(chunks) if t >= end_ns), len(chunks))
    screen.feed(b"".join(c for _, c in chunks[:first]))
    right_ns = None
    for arrived, chunk in chunks[first:]:
        screen.feed(chunk)
        if right_ns is None and screen.screen.display == expected and screen.position() == (ROWS - 1) * COLS + 2:
            right_ns = arrived
    if right_ns is None or screen.screen.display != expected:
        stream = b"".join(c for _, c in chunks)
        raise AssertionError(
            f"{path.name}: the final screen is not right:\n"
            + "\n".join(screen.screen.display)
            + f"\n{stream[-1500:]!r}"
        )
    return {
        "screen_lag_ms": (right_ns - end_ns) / 1e6,
        "bulk_s": (right_ns - sent_ns) / 1e9,
        "stream_bytes": sum(len(c) for _, c in chunks),
    }


def measure(path: Any, exec_in_sandbox: Any, cpu_ns: Any = lambda: 0) -> dict[str, Any]:
    screen = Renderer(path)
    prepare(path, screen)
    echo, cpu_per_key_ms = measure_echo(path, screen, cpu_ns)
    bulk = measure_bulk(path, screen, exec_in_sandbox)
    if screen.screen.unknown:
        print(f"{path.name}: sequences pyte did not render: {sorted(screen.screen.unknown)}", file=sys.stderr)
    return {"echo": echo, "cpu_per_key_ms": cpu_per_key_ms, **bulk}


def process_cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process so far (ns, from /proc/<pid>/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # still clean up when killed
    if BULK_BYTES < 2 * ROWS * COLS:
        raise SystemExit(f"BYTES must fill the screen twice (at least {2 * ROWS * COLS})")
    check_shortening()
    workdir = Path(tempfile.mkdtemp(prefix="bench-terminal-"))
    run_id = f"bench-{uuid.uuid4().hex[:10]}"
    port = free_port()
    # Daphne runs without the in-process scheduler: with Redis (production) periodic work runs
    # on Celery beat, never beside the websockets, and here it would share their CPU.
    (workdir / "bench_terminal_settings.py").write_text(
        "from console.settings.base import *  # noqa: F403\n\nRUN_SCHEDULER = False\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench_terminal_settings",
        "PYTHONPATH": os.pathsep.join([str(workdir), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        # A throwaway console still needs its own keys: the default one is refused outside DEBUG.
        "SECRET_KEY": secrets.token_urlsafe(50),
        "FIELD_ENCRYPTION_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "CONSOLE_VAR_DIR": str(workdir),
        "DATABASE_URL": f"sqlite:///{workdir / 'bench.sqlite3'}",
        "CONSOLE_INSTALLATION_ID": run_id,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "REDIS_URL": "",
        "CONSOLE_TUNING": f"logs.level={'DEBUG' if DEBUG else 'WARNING'}",
    }
    os.environ.update(env)
    sys.path.insert(0, str(workdir))
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from console.models import Membership, NetworkPolicy, Role, Space
    from sandboxes.backends.base import META_INSTALLATION, ExecRequest, ListQuery, PtySize
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE, build_base_image
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import PlatformBackend, SandboxConfig
    from sandboxes.sessions.lookup import get_or_create_session
    from sandboxes.sessions.runtime import Runtime
    from sandboxes.terminal import keeper
    from sandboxes.terminal.shells import SHELL
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
    sandbox_id = resolved.sandbox.sandbox_id
    backend = get_backend(config)
    ptys = backend.pty()
    assert ptys is not None
    size = PtySize(cols=COLS, rows=ROWS)

    def exec_in_sandbox(script: str) -> str:
        return backend.exec(sandbox_id, ExecRequest(argv=("/bin/sh", "-c", script))).stdout.decode()

    server = [
        str(Path(sys.executable).parent / "daphne"),
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "console.asgi:application",
    ]
    if os.environ.get("BENCH_PROFILE"):  # a cProfile of Daphne's main thread, written when it stops
        server = [sys.executable, "-m", "cProfile", "-o", os.environ["BENCH_PROFILE"], *server]
    daphne = subprocess.Popen(
        server,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=None if DEBUG else subprocess.DEVNULL,
    )
    ws: WebSocket | None = None
    handles: list[Any] = []
    tmux_id = uuid.uuid4().hex
    results: dict[str, dict[str, Any]] = {}
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
            frame = ws.recv(60)
            if frame is None:
                raise TimeoutError("the terminal did not become ready")
            opcode, payload = frame
            if opcode == 1 and json.loads(payload).get("state") == "ready":
                if not json.loads(payload).get("kept"):
                    print("note: the console's shell is not kept (no tmux)", file=sys.stderr)
                break
        ws.send_json({"type": "resize", "cols": COLS, "rows": ROWS})
        time.sleep(0.5)

        results["console"] = measure(WsPath(ws), exec_in_sandbox, lambda: process_cpu_ns(daphne.pid))
        # Closed now: nobody reads it (or answers Daphne's pings) while the direct paths run.
        ws.close()
        ws = None

        handles.append(ptys.open(sandbox_id, size))
        results["direct"] = measure(DirectPath("direct", handles[-1]), exec_in_sandbox)

        assert keeper.probe(backend, sandbox_id, tmux_id).kept, "the base image has tmux"
        command = keeper.attach_command(tmux_id, size, SHELL)
        handles.append(ptys.open(sandbox_id, size, command=command, user="user", cwd="/workspace"))
        results["direct_tmux"] = measure(DirectPath("direct_tmux", handles[-1]), exec_in_sandbox)
    finally:
        # Every step on its own: one that fails leaves no server, sandbox or volume behind.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with contextlib.suppress(Exception):
            if ws is not None:
                ws.close()
        for handle in handles:
            with contextlib.suppress(Exception):
                handle.kill()
        with contextlib.suppress(Exception):
            keeper.end(backend, sandbox_id, tmux_id)
        time.sleep(0.5)  # the consumer ends its shell on the normal close
        daphne.terminate()
        try:
            daphne.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daphne.kill()
            daphne.wait()
        with contextlib.suppress(Exception):
            for info in backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: run_id})):
                backend.delete(info.sandbox_id)
        with contextlib.suppress(Exception):
            volumes = backend.volumes()
            if volumes is not None:
                volumes.delete(session.workspace_volume)
        shutil.rmtree(workdir, ignore_errors=True)

    console, direct, direct_tmux = results["console"], results["direct"], results["direct_tmux"]
    result = {
        "echo_p50_ms": round(statistics.median(console["echo"]), 3),
        "echo_p95_ms": round(percentile(console["echo"], 0.95), 3),
        "direct_echo_p50_ms": round(statistics.median(direct["echo"]), 3),
        "direct_echo_p95_ms": round(percentile(direct["echo"], 0.95), 3),
        "direct_tmux_echo_p50_ms": round(statistics.median(direct_tmux["echo"]), 3),
        "echo_ratio": round(statistics.median(console["echo"]) / statistics.median(direct["echo"]), 2),
        "echo_goal_ms": ECHO_GOAL_MS,
        "console_cpu_per_key_ms": round(console["cpu_per_key_ms"], 3),
        "screen_lag_ms": round(console["screen_lag_ms"], 1),
        "direct_screen_lag_ms": round(direct["screen_lag_ms"], 1),
        "direct_tmux_screen_lag_ms": round(direct_tmux["screen_lag_ms"], 1),
        "bulk_s": round(console["bulk_s"], 2),
        "direct_bulk_s": round(direct["bulk_s"], 2),
        "bulk_ratio": round(console["bulk_s"] / direct["bulk_s"], 2),
        "console_stream_bytes": console["stream_bytes"],
        "direct_stream_bytes": direct["stream_bytes"],
        "bytes": BULK_BYTES,
        "keystrokes": KEYSTROKES,
    }
    print(f"{'path':<32}{'echo p50 ms':>12}{'echo p95 ms':>12}{'screen lag ms':>15}{'bulk s':>9}")
    for label, name in (
        ("console (Daphne + tmux + PTY)", "console"),
        ("backend PTY directly", "direct"),
        ("backend PTY + tmux", "direct_tmux"),
    ):
        row = results[name]
        print(
            f"{label:<32}{statistics.median(row['echo']):>12.3f}{percentile(row['echo'], 0.95):>12.3f}"
            f"{row['screen_lag_ms']:>15.1f}{row['bulk_s']:>9.2f}"
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

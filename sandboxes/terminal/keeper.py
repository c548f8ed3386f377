"""Shells kept by the sandbox side: one tmux session per terminal, reattachable from any process.

A web terminal's shell runs inside a tmux server in the sandbox (session `term-<terminal id>`,
on a socket of the console's own, `-L sandbox-console`), and the PTY that a console process
opens is only a tmux client attached to it. So a reconnect through any Daphne process
reattaches the same shell: it first asks for the pane's scrollback (`capture-pane`), sends it
to the browser, then attaches (`new-session -A -D`, which detaches any earlier client; tmux
redraws the screen). Ending the terminal kills the tmux session.

Everything goes through the contract's `exec` and `pty()`: nothing here knows the backend. A
sandbox whose template has no tmux gets a plain shell, and the caller says so ("the shell was
replaced") when that shell cannot be the one an earlier connection had.

The tmux configuration hides tmux: no status line, no prefix key or key bindings (Ctrl-b
stays bash's), no alternate screen and no multi-line scroll (`indn`, CSI S: xterm.js drops the
lines it scrolls off instead of keeping them), so the browser's own scrollback gets every
line that scrolls by, a short
escape delay (50 ms: quick for vim, yet the answer xterm.js gives to tmux's device-attributes
query on attach is not split into keys that reach the shell as `0;276;0c`), UTF-8 (`-u`)
whatever the locale.
"""

from __future__ import annotations

import contextlib
import secrets
import shlex
from dataclasses import dataclass

from ..backends.base import Backend, ExecRequest, PtySize, RemoteError

SOCKET = "sandbox-console"
SCROLLBACK_LINES = 5000
PROBE_TIMEOUT_S = 20.0
CONFIG = """\
set -g status off
set -g prefix None
set -g prefix2 None
unbind-key -a -T prefix
unbind-key -a -T root
set -g escape-time 50
set -g history-limit 10000
set -g default-terminal tmux-256color
set -ga terminal-overrides ',xterm*:smcup@:rmcup@:indn@:rin@'
set -g mouse off
set -g window-size latest
set -g exit-empty on
set -g set-titles off
set -g remain-on-exit off
"""
# The config lives in the session user's temporary folder, rewritten by every probe.
CONFIG_PATH = '"${TMPDIR:-/tmp}/sandbox-console-tmux-$(id -u).conf"'
_HEADER_END = b"\n--scrollback--\n"


def session_name(terminal_id: str) -> str:
    return "term-" + str(terminal_id).replace("-", "")


def _tmux(*args: str) -> str:
    return f"tmux -u -L {SOCKET} -f {CONFIG_PATH} " + " ".join(args)


@dataclass(frozen=True)
class Probe:
    """What the sandbox can do for one terminal, and what it already holds."""

    kept: bool  # tmux is there: the shell outlives a connection
    exists: bool  # the terminal's tmux session runs (an earlier connection's shell)
    scrollback: bytes = b""  # its pane's history and screen, ready for a terminal (CRLF)


NOT_KEPT = Probe(kept=False, exists=False)


def probe(backend: Backend, sandbox_id: str, terminal_id: str, *, lines: int = SCROLLBACK_LINES) -> Probe:
    """One exec: write the config, tell whether tmux and the session exist, capture the pane.

    A backend whose exec fails answers "not kept" (a plain shell still works)."""
    target = shlex.quote(f"={session_name(terminal_id)}:")
    script = (
        f"command -v tmux >/dev/null 2>&1 || {{ echo kept=0; exit 0; }}; "
        f"cat > {CONFIG_PATH}; echo kept=1; "
        f"if {_tmux('has-session', '-t', target)} 2>/dev/null; then echo exists=1; "
        f"printf -- '--scrollback--\\n'; {_tmux('capture-pane', '-p', '-e', '-S', f'-{int(lines)}', '-t', target)}; "
        f"else echo exists=0; fi"
    )
    try:
        result = backend.exec(
            sandbox_id,
            ExecRequest(argv=("/bin/sh", "-c", script), stdin=CONFIG.encode(), timeout_s=PROBE_TIMEOUT_S),
        )
    except RemoteError:
        return NOT_KEPT
    out = result.stdout
    head, _, capture = out.partition(_HEADER_END)
    words = set(head.decode("utf-8", "replace").split())
    kept = result.exit_code == 0 and "kept=1" in words
    exists = kept and "exists=1" in words
    scrollback = b""
    if exists and capture:
        scrollback = capture.rstrip(b"\n").replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    return Probe(kept=kept, exists=exists, scrollback=scrollback)


HISTORY_LINES = 10000


@dataclass(frozen=True)
class History:
    """A kept shell's pane as tmux holds it: the lines above the screen, the screen, the cursor."""

    lines: int  # tmux's history size (may exceed what `history` holds)
    history: bytes  # with SGR escapes, one line per LF
    screen: bytes
    cursor: tuple[int, int]  # x, y on the screen


def history(backend: Backend, sandbox_id: str, terminal_id: str, *, lines: int = HISTORY_LINES) -> History | None:
    """One exec: the pane's history size and cursor, its history (no more than `lines`) and its
    screen. None when the sandbox keeps no such shell or the exec fails.

    The browser rebuilds its scrollback from it after a burst of output: tmux drops what a
    slow client cannot take and redraws only the screen, so lines scrolled by meanwhile
    never reach xterm.js."""
    target = shlex.quote(f"={session_name(terminal_id)}:")
    fmt = shlex.quote("#{history_size} #{cursor_x} #{cursor_y}")
    # Markers a program in the pane cannot guess: its output may hold any line, ours included.
    mark = secrets.token_hex(8)
    history_mark, screen_mark = f"--history-{mark}--", f"--screen-{mark}--"
    script = (
        f"command -v tmux >/dev/null 2>&1 || exit 3; "
        f"{_tmux('display-message', '-p', '-t', target, fmt)} || exit 4; "
        f"printf -- '{history_mark}\\n'; "
        f"{_tmux('capture-pane', '-p', '-e', '-S', f'-{int(lines)}', '-E', '-1', '-t', target)} || exit 5; "
        f"printf -- '{screen_mark}\\n'; "
        f"{_tmux('capture-pane', '-p', '-e', '-t', target)}"
    )
    try:
        result = backend.exec(sandbox_id, ExecRequest(argv=("/bin/sh", "-c", script), timeout_s=PROBE_TIMEOUT_S))
    except RemoteError:
        return None
    head, found, rest = result.stdout.partition(f"\n{history_mark}\n".encode())
    past, found_screen, screen = rest.partition(f"\n{screen_mark}\n".encode())
    words = head.split()
    if result.exit_code != 0 or not found or not found_screen or len(words) != 3 or not all(w.isdigit() for w in words):
        return None
    size, x, y = (int(word) for word in words)
    # With no history, tmux captures the screen's first line for -E -1: nothing to send.
    return History(lines=size, history=past if size else b"", screen=screen.rstrip(b"\n"), cursor=(x, y))


def attach_command(terminal_id: str, size: PtySize, shell: tuple[str, ...]) -> tuple[str, ...]:
    """The PTY's command: attach to the terminal's tmux session, creating it with `shell`.

    `-D` detaches any other client first (a connection through another process)."""
    size = size.clamped()
    name = session_name(terminal_id)
    line = _tmux("new-session", "-A", "-D", "-s", name, "-x", str(size.cols), "-y", str(size.rows), "--")
    return ("/bin/sh", "-c", f'exec {line} "$@"', "sh", *shell)


def end(backend: Backend, sandbox_id: str, terminal_id: str) -> None:
    """Kill the terminal's tmux session (and so its shell); idempotent, errors ignored."""
    target = shlex.quote(f"={session_name(terminal_id)}")
    script = f"command -v tmux >/dev/null 2>&1 || exit 0; {_tmux('kill-session', '-t', target)} 2>/dev/null; true"
    with contextlib.suppress(RemoteError):
        backend.exec(sandbox_id, ExecRequest(argv=("/bin/sh", "-c", script), timeout_s=PROBE_TIMEOUT_S))

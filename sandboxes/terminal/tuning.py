"""The web terminal's knobs (docs/terminal-protocol.md); overrides: CONSOLE_TUNING terminal.*."""

from __future__ import annotations

from dataclasses import dataclass

from console.tuning import room


@dataclass(frozen=True)
class TerminalTuning:
    # No input or output for this long closes a terminal (with a message). Cube uses 30 minutes.
    idle_timeout_s: int = 8 * 3600  # a workday
    # After an abnormal disconnect the shell waits this long for the same terminal to reattach.
    reattach_s: int = 30
    # A websocket ticket is single-use and valid this long after it was issued.
    ticket_max_age_s: int = 30
    # Terminals (shells) a session holds at once, all users and pages together; a page opens
    # at most 8 tabs. Each is a PTY in the sandbox and a reader in the console.
    max_per_session: int = 16
    # Output kept per terminal for replay on reattach.
    replay_bytes: int = 1024 * 1024
    # How often an open terminal marks its session active and re-checks access.
    keepalive_s: int = 30
    # A console process holding a terminal's websocket renews its attachment lease (a third of
    # this) so another process's grace window never closes a terminal in use elsewhere.
    lease_s: int = 30
    # Keep each terminal's shell in a tmux session in the sandbox (where the template has tmux),
    # so a reload or a reconnect through any console process gets it back. Off: a plain shell
    # per connection, whose output reaches the browser byte for byte (tmux re-renders the screen).
    keep_shells: bool = True


TERMINAL = room("terminal", TerminalTuning)

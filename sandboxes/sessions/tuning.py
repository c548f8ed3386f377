"""Sessions' knobs: engine calls, the reaper and idle sweep, files and artifacts, command output.

Overrides: CONSOLE_TUNING sessions.* (docs/configuration.md)."""

from __future__ import annotations

from dataclasses import dataclass

from console.tuning import room


@dataclass(frozen=True)
class SessionsTuning:
    # The longest a pause or a state read waits for the backend (shorter than a web worker's
    # patience), and how long a stale rebuild waits for the session's execs, commands and open
    # terminals to end before it is deferred to the next turn.
    engine_timeout_s: float = 20.0
    rebuild_wait_s: float = 5.0
    # How often the reaper and the idle sweep run; what the reaper deletes must be this old.
    reaper_interval_s: float = 60.0
    idle_sweep_interval_s: float = 60.0
    reaper_grace_s: int = 300
    # The reaper also deletes what the backends hold under this installation's labels whose
    # space, config or session is gone (sandboxes/sessions/unmanaged.py), past the grace.
    reaper_unmanaged: bool = True
    # Seconds one backend may take to list its labelled resources for the Unmanaged page.
    unmanaged_list_timeout_s: float = 10.0
    # A finished background command's output stays readable (Redis ring buffer) this long.
    command_output_retention_s: int = 3600
    # An inbound link's lifetime (sandboxes/sessions/inbound.py): its default and the longest
    # one may ask for.
    inbound_link_default_ttl_s: int = 3600
    inbound_link_max_ttl_s: int = 7 * 24 * 3600
    # Workspace files and artifacts.
    workspace_upload_max_bytes: int = 50 * 1024 * 1024
    workspace_read_max_bytes: int = 10 * 1024 * 1024
    artifact_max_files: int = 200
    artifact_max_file_bytes: int = 50 * 1024 * 1024
    artifact_max_total_bytes: int = 200 * 1024 * 1024


SESSIONS = room("sessions", SessionsTuning)

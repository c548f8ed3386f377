"""The egress logs of the host: ulogd2 writing the packet filter's refusals (the table's NFLOG
group) as JSON lines, reading them back from a byte offset, and rotating every log of the
egress component by size.

Rotation copies a log to `<name>.1` (one previous generation kept) and truncates it in place:
ulogd2, dnsmasq and squid write in append mode, so they go on at the new end without a
signal, and readers whose offset is past the end start again from 0. Refusals written between
the copy and the truncation are in `<name>.1` only.

Imports nothing of the project but `firewall` (the NFLOG group).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from typing import Any

from .firewall import NFLOG_GROUP

DEFAULT_LOG_MAX_BYTES = 64 * 1024 * 1024
ULOGD_CANDIDATES = ("/usr/sbin/ulogd", "/sbin/ulogd")
ULOGD_PLUGINS = "/usr/lib/x86_64-linux-gnu/ulogd"
REFUSALS = "refusals.json"


def render_ulogd_config(folder: str) -> str:
    plugins = ("inppkt_NFLOG", "raw2packet_BASE", "filter_IFINDEX", "filter_IP2STR", "output_JSON")
    return "\n".join(
        [
            "# Rendered by sandboxes/backends/docker/egress/logs.py; edits are lost.",
            "[global]",
            f'logfile="{os.path.join(folder, "ulogd.log")}"',
            "loglevel=5",
            *(f'plugin="{ULOGD_PLUGINS}/ulogd_{name}.so"' for name in plugins),
            "stack=log1:NFLOG,base1:BASE,ifi1:IFINDEX,ip2str1:IP2STR,json1:JSON",
            "[log1]",
            f"group={NFLOG_GROUP}",
            "[json1]",
            "sync=1",
            f'file="{os.path.join(folder, REFUSALS)}"',
            "",
        ]
    )


def ulogd_pid(folder: str) -> int | None:
    try:
        with open(os.path.join(folder, "ulogd.pid")) as handle:
            pid = int(handle.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return pid if b"ulogd" in handle.read() else None
    except (OSError, ValueError):
        return None


def log_reader_running(folder: str) -> bool:
    """Whether ulogd2 runs for this state folder (read-only)."""
    return ulogd_pid(folder) is not None


def ensure_log_reader(folder: str) -> str:
    """ulogd2 running on the table's NFLOG group (started when not). Returns words for status."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if ulogd_pid(folder) is not None:
        return "ulogd2 reads refusals"
    binary = next((p for p in ULOGD_CANDIDATES if os.path.exists(p)), None)
    if binary is None:
        return "refusals are not read back: ulogd2 (Debian package ulogd2, ulogd2-json) is not installed"
    conf = os.path.join(folder, "ulogd.conf")
    with open(conf, "w") as handle:
        handle.write(render_ulogd_config(folder))
    done = subprocess.run(
        [binary, "-d", "-c", conf, "-p", os.path.join(folder, "ulogd.pid")],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if done.returncode != 0:
        return f"refusals are not read back: ulogd2 did not start: {(done.stderr or done.stdout).strip()[-200:]}"
    return "ulogd2 reads refusals"


def read_packets(path: str, offset: int) -> tuple[list[dict[str, Any]], int]:
    """ulogd2's JSON records after `offset` bytes, and the offset after the last whole line
    (a file shorter than `offset` was rotated: read from 0)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return [], 0
    if size < offset:
        offset = 0  # rotated
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n") + 1
    records = []
    for line in data[:end].splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records, offset + end


def rotate(path: str, max_bytes: int) -> bool:
    """`path` copied to `path.1` and truncated when it is larger than `max_bytes` (see the
    module docstring); whether it was."""
    try:
        if os.path.getsize(path) <= max_bytes:
            return False
        shutil.copyfile(path, path + ".1")
        with open(path, "r+b") as handle:
            handle.truncate(0)
    except OSError:
        return False
    return True

"""Inbound traffic through the console's proxy vs straight to the sandbox.

One embedded console (Daphne on SQLite, as `make start` runs it) with a space whose inbound is
on and outbound off; its session's sandbox runs `python3 -m http.server` over a file of
`--mb` MiB. Measured on 127.0.0.1 and the sandbox's own bridge address only:

- `small_p50_ms`/`small_p95_ms` (through the proxy) and `direct_small_p50_ms`: a GET of a
  tiny file, a new connection each time;
- `download_mib_s` through the proxy, `direct_download_mib_s`, and their ratio;
- `upload_mib_s`: a POST of the same size through the proxy to an echo server in the sandbox.

Usage: python bench/inbound.py [--mb 64] [--small 200]. The last line is JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.console_process import Console, docker_api, remove_docker_leftovers  # noqa: E402
from tests.support.inbound_world import _SEED, ECHO_SERVER  # noqa: E402
from tests.support.tuning import tuning_env  # noqa: E402


def _get(host: str, port: int, path: str, headers: dict[str, str]) -> int:
    connection = http.client.HTTPConnection(host, port, timeout=120)
    try:
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        total = 0
        while chunk := answer.read(1 << 20):
            total += len(chunk)
        assert answer.status == 200, answer.status
        return total
    finally:
        connection.close()


def _post(host: str, port: int, path: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    connection = http.client.HTTPConnection(host, port, timeout=120)
    try:
        connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        data = answer.read()
        assert answer.status == 200, (answer.status, data[:200])
        return dict(json.loads(data))
    finally:
        connection.close()


def _timed(function: Any, *args: Any) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--small", type=int, default=200)
    options = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-inbound-"))
    console = Console(
        workdir=workdir / "console",
        installation_id=f"bench-inbound-{uuid.uuid4().hex[:8]}",
        database_url=f"sqlite:///{workdir / 'console' / 'console.sqlite3'}",
        extra_env=tuning_env({"inbound.max_request_bytes": (options.mb + 1) << 20, "logs.level": "WARNING"}),
    )
    spaces: dict[str, dict[str, str]] = {}
    try:
        console.workdir.mkdir(parents=True, exist_ok=True)
        console.manage("migrate", "--noinput")
        seed = _SEED.format(user="bench", password="bench-password", image="sandbox-console/base:latest")  # noqa: S106
        out = console.manage("shell", "-c", seed)
        spaces = json.loads(out.split("SEED ", 1)[1].splitlines()[0])
        console.space_id, console.token = spaces["a"]["space_id"], spaces["a"]["token"]
        console.start_web()
        api = console.api()
        sandbox_id = api.resolve("bench").body["sandbox_id"]
        api.call("PUT", "bench", "files/content?path=echo.py", raw=ECHO_SERVER.encode())
        setup = (
            f"cd /workspace && head -c {options.mb << 20} /dev/urandom > big.bin && echo hi > small.txt"
            " && (setsid nohup python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 </dev/null &)"
            " && (setsid nohup python3 echo.py >/dev/null 2>&1 </dev/null &) && sleep 1"
        )
        assert api.shell("bench", setup).body["exit_code"] == 0
        inbound = api.call("GET", "bench", "inbound?port=8000").body
        token = {"X-Traffic-Token": inbound["traffic_token"]}
        prefix = f"/inbound/{sandbox_id}/8000/"
        web = console.web_ports["web"]
        networks = docker_api().inspect_container(sandbox_id)["NetworkSettings"]["Networks"]
        address = next(iter(networks.values()))["IPAddress"]

        _get("127.0.0.1", web, prefix + "small.txt", token)  # warm: the lookups and the pool
        small = [_timed(_get, "127.0.0.1", web, prefix + "small.txt", token) for _ in range(options.small)]
        direct_small = [_timed(_get, address, 8000, "/small.txt", {}) for _ in range(options.small)]
        size = options.mb << 20
        download = min(_timed(_get, "127.0.0.1", web, prefix + "big.bin", token) for _ in range(3))
        direct = min(_timed(_get, address, 8000, "/big.bin", {}) for _ in range(3))
        body = b"u" * size
        upload_prefix = f"/inbound/{sandbox_id}/9000/"
        upload = min(_timed(_post, "127.0.0.1", web, upload_prefix + "up", token, body) for _ in range(3))
        result = {
            "small_p50_ms": round(statistics.median(small) * 1000, 2),
            "small_p95_ms": round(sorted(small)[int(len(small) * 0.95) - 1] * 1000, 2),
            "direct_small_p50_ms": round(statistics.median(direct_small) * 1000, 2),
            "download_mib_s": round(options.mb / download, 1),
            "direct_download_mib_s": round(options.mb / direct, 1),
            "download_ratio": round(direct / download, 3),
            "upload_mib_s": round(options.mb / upload, 1),
            "mib": options.mb,
        }
        print(json.dumps(result))
    finally:
        console.stop_all()
        remove_docker_leftovers(console.installation_id)
        engine = docker_api()
        for space in spaces.values():
            for network in engine.networks(filters={"label": f"console.network.space={space['space_id']}"}):
                with contextlib.suppress(Exception):
                    engine.remove_network(network["Id"])


if __name__ == "__main__":
    main()

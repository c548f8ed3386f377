"""HTTP throughput through the HTTP-rule path (squid, transparent) versus direct, in one run.

One Docker sandbox on a space network with HTTP rules downloads the same body from the same
server (in a network namespace of this script's own, documentation addresses: nothing leaves
the machine) on port 80, which the redirect table sends through squid, and on port 8080, which
goes straight through the forward path. Both are one request on one new connection, timed
inside the sandbox the same way. Rounds alternate the two; the ratio is the median proxied
throughput over the median direct one (goal >= 0.8); `ratio_min`/`ratio_max` are the spread of
the per-round ratios. `small_bodies_ratio` is the same for 40 bodies of 256 kB on one
keep-alive connection (package-index-like traffic); `rule_change_p50_ms`/`max_ms`: from a rule
change (squid -k reconfigure) until a program polling inside the running sandbox every 20 ms
gets the new answer.

Every proxied download must appear in squid's access log, or its round is discarded and run
again (`rounds_discarded`): on a shared host another console or test run can replace the
host's one redirect table, and a port-80 download that went direct would inflate the ratio.
`squid_cpu_ms_per_mb` is squid's own CPU time per MB it carried (from /proc/PID/schedstat;
independent of the machine's load, unlike the ratio) and `squid_wait_ms_per_mb` the time it
was runnable but waiting for a CPU.

Usage: python bench/egress_http.py [SIZE_MB] [ROUNDS]   (root; Docker engine, squid-openssl,
dnsmasq). The last line is JSON: {"http_throughput_ratio": ..., ...}. bench/egress.py calls
`measure_http_throughput_ratio()`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netpolicy import parse_l7_rule
from sandboxes.backends.base import META_SPACE, BackendConfig, ExecRequest, NetworkSpec, SandboxSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.egress.proxy import PROXY_HTTP_PORT, PROXY_TLS_PORT
from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
from tests.support.egress_lab import LocalResolver, TargetNamespace, input_exception

# Inside the sandbox: GET /bytes/N over one connection, timed; prints MB/s.
DOWNLOAD = r"""
import http.client, sys, time
address, port, size, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
conn = http.client.HTTPConnection(address, port, timeout=60)
started = time.perf_counter()
for _ in range(count):  # one keep-alive connection
    conn.request("GET", f"/bytes/{size}", headers={"Host": "bench.test"})
    answer = conn.getresponse()
    got = 0
    while True:
        chunk = answer.read(1 << 20)
        if not chunk:
            break
        got += len(chunk)
    assert answer.status == 200 and got == size, (answer.status, got)
took = time.perf_counter() - started
print(size * count / took / 1e6)
"""

# Inside the sandbox: poll GET /bytes/1 every 20 ms until its status is the wanted one; print
# the wall-clock time it flipped (the host and the container share the kernel's clock).
WATCH = r"""
import http.client, sys, time
address, wanted = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 30
while time.time() < deadline:
    try:
        conn = http.client.HTTPConnection(address, 80, timeout=2)
        conn.request("GET", "/bytes/1", headers={"Host": "bench.test"})
        status = conn.getresponse().status
        conn.close()
    except OSError:
        status = 0
    if status == wanted:
        print(time.time())
        break
    time.sleep(0.02)
"""

last_detail: dict[str, object] = {}


def _squid_schedstat(state: str) -> dict[int, tuple[int, int]]:
    """{pid: (ns on a CPU, ns runnable but waiting)} of squid's master and kids now."""
    try:
        master = int((Path(state) / "squid.pid").read_text().strip())
    except (OSError, ValueError):
        return {}
    pids = {master}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == master:
                pids.add(int(entry))
    found = {}
    for pid in pids:
        try:
            run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        found[pid] = (int(run), int(wait))
    return found


def _squid_spent(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> tuple[float, float]:
    """(on-CPU s, waiting s) between two snapshots, over the processes in both."""
    run = sum(after[pid][0] - before[pid][0] for pid in before.keys() & after.keys())
    wait = sum(after[pid][1] - before[pid][1] for pid in before.keys() & after.keys())
    return run / 1e9, wait / 1e9


def _rule_change_ms(backend: DockerBackend, sandbox_id: str, address: str, changes: int = 6) -> list[float]:
    """Time from the policy change call until the running sandbox sees the new answer."""
    import threading

    allow = (parse_l7_rule({"domain": "bench.test", "methods": ("GET",), "path_prefix": "/bytes/", "action": "allow"}),)
    deny = (parse_l7_rule({"domain": "bench.test", "methods": ("GET",), "path_prefix": "/bytes/", "action": "deny"}),)
    took: list[float] = []
    for index in range(changes):
        rules, wanted = (deny, 403) if index % 2 == 0 else (allow, 200)
        answer: dict[str, bytes] = {}

        def watch(wanted: int = wanted, answer: dict[str, bytes] = answer) -> None:
            result = backend.exec(
                sandbox_id, ExecRequest(argv=("python3", "-c", WATCH, address, str(wanted)), timeout_s=60)
            )
            answer["out"] = result.stdout

        watcher = threading.Thread(target=watch)
        watcher.start()
        time.sleep(1.0)  # the watcher is polling the old answer by now
        started = time.time()
        backend.outbound.update_http_rules(
            sandbox_id, NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, l7_rules=rules)
        )
        watcher.join(timeout=60)
        flipped = float(answer.get("out", b"0").decode().strip() or 0)
        if not flipped:
            raise RuntimeError("the rule change never reached the sandbox")
        took.append((flipped - started) * 1000)
    return took


def _served(access_log: Path) -> int:
    """squid's access-log lines for /bytes/ downloads so far."""
    try:
        return sum(1 for line in access_log.read_text().splitlines() if "/bytes/" in line)
    except OSError:
        return 0


def measure_http_throughput_ratio(size_mb: int = 64, rounds: int = 5) -> float:
    """Median MB/s through squid over median MB/s direct (same sandbox, server, run)."""
    target = TargetNamespace(["bench.test"]).start()
    resolver = LocalResolver({"bench.test": target.address}).start()
    state = tempfile.mkdtemp(prefix="egress-bench-")
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    backend = DockerBackend(
        BackendConfig(
            kind="docker",
            options={"network": f"sandbox-console-{run_id}", "proxy_state_dir": state, "proxy_dns": resolver.address},
        )
    )
    sandbox_id = ""
    try:
        with input_exception([PROXY_HTTP_PORT, PROXY_TLS_PORT]):
            rules = (
                parse_l7_rule(
                    {"domain": "bench.test", "methods": ("GET",), "path_prefix": "/bytes/", "action": "allow"}
                ),
            )
            info = backend.create(
                SandboxSpec(
                    template_id=DEFAULT_BASE_IMAGE,
                    network=NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, l7_rules=rules),
                    metadata={"bench-run": run_id, META_SPACE: run_id},
                )
            )
            sandbox_id = info.sandbox_id
            size = size_mb * 1_000_000

            def download(port: int, size: int = size, count: int = 1) -> float:
                argv = ("python3", "-c", DOWNLOAD, target.address, str(port), str(size), str(count))
                result = backend.exec(sandbox_id, ExecRequest(argv=argv, timeout_s=120))
                if result.exit_code != 0:
                    raise RuntimeError(f"download on port {port} failed: {result.stderr.decode()[-500:]}")
                return float(result.stdout.decode().strip())

            access_log = Path(backend.outbound.proxy.access_log)

            def through_squid(bodies: int, before: int) -> bool:
                """squid logged `bodies` more /bytes/ lines than `before` (it writes a moment
                after the answer)."""
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    if _served(access_log) >= before + bodies:
                        return True
                    time.sleep(0.1)
                return False

            download(80), download(8080)  # warm up both paths
            proxied: list[float] = []
            direct: list[float] = []
            small_proxied: list[float] = []
            small_direct: list[float] = []
            squid_cpu = squid_wait = squid_mb = 0.0
            discarded = 0
            while len(proxied) < rounds:
                seen = _served(access_log)
                cpu_before = _squid_schedstat(state)
                round_proxied = download(80)
                cpu_after = _squid_schedstat(state)
                round_direct = download(8080)
                round_small_proxied = download(80, 256_000, 40)  # 40 bodies of 256 kB, keep-alive
                round_small_direct = download(8080, 256_000, 40)
                if not through_squid(41, seen):
                    discarded += 1
                    if discarded > rounds:
                        raise RuntimeError("the port-80 downloads did not go through squid")
                    continue
                spent, waited = _squid_spent(cpu_before, cpu_after)
                squid_cpu, squid_wait, squid_mb = squid_cpu + spent, squid_wait + waited, squid_mb + size / 1e6
                proxied.append(round_proxied)
                direct.append(round_direct)
                small_proxied.append(round_small_proxied)
                small_direct.append(round_small_direct)
            changes = _rule_change_ms(backend, sandbox_id, target.address)
    finally:
        if sandbox_id:
            backend.delete(sandbox_id)
        proxy = backend.outbound.proxy
        for policy in proxy.policies():
            proxy.remove_space(policy.name)
        proxy.stop()
        backend.close()
        resolver.stop()
        target.stop()
        shutil.rmtree(state, ignore_errors=True)
    ratio = statistics.median(proxied) / statistics.median(direct)
    pairs = [p / d for p, d in zip(proxied, direct, strict=True)]
    last_detail.clear()
    last_detail.update(
        {
            "ratio_min": round(min(pairs), 3),
            "ratio_max": round(max(pairs), 3),
            "proxied_mb_s": round(statistics.median(proxied), 1),
            "proxied_mb_s_range": [round(min(proxied), 1), round(max(proxied), 1)],
            "direct_mb_s": round(statistics.median(direct), 1),
            "direct_mb_s_range": [round(min(direct), 1), round(max(direct), 1)],
            "squid_cpu_ms_per_mb": round(squid_cpu * 1000 / squid_mb, 2) if squid_mb else None,
            "squid_wait_ms_per_mb": round(squid_wait * 1000 / squid_mb, 2) if squid_mb else None,
            "rounds_discarded": discarded,
            "rule_change_p50_ms": round(statistics.median(changes)),
            "rule_change_max_ms": round(max(changes)),
            "small_bodies_ratio": round(statistics.median(small_proxied) / statistics.median(small_direct), 3),
            "size_mb": size_mb,
            "rounds": rounds,
        }
    )
    return ratio


def main(argv: list[str]) -> int:
    size_mb = int(argv[1]) if len(argv) > 1 else 64
    rounds = int(argv[2]) if len(argv) > 2 else 5
    ratio = measure_http_throughput_ratio(size_mb, rounds)
    print(f"through squid {last_detail['proxied_mb_s']} MB/s, direct {last_detail['direct_mb_s']} MB/s")
    print(json.dumps({"http_throughput_ratio": round(ratio, 3), **last_detail}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

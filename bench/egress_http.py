"""HTTP throughput through the HTTP-rule path (squid, transparent) versus direct, in one run.

One Docker sandbox on a space network with HTTP rules downloads the same body from the same
server (in a network namespace of this script's own, documentation addresses: nothing leaves
the machine) on port 80, which the redirect table sends through squid, and on port 8080, which
goes straight through the forward path. Rounds alternate the two; the ratio is the median
proxied throughput over the median direct one (goal >= 0.8). `small_bodies_ratio` is the same
for 40 bodies of 256 kB on one keep-alive connection (package-index-like traffic);
`rule_change_p50_ms`/`max_ms`: from a rule change (squid -k reconfigure) until a program
polling inside the running sandbox every 20 ms gets the new answer.

Usage: python bench/egress_http.py [SIZE_MB] [ROUNDS]   (root; Docker engine, squid-openssl,
dnsmasq). The last line is JSON: {"http_throughput_ratio": ..., ...}. bench/egress.py calls
`measure_http_throughput_ratio()`.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandboxes.backends.base import META_SPACE, BackendConfig, ExecRequest, L7Rule, NetworkSpec, SandboxSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
from sandboxes.backends.docker.proxy import PROXY_HTTP_PORT, PROXY_TLS_PORT
from tests.sandboxes.egress_lab import LocalResolver, TargetNamespace, input_exception

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


def _rule_change_ms(backend: DockerBackend, sandbox_id: str, address: str, changes: int = 6) -> list[float]:
    """Time from the policy change call until the running sandbox sees the new answer."""
    import threading

    allow = (L7Rule("bench.test", ("GET",), "/bytes/", "allow"),)
    deny = (L7Rule("bench.test", ("GET",), "/bytes/", "deny"),)
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
        backend.update_http_rules(
            sandbox_id, NetworkSpec(allow_internet_access=True, allow_public_traffic=False, l7_rules=rules)
        )
        watcher.join(timeout=60)
        flipped = float(answer.get("out", b"0").decode().strip() or 0)
        if not flipped:
            raise RuntimeError("the rule change never reached the sandbox")
        took.append((flipped - started) * 1000)
    return took


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
            rules = (L7Rule("bench.test", ("GET",), "/bytes/", "allow"),)
            info = backend.create(
                SandboxSpec(
                    template_id=DEFAULT_BASE_IMAGE,
                    network=NetworkSpec(allow_internet_access=True, allow_public_traffic=False, l7_rules=rules),
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

            download(80), download(8080)  # warm up both paths
            proxied: list[float] = []
            direct: list[float] = []
            small_proxied: list[float] = []
            small_direct: list[float] = []
            for _ in range(rounds):
                proxied.append(download(80))
                direct.append(download(8080))
                small_proxied.append(download(80, 256_000, 40))  # 40 bodies of 256 kB, keep-alive
                small_direct.append(download(8080, 256_000, 40))
            # squid writes its access log a moment after the answer: wait for every line.
            served: list[str] = []
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and len(served) < 41 * rounds + 1:
                log = Path(backend.egress_proxy().access_log).read_text()
                served = [line for line in log.splitlines() if "/bytes/" in line]
                time.sleep(0.25)
            if len(served) < 41 * rounds + 1:
                raise RuntimeError("the port-80 downloads did not go through squid")
            changes = _rule_change_ms(backend, sandbox_id, target.address)
    finally:
        if sandbox_id:
            backend.delete(sandbox_id)
        proxy = backend.egress_proxy()
        for policy in proxy.policies():
            proxy.remove_space(policy.name)
        proxy.stop()
        backend.close()
        resolver.stop()
        target.stop()
        shutil.rmtree(state, ignore_errors=True)
    ratio = statistics.median(proxied) / statistics.median(direct)
    last_detail.clear()
    last_detail.update(
        {
            "proxied_mb_s": round(statistics.median(proxied), 1),
            "direct_mb_s": round(statistics.median(direct), 1),
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

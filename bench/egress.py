"""Egress enforcement on the real Docker engine: what an allow list costs a connection, and
how long a policy change takes to reach a running sandbox.

One sandbox (the session user, plain Python sockets) connects to a TCP server this script
runs in a network namespace of its own (TEST-NET-2, 198.51.100.0/24; the host's route to it
is checked to go to the script's veth before anything is sent):

- `connect_overhead_ratio`: median TCP connect time under an allow list (the server's /32
  among 100 other CIDR entries and 20 domain entries) over the median with plain outbound
  (no lists), measured alternately in the same run (goal ≤ 1.2);
- `policy_apply_p50_ms` / `policy_apply_p95_ms`: `egress().update()` on the running sandbox,
  alternating two policies, until it returns (the nftables transaction is in and, when the
  names changed, the resolver restarted); after each the new policy is checked from inside
  the sandbox (goal p95 < 5000);
- `policy_apply_p95_ms_500`: the same with 500 entries in the allow list (480 CIDRs and 20
  domains, one domain changing each time; the most a list may hold);
- `policy_decide_us`: one `netpolicy.decide` call (a name resolved to one address, under
  the 121-entry allow list above, deny entries and a private exception), p50 of many, in
  this process: the meaning explain, approvals and the agreement test consult;
- `http_throughput_ratio`: from `bench/egress_http.py` (`measure_http_throughput_ratio()`,
  its details under `http`: spread, MB/s, squid's CPU time per MB), when that module exists
  (the HTTP-rule path through squid; goal >= 0.8).

Usage: python bench/egress.py [--connects N] [--applies N]. Needs root, `ip`, the Docker
engine with sandbox-console/base:latest. The last line is JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import netpolicy  # noqa: E402
from sandboxes.backends.base import META_SPACE, BackendConfig, ExecRequest, NetworkSpec, SandboxSpec  # noqa: E402
from sandboxes.backends.docker.backend import DockerBackend  # noqa: E402
from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE  # noqa: E402

CLONE_NEWNET = 0x40000000
CONNECTS = r"""
import json, socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(n):
    started = time.perf_counter()
    conn = socket.create_connection((host, port), timeout=5)
    times.append(time.perf_counter() - started)
    conn.close()
times.sort()
print(json.dumps({"median": times[len(times) // 2]}))
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


@contextlib.contextmanager
def target_namespace() -> Iterator[tuple[str, str]]:
    """(namespace name, its address): a /30 of TEST-NET-2 behind a veth pair of our own."""
    tag = secrets.token_hex(4)
    name, host_dev, inner_dev = f"scb-{tag}", f"scbv{tag}h", f"scbv{tag}n"
    ip("netns", "add", name)
    try:
        ip("link", "add", host_dev, "type", "veth", "peer", "name", inner_dev, "netns", name)
        listing = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout
        taken = {a["local"] for link in json.loads(listing) for a in link.get("addr_info", [])}
        free = [t for t in range(200, 252, 4) if not any(f"198.51.100.{t + k}" in taken for k in range(4))]
        if not free:
            raise RuntimeError("no free /30 in 198.51.100.200/27")
        host_v4, inner_v4 = f"198.51.100.{free[0] + 1}", f"198.51.100.{free[0] + 2}"
        ip("addr", "add", f"{host_v4}/30", "dev", host_dev)
        ip("link", "set", host_dev, "up")
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "addr", "add", f"{inner_v4}/30", "dev", inner_dev)
        ip("-n", name, "link", "set", inner_dev, "up")
        ip("-n", name, "route", "add", "default", "via", host_v4)
        route = json.loads(
            subprocess.run(["ip", "-j", "route", "get", inner_v4], capture_output=True, text=True).stdout
        )
        assert route[0]["dev"] == host_dev, f"{inner_v4} is not routed to the benchmark's namespace: {route}"
        yield name, inner_v4
    finally:
        subprocess.run(["ip", "link", "del", host_dev], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def serve_in(namespace: str, address: str) -> int:
    """An accept-and-close TCP server in the namespace (a daemon thread); its port."""
    ready: dict[str, int] = {}
    started = threading.Event()

    def run() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        libc.setns(fd, CLONE_NEWNET)
        os.close(fd)
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((address, 0))
        server.listen(256)
        ready["port"] = server.getsockname()[1]
        started.set()
        while True:
            conn, _ = server.accept()
            conn.close()

    threading.Thread(target=run, daemon=True).start()
    started.wait(10)
    return ready["port"]


def connect_median(backend: DockerBackend, sandbox_id: str, host: str, port: int, count: int) -> float:
    result = backend.exec(
        sandbox_id,
        ExecRequest(argv=("python3", "-c", CONNECTS, host, str(port), str(count)), user="user", timeout_s=300),
    )
    assert result.exit_code == 0, result
    return float(json.loads(result.stdout)["median"])


def reaches(backend: DockerBackend, sandbox_id: str, host: str, port: int) -> bool:
    line = f"import socket; socket.create_connection(({host!r}, {port}), timeout=2).close()"
    return backend.exec(sandbox_id, ExecRequest(argv=("python3", "-c", line), user="user", timeout_s=30)).exit_code == 0


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def decide_p50_us(listed: NetworkSpec, address: str, count: int) -> float:
    """p50 of one `netpolicy.decide` call, in microseconds (batches of 100 timed)."""
    policy = netpolicy.Policy.parse(
        allow_internet_access=True,
        allow_out=[str(e) for e in listed.allow_out],
        deny_out=["bad.bench.test", "198.51.100.128/25"],
        allow_private=["10.9.0.0/16"],
    )
    destination = netpolicy.parse_destination("host7.bench.test:443").resolved(address)
    times = []
    for _ in range(max(1, count // 100)):
        started = time.perf_counter()
        for _ in range(100):
            netpolicy.decide(policy, destination)
        times.append((time.perf_counter() - started) / 100)
    return round(statistics.median(times) * 1e6, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connects", type=int, default=300, help="connects per measurement")
    parser.add_argument("--rounds", type=int, default=9, help="alternating measurements of each policy")
    parser.add_argument("--applies", type=int, default=30, help="policy changes timed")
    parser.add_argument("--decides", type=int, default=20000, help="netpolicy.decide calls timed")
    args = parser.parse_args()
    run_id = uuid.uuid4().hex[:10]
    backend = DockerBackend(BackendConfig(kind="docker", options={"network": f"sandbox-console-bench-{run_id}"}))
    result: dict[str, object] = {}
    with target_namespace() as (namespace, address):
        port = serve_in(namespace, address)
        plain = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False)
        others = tuple(f"203.0.113.{i}/32" for i in range(1, 101))
        names = tuple(f"host{i}.bench.test" for i in range(20))
        listed = NetworkSpec.parse(
            allow_internet_access=True, allow_public_traffic=False, allow_out=(*others, *names, f"{address}/32")
        )
        metadata = {"bench-run": run_id, META_SPACE: f"bench-{run_id}"}
        sandbox = backend.create(SandboxSpec(template_id=DEFAULT_BASE_IMAGE, network=plain, metadata=metadata))
        egress = backend.egress()
        assert egress is not None
        try:
            sid = sandbox.sandbox_id
            connect_median(backend, sid, address, port, 50)  # warm-up
            plain_times, listed_times = [], []
            for _ in range(args.rounds):
                egress.update(sid, plain)
                plain_times.append(connect_median(backend, sid, address, port, args.connects))
                egress.update(sid, listed)
                listed_times.append(connect_median(backend, sid, address, port, args.connects))
            result["connect_plain_median_us"] = round(statistics.median(plain_times) * 1e6, 1)
            result["connect_allow_list_median_us"] = round(statistics.median(listed_times) * 1e6, 1)
            result["connect_overhead_ratio"] = round(
                statistics.median(listed_times) / statistics.median(plain_times), 3
            )

            # Policy changes: the server allowed, then not (a domain entry more or less, so the
            # resolver's names change each time too).
            closed = NetworkSpec.parse(
                allow_internet_access=True, allow_public_traffic=False, allow_out=("198.51.100.0/30", "one.bench.test")
            )
            opened = NetworkSpec.parse(
                allow_internet_access=True, allow_public_traffic=False, allow_out=(f"{address}/32", "two.bench.test")
            )
            applies, wrong = [], 0
            for i in range(args.applies):
                spec, expect = (opened, True) if i % 2 == 0 else (closed, False)
                started = time.perf_counter()
                egress.update(sid, spec)
                applies.append((time.perf_counter() - started) * 1000)
                if reaches(backend, sid, address, port) != expect:
                    wrong += 1
            result["policy_apply_p50_ms"] = round(percentile(applies, 0.5), 1)
            result["policy_apply_p95_ms"] = round(percentile(applies, 0.95), 1)
            result["policy_apply_not_in_effect_after_return"] = wrong

            # The same with 500 list entries (480 CIDRs, 20 domains; one domain changes).
            cidrs = tuple(f"203.0.{i // 256}.{i % 256}/32" for i in range(113 * 256, 113 * 256 + 479))
            big = [
                NetworkSpec.parse(
                    allow_internet_access=True,
                    allow_public_traffic=False,
                    allow_out=(*cidrs, f"{address}/32", *(f"h{i}.big{flip}.bench.test" for i in range(20))),
                )
                for flip in (0, 1)
            ]
            applies_500 = []
            for i in range(args.applies):
                started = time.perf_counter()
                egress.update(sid, big[i % 2])
                applies_500.append((time.perf_counter() - started) * 1000)
            result["policy_apply_p95_ms_500"] = round(percentile(applies_500, 0.95), 1)
        finally:
            backend.delete(sandbox.sandbox_id)
            backend.close()
    http = ROOT / "bench" / "egress_http.py"
    if http.exists():
        module_spec = importlib.util.spec_from_file_location("egress_http", http)
        assert module_spec is not None
        assert module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        result["http_throughput_ratio"] = round(float(module.measure_http_throughput_ratio()), 3)
        result["http"] = dict(module.last_detail)
    result["policy_decide_us"] = decide_p50_us(listed, address, args.decides)
    result["goals"] = {
        "connect_overhead_ratio": "<= 1.2",
        "http_throughput_ratio": ">= 0.8",
        "policy_apply_p95_ms": "< 5000",
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

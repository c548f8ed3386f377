"""Review (revdeny): the deny filler's lookups against an upstream where one denied name never
answers (its authoritative servers black-holed: any tenant can name such a domain in a deny
list). A refresh asks for every space's denied names at once; the names after the slow one's
batch must still be resolved into their sets within the time allowed.

Real dnsmasq processes on loopback only: the filler, and its upstream (a dnsmasq of the test's
own that answers every name but forwards the slow one to a loopback socket that never answers).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from netpolicy import parse_domain
from sandboxes.backends.docker.egress.dns import DenyFiller, fillable, lookup
from tests.support.egress_support import free_port

pytestmark = [
    pytest.mark.skipif(shutil.which("dnsmasq") is None and not Path("/usr/sbin/dnsmasq").exists(), reason="dnsmasq"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the filler runs as root (nftset additions need CAP_NET_ADMIN)"),
]

SLOW = "a-slow.test"  # sorts first, as `fillable` orders the names


@contextmanager
def upstream_with_a_black_hole() -> Iterator[str]:
    """`127.0.0.1#port` of a dnsmasq answering every name at once (NXDOMAIN) but `SLOW`, which
    it forwards to a bound loopback socket that never reads."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as hole:
        hole.bind(("127.0.0.1", 0))
        hole_port = hole.getsockname()[1]
        port = free_port()
        folder = tempfile.mkdtemp(prefix="revdeny-upstream-")
        binary = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
        args = [
            binary,
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            f"--port={port}",
            f"--pid-file={folder}/pid",
            "--user=root",
            "--address=/#/",
            f"--server=/{SLOW}/127.0.0.1#{hole_port}",
        ]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            assert process.poll() is None
            yield f"127.0.0.1#{port}"
        finally:
            process.terminate()
            process.wait(timeout=5)
            shutil.rmtree(folder, ignore_errors=True)


def test_one_black_holed_denied_name_does_not_keep_the_others_out_of_their_sets(tmp_path: Path) -> None:
    others = [f"n{i:03d}.test" for i in range(100)]  # several spaces' deny entries, > one batch
    entries = fillable(parse_domain(n) for n in [SLOW, *others])
    names = [d.name for d in entries]
    filler = DenyFiller(str(tmp_path))
    with upstream_with_a_black_hole() as upstream:
        try:
            port = filler.ensure(upstream, entries)
            assert port is not None
            answered = lookup(port, names)  # as `DockerEgress._fill` asks after a table restore
            missing = sorted(set(others) - answered)
            assert not missing, f"{len(missing)} of {len(others)} names not resolved behind {SLOW}: {missing[:3]}..."
        finally:
            filler.resolver.stop()

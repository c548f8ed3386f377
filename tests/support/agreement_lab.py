"""Places on this machine for the agreement test's real connections: a target namespace
(tests/sandboxes/egress_lab.TargetNamespace: HTTP on 80 and 8080, TLS on 443, documentation
addresses, routes checked) with five IPv4 and two IPv6 addresses, and a probe run inside a
sandbox that tries each destination once and says whether anything answered.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from sandboxes.backends.base import ExecRequest
from tests.support.egress_lab import TargetNamespace, _sh


class Targets(TargetNamespace):
    """$A1..$A5 (IPv4) and $B1, $B2 (IPv6) of one namespace, every one serving, on a /29 no
    interface of this host holds an address in (another run's namespace may hold one)."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(names)
        taken = {
            str(address["local"])
            for link in json.loads(_sh("ip", "-j", "addr").stdout)
            for address in link.get("addr_info", [])
            if address.get("family") == "inet"
        }
        free = [b for b in range(8, 248, 8) if not any(f"203.0.113.{b + k}" in taken for k in range(8))]
        if not free:
            raise AssertionError("no free /29 in 203.0.113.0/24")
        base = random.choice(free)
        self.host_address, self.address, self.other_address = (f"203.0.113.{base + k}" for k in (1, 2, 3))

    def start(self) -> Targets:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        super().start()
        base = int(self.address.rsplit(".", 1)[1]) - 2
        prefix = self.address.rsplit(".", 1)[0]
        self.extra = [f"{prefix}.{base + n}" for n in (4, 5, 6)]
        inside = ("ip", "netns", "exec", self.netns)
        for address in self.extra:
            _sh(*inside, "ip", "addr", "add", f"{address}/{self.prefixlen}", "dev", self.ns_if)
        self.address6_b = self.address6.rsplit("::", 1)[0] + "::3"
        _sh(*inside, "ip", "addr", "add", f"{self.address6_b}/64", "dev", self.ns_if, "nodad")
        for address in (*self.extra, self.address6_b):
            route = json.loads(_sh("ip", "-j", "route", "get", address).stdout)
            if route[0].get("dev") != self.host_if:
                raise AssertionError(f"the route to {address} leaves by {route[0].get('dev')}, not {self.host_if}")

    def places(self) -> dict[str, str]:
        addresses = [self.address, self.other_address, *self.extra]
        return {
            **{f"$A{n}": a for n, a in enumerate(addresses, start=1)},
            "$B1": self.address6,
            "$B2": self.address6_b,
        }


# argv[1]: [[label, host, port, tls, method, path], ...]; argv[2]: seconds per attempt.
# Prints {label: "reached" | "no such name" | "refused" | "timeout" | "error N"}; anything
# answered (an HTTP status line, a banner) is "reached". Plain sockets, no proxy variables.
PROBE = r"""
import json, socket, ssl, sys, threading
out = {}
wait = float(sys.argv[2])
def attempt(label, host, port, tls, method, path):
    try:
        with socket.create_connection((host, port), timeout=wait) as conn:
            conn.settimeout(wait)
            if tls:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                conn = context.wrap_socket(conn, server_hostname=host.rstrip("."))
            request = "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (method, path, host.rstrip("."))
            try:
                conn.sendall(request.encode())
            except OSError:
                pass
            data = conn.recv(64)
            if data.startswith(b"HTTP/1.1 403") or data.startswith(b"HTTP/1.1 409"):
                out[label] = "refused by the proxy"
            else:
                out[label] = "reached" if data else "closed"
    except ConnectionRefusedError:
        out[label] = "refused"
    except socket.timeout:
        out[label] = "timeout"
    except socket.gaierror:
        out[label] = "no such name"
    except ssl.SSLError as exc:
        out[label] = "tls refused %s" % exc.reason
    except OSError as exc:
        out[label] = "error %s" % exc.errno
threads = [threading.Thread(target=attempt, args=tuple(t)) for t in json.loads(sys.argv[1])]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(out))
"""


def probe(backend: object, sandbox_id: str, attempts: Sequence[tuple[str, str, int, bool, str, str]]) -> dict[str, str]:
    """Each attempt from inside the sandbox as the session user, all at once."""
    argv = ("python3", "-c", PROBE, json.dumps(list(attempts)), "3")
    result = backend.exec(sandbox_id, ExecRequest(argv=argv, user="user", timeout_s=60))  # type: ignore[attr-defined]
    assert result.exit_code == 0, result
    answers: dict[str, str] = json.loads(result.stdout)
    return answers

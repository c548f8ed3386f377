"""An interpreter of the access rules of a squid configuration: whether an intercepted HTTP
request, or an intercepted TLS connection (its fake CONNECT, then `ssl_bump` by SNI), gets
through.

ACL types modelled: `src`, `dst` (addresses and CIDRs), `dstdomain`, `dstdom_regex` and
`ssl::server_name_regex` (POSIX extended regexes, `-i` without case), `ssl::server_name`,
`method`, `urlpath_regex`, `at_step`, `annotate_transaction` (always matches) and the builtin
`all`. `http_access` and `ssl_bump` lines are tried in order, every ACL of a line must match
(`!` negates), the first matching line decides; no line matching: the opposite of the last
line's action for `http_access` (squid's rule), and `splice`... never assumed for `ssl_bump`
(an unmatched TLS connection is reported as refused). Regexes are translated to Python's
(the renderer escapes with backslashes only, which both read alike). Unknown ACL types raise
`Unmodelled`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from urllib.parse import unquote

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Unmodelled(ValueError):
    """A configuration line this interpreter does not know."""


@dataclass(frozen=True)
class Request:
    source: IPAddress
    destination: IPAddress
    host: str  # the Host header (HTTP) or the SNI (TLS)
    method: str = "GET"
    path: str = "/"
    tls: bool = False


@dataclass(frozen=True)
class Outcome:
    allowed: bool
    line: str  # the deciding line
    note: str = ""  # the refusal's words (annotate_transaction), when the line carries them


@dataclass
class Config:
    acls: dict[str, list[tuple[str, list[str], bool]]] = field(default_factory=dict)  # name -> (type, values, -i)
    http_access: list[tuple[str, list[str], str]] = field(default_factory=list)  # (action, acls, line)
    ssl_bump: list[tuple[str, list[str], str]] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Config:
        config = cls()
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            words = line.split()
            if words[0] == "acl":
                name, kind, values = words[1], words[2], words[3:]
                insensitive = bool(values) and values[0] == "-i"
                config.acls.setdefault(name, []).append((kind, values[1:] if insensitive else values, insensitive))
            elif words[0] == "http_access":
                config.http_access.append((words[1], words[2:], line))
            elif words[0] == "ssl_bump":
                config.ssl_bump.append((words[1], words[2:], line))
        return config

    def judge(self, request: Request) -> Outcome:
        if not request.tls:
            return self._access(request, step="")
        connect = Request(request.source, request.destination, str(request.destination), "CONNECT", "", tls=True)
        first = self._access(connect, step="SslBump1")
        if not first.allowed:
            return first
        for action, names, line in self.ssl_bump:
            if self._all(names, request, step="SslBump2"):
                if action in ("peek", "stare"):
                    continue  # a step-1 action; at step 2 the next line decides
                return Outcome(action == "splice", line, self._note(names))
        return Outcome(False, "no ssl_bump line matches")

    def _access(self, request: Request, step: str) -> Outcome:
        for action, names, line in self.http_access:
            if self._all(names, request, step):
                return Outcome(action == "allow", line, self._note(names))
        last = self.http_access[-1][0] if self.http_access else "deny"
        return Outcome(last != "allow", "no http_access line matches")

    def _note(self, names: list[str]) -> str:
        for name in names:
            for kind, values, _ in self.acls.get(name.lstrip("!"), []):
                if kind == "annotate_transaction" and values:
                    return unquote(values[0].partition("=")[2])
        return ""

    def _all(self, names: list[str], request: Request, step: str) -> bool:
        for name in names:
            negated = name.startswith("!")
            if self._acl(name.lstrip("!"), request, step) == negated:
                return False
        return True

    def _acl(self, name: str, request: Request, step: str) -> bool:
        if name == "all":
            return True
        if name not in self.acls:
            raise Unmodelled(f"acl {name} is not defined")
        return any(self._one(kind, values, insensitive, request, step) for kind, values, insensitive in self.acls[name])

    def _one(self, kind: str, values: list[str], insensitive: bool, request: Request, step: str) -> bool:
        flags = re.IGNORECASE if insensitive else 0
        if kind in ("src", "dst"):
            address = request.source if kind == "src" else request.destination
            for value in values:
                network = ipaddress.ip_network(value, strict=False)
                if network.version == address.version and address in network:
                    return True
            return False
        if kind == "dstdomain":
            host = request.host.lower().rstrip(".")
            return any(
                host == v.lstrip(".").lower() or (v.startswith(".") and host.endswith(v.lower())) for v in values
            )
        if kind == "dstdom_regex":
            if request.tls and request.method == "CONNECT":
                return False  # the fake CONNECT names an address, not a host
            return any(re.search(v, request.host.rstrip("."), flags) for v in values)
        if kind == "ssl::server_name_regex":
            return step == "SslBump2" and any(re.search(v, request.host.rstrip("."), flags) for v in values)
        if kind == "ssl::server_name":
            host = request.host.lower().rstrip(".")
            return step == "SslBump2" and any(
                host == v.lstrip(".").lower() or (v.startswith(".") and host.endswith(v.lower())) for v in values
            )
        if kind == "method":
            return request.method.upper() in (v.upper() for v in values)
        if kind == "urlpath_regex":
            return not request.tls and any(re.search(v, request.path, flags) for v in values)
        if kind == "at_step":
            return step in values
        if kind == "annotate_transaction":
            return True
        raise Unmodelled(f"acl type {kind}")

"""The guarded transport: every call to a tenant-controlled URL goes through here.

A URL is checked when a config is saved (`check_endpoint`) and again when it is dialled
(`GuardedTransport` for httpx, `GuardedHTTPAdapter` for requests), on the addresses the
name resolves to at that moment, and the connection is pinned to the checked address, so a
name that re-resolves between save and dial (DNS rebinding) is caught. Link-local, cloud
metadata, multicast and unspecified addresses are always refused; loopback, private
ranges, 100.64.0.0/10 and the other special-purpose (reserved, benchmarking,
documentation) ranges only when the config opts in. An IPv6 address that embeds an IPv4
address (mapped, compatible, NAT64, 6to4, Teredo) is judged by the address it embeds.
Host names are checked for shape before any lookup, so a malformed one is an `invalid`
error, never a codec exception.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import requests
import requests.adapters

from netpolicy import ADDRESS_CLASSES, Treatment
from netpolicy.addresses import NAT64_LOCAL, embedded_ipv4

from .base import ErrorKind, RemoteError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# The address classes are netpolicy's (one table for the sandboxes' policy and this guard),
# read with their endpoint treatment: NEVER refused, OPENABLE only with the opt-in.
ALWAYS_REFUSED: list[tuple[Network, str]] = [
    (c.network, c.reason) for c in ADDRESS_CLASSES if c.endpoint == Treatment.NEVER
]
PRIVATE_OPT_IN: list[tuple[Network, str]] = [
    (c.network, c.reason) for c in ADDRESS_CLASSES if c.endpoint == Treatment.OPENABLE
]
_NAT64_LOCAL = NAT64_LOCAL


_OPT_IN_HINT = "allow private endpoints on this config to use it"


def _listed_problem(ip: IPAddress, *, allow_private: bool) -> tuple[str, bool] | None:
    """(why `ip` is refused, whether the opt-in could allow it), or None when it is allowed."""
    for network, reason in ALWAYS_REFUSED:
        if ip.version == network.version and ip in network:
            return f"{ip} is {reason}, which is never allowed", False
    if allow_private:
        return None
    for network, reason in PRIVATE_OPT_IN:
        if ip.version == network.version and ip in network:
            return f"{ip} is {reason}", True
    if not ip.is_global:
        # Anything else the IANA special-purpose registries list as not globally reachable.
        return f"{ip} is not a public address", True
    return None


def address_problem(address: str, *, allow_private: bool) -> str | None:
    """Why `address` may not be dialled, or None when it may.

    An IPv6 address that embeds IPv4 addresses is judged by each of them: the most
    restrictive answer wins.
    """
    ip: IPAddress = ipaddress.ip_address(address.split("%")[0])
    embedded = embedded_ipv4(ip)
    problems = []
    for inner in embedded:
        if found := _listed_problem(inner, allow_private=allow_private):
            problems.append((f"{ip}, whose embedded IPv4 address {found[0]}", found[1]))
    if (not embedded or ip in _NAT64_LOCAL) and (found := _listed_problem(ip, allow_private=allow_private)):
        problems.append(found)
    if not problems:
        return None
    reason, opt_in = min(problems, key=lambda problem: problem[1])  # a never-allowed one first
    return f"{reason}; {_OPT_IN_HINT}" if opt_in else reason


Resolver = Callable[[str, int], list[str]]

_LABEL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def host_problem(host: str) -> str | None:
    """Why `host` (a name or an IP literal, no brackets) is not a host name, or None."""
    try:
        ipaddress.ip_address(host.split("%")[0])
        return None
    except ValueError:
        pass
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return "not a valid host name (empty or over-long label, or a character names cannot hold)"
    labels = ascii_host.removesuffix(".").split(".")
    if len(ascii_host) > 253 or not all(_LABEL.match(label) for label in labels):
        return "not a valid host name (labels are 1-63 letters, digits or '-', 253 characters at most)"
    return None


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise RemoteError(ErrorKind.UNAVAILABLE, f"cannot resolve {host!r}: {exc.strerror}") from None
    except UnicodeError:
        raise RemoteError(ErrorKind.INVALID, f"{host!r} is not a valid host name") from None
    return sorted({str(info[4][0]) for info in infos})


DEFAULT_PORTS = {"https": 443, "http": 80, "tcp": 2375, "ssh": 22}


def shown_url(url: str) -> str:
    """`url` for messages: anything that may be userinfo (a password) is replaced by ***.
    Errors end up in form errors, health details, job logs and audit rows."""
    start, at = url.find("://"), url.rfind("@")
    return f"{url[: start + 3]}***{url[at:]}" if 0 <= start < at else url


def split_endpoint(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s), tcp or ssh endpoint URL, or RemoteError(invalid)."""
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError:
        raise RemoteError(ErrorKind.INVALID, f"{shown_url(url)!r}: not a URL") from None
    if parts.scheme not in DEFAULT_PORTS:
        raise RemoteError(ErrorKind.INVALID, f"{shown_url(url)!r}: the scheme must be https, http, tcp or ssh")
    if not hostname:
        raise RemoteError(ErrorKind.INVALID, f"{shown_url(url)!r}: no host name")
    if parts.password or (parts.username and parts.scheme != "ssh"):
        # ssh://user@host names the login; any other credential does not belong in a URL.
        raise RemoteError(ErrorKind.INVALID, f"{shown_url(url)!r}: credentials do not belong in the URL")
    if problem := host_problem(hostname):
        raise RemoteError(ErrorKind.INVALID, f"{hostname!r} is {problem}")
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError:
        raise RemoteError(ErrorKind.INVALID, f"{shown_url(url)!r}: invalid port") from None
    return parts.scheme, hostname, port


def check_endpoint(url: str, *, allow_private: bool, resolver: Resolver = system_resolver) -> list[str]:
    """Addresses `url` resolves to now, all allowed; RemoteError(invalid/forbidden) if not."""
    _, host, port = split_endpoint(url)
    addresses = resolver(host, port)
    if not addresses:
        raise RemoteError(ErrorKind.UNAVAILABLE, f"{host!r} resolves to no address")
    for address in addresses:
        problem = address_problem(address, allow_private=allow_private)
        if problem:
            raise RemoteError(ErrorKind.FORBIDDEN, f"{host} resolves to {problem}")
    return addresses


class GuardedTransport(httpx.HTTPTransport):
    """An httpx transport that re-checks and pins the resolved address on every request."""

    def __init__(self, *, allow_private: bool, resolver: Resolver = system_resolver, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.allow_private = allow_private
        self.resolver = resolver

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        port = request.url.port or (443 if request.url.scheme == "https" else 80)
        addresses = check_endpoint(str(request.url), allow_private=self.allow_private, resolver=self.resolver)
        pinned = addresses[0]
        if pinned != host:
            # Connect to the address we checked; keep the name for Host and TLS (SNI + cert).
            request.extensions = {**request.extensions, "sni_hostname": host}
            if "host" not in request.headers:
                request.headers["Host"] = host if request.url.port is None else f"{host}:{port}"
            request.url = request.url.copy_with(host=pinned)
        return super().handle_request(request)


class GuardedHTTPAdapter(requests.adapters.HTTPAdapter):
    """The requests twin of GuardedTransport, for clients built on requests (docker-py's
    `tcp://` engines): every request re-resolves, checks and pins the address it connects to.
    """

    def __init__(self, *, allow_private: bool, resolver: Resolver = system_resolver, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.allow_private = allow_private
        self.resolver = resolver

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        url = request.url or ""
        parts = urlsplit(url)
        host = parts.hostname or ""
        addresses = check_endpoint(url, allow_private=self.allow_private, resolver=self.resolver)
        pinned = addresses[0]
        if pinned != host:
            # Connect to the address we checked; keep the name for Host and TLS (SNI + cert).
            netloc = f"[{pinned}]" if ":" in pinned else pinned
            if parts.port is not None:
                netloc += f":{parts.port}"
            request.headers.setdefault("Host", host if parts.port is None else f"{host}:{parts.port}")
            request.url = urlunsplit(parts._replace(netloc=netloc))
            request.guard_hostname = host  # type: ignore[attr-defined]
        return super().send(request, *args, **kwargs)

    def build_connection_pool_key_attributes(
        self, request: requests.PreparedRequest, verify: Any, cert: Any = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(request, verify, cert)
        name = getattr(request, "guard_hostname", None)
        if name and host_params.get("scheme") == "https":
            pool_kwargs = {**pool_kwargs, "server_hostname": name, "assert_hostname": name}
        return host_params, pool_kwargs

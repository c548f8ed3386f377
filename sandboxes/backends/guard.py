"""The guarded transport: every call to a tenant-controlled URL goes through here.

A URL is checked when a config is saved (`check_endpoint`) and again when it is dialled
(`GuardedTransport`), on the addresses the name resolves to at that moment, and the
connection is pinned to the checked address, so a name that re-resolves between save and
dial (DNS rebinding) is caught. Link-local, cloud metadata, multicast and unspecified
addresses are always refused; loopback, private ranges and 100.64.0.0/10 only when the
config opts in.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx

from .base import ErrorKind, RemoteError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

ALWAYS_REFUSED = [
    (ipaddress.ip_network("169.254.0.0/16"), "link-local (cloud metadata lives here)"),
    (ipaddress.ip_network("fe80::/10"), "link-local"),
    (ipaddress.ip_network("100.100.100.200/32"), "a cloud metadata address"),
    (ipaddress.ip_network("168.63.129.16/32"), "a cloud metadata address"),
    (ipaddress.ip_network("fd00:ec2::254/128"), "a cloud metadata address"),
    (ipaddress.ip_network("224.0.0.0/4"), "multicast"),
    (ipaddress.ip_network("ff00::/8"), "multicast"),
    (ipaddress.ip_network("0.0.0.0/8"), "unspecified"),
    (ipaddress.ip_network("::/128"), "unspecified"),
    (ipaddress.ip_network("255.255.255.255/32"), "broadcast"),
]
PRIVATE_OPT_IN = [
    (ipaddress.ip_network("127.0.0.0/8"), "loopback"),
    (ipaddress.ip_network("::1/128"), "loopback"),
    (ipaddress.ip_network("10.0.0.0/8"), "a private range"),
    (ipaddress.ip_network("172.16.0.0/12"), "a private range"),
    (ipaddress.ip_network("192.168.0.0/16"), "a private range"),
    (ipaddress.ip_network("fc00::/7"), "a private range"),
    (ipaddress.ip_network("100.64.0.0/10"), "shared address space (100.64.0.0/10)"),
]

Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise RemoteError(ErrorKind.UNAVAILABLE, f"cannot resolve {host!r}: {exc.strerror}") from None
    return sorted({str(info[4][0]) for info in infos})


def address_problem(address: str, *, allow_private: bool) -> str | None:
    """Why `address` may not be dialled, or None when it may."""
    ip: IPAddress = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for network, reason in ALWAYS_REFUSED:
        if ip.version == network.version and ip in network:
            return f"{ip} is {reason}, which is never allowed"
    if not allow_private:
        for network, reason in PRIVATE_OPT_IN:
            if ip.version == network.version and ip in network:
                return f"{ip} is {reason}; allow private endpoints on this config to use it"
    return None


def split_endpoint(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) or tcp endpoint URL, or RemoteError(invalid)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "tcp"):
        raise RemoteError(ErrorKind.INVALID, f"{url!r}: the scheme must be https, http or tcp")
    if not parts.hostname:
        raise RemoteError(ErrorKind.INVALID, f"{url!r}: no host name")
    if parts.username or parts.password:
        raise RemoteError(ErrorKind.INVALID, f"{url!r}: credentials do not belong in the URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise RemoteError(ErrorKind.INVALID, f"{url!r}: invalid port") from None
    return parts.scheme, parts.hostname, port


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

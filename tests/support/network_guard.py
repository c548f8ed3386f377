"""The test run's network rule, enforced in-process: no name is looked up off this machine.

Tests may only talk to servers they start on this machine, and sandboxes get resolvers of
our own. A hostname such as `api.example.com` in a form would otherwise go to the machine's
resolver (an address off this machine) the moment the SSRF guard or a client resolves it.
Installed by tests/conftest.py for the whole run: a lookup of anything but a local name or
an address literal fails at once with a clear message, as an unknown name would, so code
under test sees an ordinary resolution failure and no packet leaves.
"""

from __future__ import annotations

import ipaddress
import socket
from functools import cache
from pathlib import Path
from typing import Any

_real_getaddrinfo = socket.getaddrinfo
_real_gethostbyname = socket.gethostbyname
_real_gethostbyname_ex = socket.gethostbyname_ex


@cache
def _hosts_file_names() -> frozenset[str]:
    names: set[str] = set()
    try:
        lines = Path("/etc/hosts").read_text().splitlines()
    except OSError:
        return frozenset()
    for line in lines:
        fields = line.split("#", 1)[0].split()
        names.update(name.lower().rstrip(".") for name in fields[1:])
    return frozenset(names)


def is_local_name(host: Any) -> bool:
    """An address literal, localhost, this machine's own name or a name in /etc/hosts."""
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    text = str(host).strip("[]").split("%", 1)[0]
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    name = text.lower().rstrip(".")
    return (
        name in ("localhost", socket.gethostname().lower())
        or name.endswith(".localhost")
        or name in _hosts_file_names()
    )


def _refuse(host: Any) -> socket.gaierror:
    return socket.gaierror(
        socket.EAI_NONAME,
        f"test network guard: {host!r} is not a local name; tests never look names up off this machine",
    )


def _getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not is_local_name(host):
        raise _refuse(host)
    return _real_getaddrinfo(host, *args, **kwargs)


def _gethostbyname(host: str) -> str:
    if not is_local_name(host):
        raise _refuse(host)
    return _real_gethostbyname(host)


def _gethostbyname_ex(host: str) -> Any:
    if not is_local_name(host):
        raise _refuse(host)
    return _real_gethostbyname_ex(host)


def install() -> None:
    socket.getaddrinfo = _getaddrinfo
    socket.gethostbyname = _gethostbyname
    socket.gethostbyname_ex = _gethostbyname_ex

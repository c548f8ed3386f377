"""The run's own network rule: names that are not local are never looked up."""

from __future__ import annotations

import socket

import pytest


def test_a_public_name_is_refused_before_any_lookup() -> None:
    with pytest.raises(socket.gaierror, match="test network guard"):
        socket.getaddrinfo("api.example.com", 443)
    with pytest.raises(socket.gaierror, match="test network guard"):
        socket.gethostbyname("example.org.")


def test_local_names_and_literals_still_resolve() -> None:
    assert socket.getaddrinfo("127.0.0.1", 80)
    assert socket.getaddrinfo("localhost", 80)
    assert socket.getaddrinfo("::1", 80)

"""What a unix:// endpoint may name: a socket file, as stat says, and nothing else.

A platform admin's unix:// endpoint is dialled by the console's own process: a path to a
regular file, a device or a folder (unix:///etc/passwd), or to nothing, is refused when the
backend is saved (sandboxes/pages/forms.py); when an adapter connects, a file that is not a
socket is refused again (`invalid`), and a missing one is an engine not running
(`unavailable`). Imports nothing of Django.
"""

from __future__ import annotations

import os
import stat

from .base import ErrorKind, RemoteError

SCHEME = "unix://"

_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISLNK, "a link"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a pipe"),
)


def socket_path(endpoint: str) -> str:
    """The file a unix:// endpoint names (docker-py reads unix://x as /x)."""
    path = endpoint[len(SCHEME) :]
    return path if path.startswith("/") else "/" + path


def unix_socket_problem(endpoint: str) -> str | None:
    """Why a unix:// endpoint cannot be used (None when it names a socket)."""
    path = socket_path(endpoint)
    if path == "/" or "\x00" in path:
        return "A unix:// endpoint names a socket file: unix:///path/to/socket."
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{path} does not exist on the console's host; a unix:// endpoint names a socket file."
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc.__class__.__name__}); a unix:// endpoint names a socket."
    if stat.S_ISSOCK(mode):
        return None
    what = next((word for test, word in _KINDS if test(mode)), "not a socket")
    return f"{path} is {what}, not a socket; a unix:// endpoint names a socket file."


def check_unix_socket(endpoint: str) -> None:
    """Before dialling: RemoteError `invalid` when the unix:// endpoint names a file that is not
    a socket, `unavailable` when it names nothing (an engine that is not running has no
    socket; it may come back, a regular file will not turn into one)."""
    if problem := unix_socket_problem(endpoint):
        if not os.path.lexists(socket_path(endpoint)):
            raise RemoteError(ErrorKind.UNAVAILABLE, problem)
        raise RemoteError(ErrorKind.INVALID, problem)

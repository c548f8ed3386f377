"""A warm resolve's look at its sandbox, sent while the session's row is read.

A warm resolve reads the session's row (with its binding and turn lease), then connects to the
bound sandbox: two round trips, one after the other. This process remembers which sandbox each
session was last resolved to, on which adapter; the next resolve of that session sends that
adapter's first look (`Backend.look_ahead`) before reading the row and reads its answer after,
so the engine answers while the database does.

The remembered sandbox only decides where to look, never what is answered: the look stands
for `connect` only when the row, read after it was sent, binds that same sandbox on that same
adapter and says it is running, and no write had to come before the look (`Runtime._touch`);
the adapter's own answer must say it runs. Anything else drops it, and the resolve connects
as before. A wrong guess costs one inspect. A look the engine does not answer in time is the
connect's own timeout (a wedged engine is waited for once, not once more for the connect).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..backends.base import Backend, Lookahead, SandboxInfo

# Sessions remembered by this process; cleared when full (each then resolves once without).
# The adapter is held weakly: one replaced by a config's edit (and closed) is let go.
KEPT = 4096
_last: dict[tuple[Any, str], tuple[weakref.ref[Backend], str]] = {}


@dataclass
class Ahead:
    backend: Backend
    sandbox_id: str
    look: Lookahead

    def running(self, backend: Backend, sandbox_id: str) -> SandboxInfo | None:
        """The look's answer, if it is about `sandbox_id` on `backend` and that sandbox runs;
        a look the backend did not answer in time raises that timeout, as `connect` would."""
        if backend is not self.backend or sandbox_id != self.sandbox_id:
            return None
        info = self.look.running()
        return info if info is not None and info.sandbox_id == sandbox_id else None


@contextlib.contextmanager
def looking_ahead(space_id: Any, key: str) -> Iterator[Ahead | None]:
    """The look at the sandbox the session `key` of `space_id` was last resolved to (None:
    not resolved here yet, or its adapter has no such look); dropped on the way out."""
    last = _last.get((space_id, key))
    backend = last[0]() if last is not None else None
    look = backend.look_ahead(last[1]) if backend is not None and last is not None else None
    if look is None or backend is None or last is None:
        yield None
        return
    try:
        yield Ahead(backend, last[1], look)
    finally:
        look.drop()


def remember(space_id: Any, key: str, backend: Backend, sandbox_id: str) -> None:
    """The session `key` of `space_id` resolved to `sandbox_id` on `backend`."""
    last = _last.get((space_id, key))
    if last is not None and last[1] == sandbox_id and last[0]() is backend:
        return
    if len(_last) >= KEPT:
        _last.clear()
    _last[(space_id, key)] = (weakref.ref(backend), sandbox_id)

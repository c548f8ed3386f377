"""The egress state folder of the host: what each sandbox was given and where it sits (one
JSON file per sandbox, kept as `.gone` for a while after its delete so late refusals still
find it), under a file lock shared by every console process of the host.

Imports nothing of the project but the contract and `netpolicy` (a recorded policy is read
back through its parser).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from netpolicy import PolicyError

from ...base import NetworkSpec
from .rules import Binding

GONE_KEPT_S = 7 * 86400  # a deleted sandbox's addresses, for refusals read late


@dataclass(frozen=True)
class SandboxState:
    sandbox_id: str
    bridge: str
    v4: tuple[str, ...]
    v6: tuple[str, ...]
    online: bool
    allow_out: tuple[str, ...]
    deny_out: tuple[str, ...]
    allow_private: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, sandbox_id: str, bridge: str, v4: tuple[str, ...], v6: tuple[str, ...], online: bool, spec: NetworkSpec
    ) -> SandboxState:
        return cls(
            sandbox_id,
            bridge,
            v4,
            v6,
            online,
            tuple(str(e) for e in spec.allow_out),
            tuple(str(e) for e in spec.deny_out),
            tuple(str(e) for e in spec.allow_private),
        )

    @property
    def spec(self) -> NetworkSpec:
        """The NetworkSpec recorded (its texts read back through netpolicy's parser; a file no
        longer parseable is taken as outbound off, never as a wider policy)."""
        try:
            return NetworkSpec.parse(
                allow_internet_access=self.online,
                allow_public_traffic=False,
                allow_out=self.allow_out,
                deny_out=self.deny_out,
                allow_private=self.allow_private,
            )
        except PolicyError:
            return NetworkSpec(allow_internet_access=False, allow_public_traffic=False)

    @property
    def binding(self) -> Binding | None:
        return Binding(self.bridge, self.v4, self.v6) if self.bridge and (self.v4 or self.v6) else None


class EgressState:
    """The state folder: one JSON file per sandbox, the resolvers' files (`dns/`), ulogd's."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._held = threading.local()  # re-entrance of the lock within one thread

    def path(self, *parts: str) -> str:
        return os.path.join(self.folder, *parts)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive across the host's console processes; re-entrant within a thread (a
        restore of the whole table may run inside an update)."""
        if getattr(self._held, "depth", 0):
            self._held.depth += 1
            try:
                yield
            finally:
                self._held.depth -= 1
            return
        os.makedirs(self.path("sandboxes"), mode=0o700, exist_ok=True)
        with open(self.path("lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            self._held.depth = 1
            try:
                yield
            finally:
                self._held.depth = 0
                fcntl.flock(handle, fcntl.LOCK_UN)

    def read(self, sandbox_id: str) -> SandboxState | None:
        try:
            with open(self.path("sandboxes", f"{sandbox_id}.json")) as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return None
        return _state_from(data)

    def write(self, state: SandboxState) -> None:
        target = self.path("sandboxes", f"{state.sandbox_id}.json")
        with open(target + ".new", "w") as handle:
            json.dump(state.__dict__, handle)
        os.replace(target + ".new", target)

    def remove(self, sandbox_id: str) -> None:
        """Kept as "gone" so refusals logged just before the delete still find their sandbox
        (dropped by `prune_gone`, housekeeping's)."""
        state = self.read(sandbox_id)
        if state is not None:
            gone = self.path("sandboxes", f"{sandbox_id}.gone")
            with open(gone, "w") as handle:
                json.dump({**state.__dict__, "online": False}, handle)
            with contextlib.suppress(OSError):
                os.unlink(self.path("sandboxes", f"{sandbox_id}.json"))

    def drop(self, sandbox_id: str) -> None:
        """Every record of a sandbox gone (its network was released)."""
        for suffix in (".json", ".gone"):
            with contextlib.suppress(OSError):
                os.unlink(self.path("sandboxes", f"{sandbox_id}{suffix}"))

    def prune_gone(self, kept_s: float = GONE_KEPT_S) -> int:
        """Gone sandboxes' files older than `kept_s` dropped; how many."""
        cutoff = time.time() - kept_s
        dropped = 0
        with contextlib.suppress(OSError):
            for name in os.listdir(self.path("sandboxes")):
                path = self.path("sandboxes", name)
                if name.endswith(".gone") and os.path.getmtime(path) < cutoff:
                    os.unlink(path)
                    dropped += 1
        return dropped

    def all(self, include_gone: bool = False) -> list[SandboxState]:
        found = []
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(self.path("sandboxes"))):
                if not (name.endswith(".json") or (include_gone and name.endswith(".gone"))):
                    continue
                with contextlib.suppress(OSError, ValueError), open(self.path("sandboxes", name)) as handle:
                    found.append(_state_from(json.load(handle)))
        return found


def _state_from(data: dict[str, Any]) -> SandboxState:
    return SandboxState(
        sandbox_id=str(data["sandbox_id"]),
        bridge=str(data.get("bridge", "")),
        v4=tuple(data.get("v4", ())),
        v6=tuple(data.get("v6", ())),
        online=bool(data.get("online")),
        allow_out=tuple(data.get("allow_out", ())),
        deny_out=tuple(data.get("deny_out", ())),
        allow_private=tuple(data.get("allow_private", ())),
    )

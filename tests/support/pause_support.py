"""Harness of the pause tests: an agent on the API, threads that loop calls and count the
answers, and the freezer cgroup of a test's own container (to thaw it if anything hangs, and
to put it into the state docker/for-linux#891 leaves behind)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connections

from sandboxes.backends.docker.repair import Freezer


def freezer(container_id: str) -> Freezer:
    found = Freezer.find(container_id)
    assert found is not None, f"no freezer cgroup found for {container_id} under /sys/fs/cgroup"
    return found


def thaw_quietly(container_id: str) -> None:
    """Teardown: whatever a test left frozen is thawed, so the engine never hangs on it."""
    found = Freezer.find(container_id)
    if found is not None and Path(found.path).exists():
        with contextlib.suppress(OSError):
            found.thaw()


def answer_of(response: Any) -> tuple[int, str]:
    if response.status_code < 300:
        return (response.status_code, "")
    try:
        return (response.status_code, response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return (response.status_code, response.content[:80].decode(errors="replace"))


class Loop:
    """Run `call` in a thread until stopped (or `rounds` times); count answers and the slowest.
    `gap_s`: a pause between calls, leaving moments when this loop has nothing in flight;
    `gap_share`: the pause is also at least this share of the call just made, so that the
    moments stay as frequent on a loaded machine, where each call takes longer."""

    def __init__(
        self,
        name: str,
        call: Callable[[], tuple[int, str]],
        *,
        rounds: int | None = None,
        gap_s: float = 0.0,
        gap_share: float = 0.0,
    ) -> None:
        self.name, self.call, self.rounds, self.gap_s, self.gap_share = name, call, rounds, gap_s, gap_share
        self.seen: Counter[tuple[int, str]] = Counter()
        # When each answer came (time.monotonic()), in order: tests that need the order of
        # answers across loops (did a pause fall between two calls?) read it.
        self.answered: list[tuple[float, tuple[int, str]]] = []
        self.slowest = 0.0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            done = 0
            while not self.stop.is_set() and (self.rounds is None or done < self.rounds):
                started = time.monotonic()
                try:
                    answer = self.call()
                except Exception as exc:  # counted: a test asserts there are none
                    answer = (0, f"{exc.__class__.__name__}: {exc}"[:120])
                took = time.monotonic() - started
                self.slowest = max(self.slowest, took)
                self.seen[answer] += 1
                self.answered.append((time.monotonic(), answer))
                done += 1
                gap = max(self.gap_s, self.gap_share * took)
                if gap:
                    self.stop.wait(gap)
        finally:
            connections.close_all()

    def start(self) -> Loop:
        self.thread.start()
        return self

    def join(self, timeout: float) -> bool:
        """Stop and wait; False when the thread is still stuck in a call (a wedge)."""
        self.stop.set()
        self.thread.join(timeout)
        return not self.thread.is_alive()


def pauses_between_calls(pauses: Loop, wakers: list[Loop]) -> int:
    """How many of `pauses`' 200s paused a sandbox that a call of `wakers` had woken since the
    previous one. A pause of a paused sandbox also answers 200 (it is idempotent), so counting
    200s alone says nothing of whether the pause ever fell between calls."""
    woken = sorted(at for loop in wakers for at, answer in loop.answered if answer == (200, ""))
    count, last, i = 0, float("-inf"), 0
    for at, answer in pauses.answered:
        if answer != (200, ""):
            continue
        while i < len(woken) and woken[i] <= last:
            i += 1
        if i < len(woken) and woken[i] < at:
            count += 1
        last = at
    return count

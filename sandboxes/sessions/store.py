"""Session state shared across processes: bindings, lifecycle locks, turn leases.

- Binding: session -> sandbox. Written with SET NX and no expiry; removed only by
  compare-and-delete, so a process holding a stale view can never remove a newer binding.
- Lifecycle lock: token-owned and leased (renewed while held, released by
  compare-and-delete), so create, recover, replace and delete of one session never overlap
  across processes, and a crashed holder frees it when the lease runs out.
- Turn lease: its presence means a turn is in flight; its value says whether the turn's
  one-shot rebuild ticket is still unused. It expires by itself (a leaked turn, 30 min).

Stores: `RedisSessionStore` when REDIS_URL (or SESSION_STORE_URL) is set, otherwise
`DatabaseSessionStore` (`store_db`) in the console's own database (chosen in `store_select`), so the embedded
default loses nothing on a restart either. `MemorySessionStore` holds the same semantics in
one process's memory for unit tests only; settings never choose it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from ..backends.base import ErrorKind, RemoteError

logger = logging.getLogger(__name__)

T = TypeVar("T")

TURN_TTL_S = 30 * 60
LOCK_TTL_MS = 60_000
TICKET_UNUSED = "ticket"
TICKET_USED = "used"


class SessionStoreUnavailable(RemoteError):
    """The binding store (Redis) does not answer: nothing was decided or written."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.UNAVAILABLE, f"session store unavailable: {message}")


@dataclass(frozen=True)
class Binding:
    sandbox_id: str
    version: int
    config_id: str
    created: str  # ISO time the sandbox was bound; compared with the session's stale time

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Binding:
        data = json.loads(raw)
        return cls(
            sandbox_id=data["sandbox_id"],
            version=int(data["version"]),
            config_id=data["config_id"],
            created=data["created"],
        )

    @property
    def created_at(self) -> datetime:
        return datetime.fromisoformat(self.created)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class TurnLease:
    in_flight: bool
    ticket_unused: bool
    ttl_s: int | None = None


class SessionStore(Protocol):
    name: str

    def get_binding(self, key: str) -> Binding | None: ...
    def get_bindings(self, keys: Iterable[str]) -> dict[str, Binding]: ...
    def set_binding_if_absent(self, key: str, binding: Binding) -> bool: ...
    def delete_binding_if(self, key: str, expected: Binding) -> bool: ...
    def acquire_lock(self, key: str, token: str, ttl_ms: int) -> bool: ...
    def renew_lock(self, key: str, token: str, ttl_ms: int) -> bool: ...
    def release_lock(self, key: str, token: str) -> bool: ...
    def lock_holder(self, key: str) -> str | None: ...
    def begin_turn(self, key: str, ttl_s: int) -> None: ...
    def consume_ticket(self, key: str) -> bool: ...
    def turn_lease(self, key: str) -> TurnLease: ...
    def end_turn(self, key: str) -> None: ...
    def read_session(self, binding_key: str, turn_key: str) -> tuple[Binding | None, TurnLease]: ...
    def read_session_with(
        self, binding_key: str, turn_key: str, other: Callable[[], T]
    ) -> tuple[T, tuple[Binding | None, TurnLease] | None]: ...
    def purge_expired(self) -> int: ...


# What `read_session_with` answers: `other()`'s result, and the session's binding and turn
# lease, or None when the store did not answer (the caller's own `read_session` then says so).
ReadWith = tuple[T, tuple[Binding | None, TurnLease] | None]


def read_after(store: SessionStore, binding_key: str, turn_key: str, other: Callable[[], T]) -> ReadWith[T]:
    """`read_session_with` for a store whose reads cannot overlap another: one after the other."""
    result = other()
    try:
        return result, store.read_session(binding_key, turn_key)
    except SessionStoreUnavailable:
        return result, None


def log_binding_write(action: str, key: str, binding: Binding, done: bool, store: str) -> None:
    """One line per binding write: what was asked, and whether the store did it."""
    logger.info(
        "binding %s %s: %s",
        action,
        key,
        "done" if done else "refused",
        extra={"action": action, "binding": key, "sandbox_id": binding.sandbox_id, "done": done, "store": store},
    )


def binding_key(space_id: object, session_key: str) -> str:
    return f"console:binding:{space_id}:{session_key}"


def lock_key(space_id: object, session_key: str) -> str:
    return f"console:lock:{space_id}:{session_key}"


def turn_key(space_id: object, session_key: str) -> str:
    return f"console:turn:{space_id}:{session_key}"


# --- Redis --------------------------------------------------------------------------------

# Compare-and-delete: remove KEYS[1] only if it still holds ARGV[1].
_CAS_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end
"""
# Renew a lease only for its owner.
_CAS_PEXPIRE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end
"""
# Consume the turn's one-shot rebuild ticket, keeping the lease's expiry.
_CONSUME_TICKET = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  return 1
end
return 0
"""


class RedisSessionStore:
    """Bindings, locks and turn leases in Redis (the authoritative store at scale)."""

    name = "redis"

    def __init__(self, url: str, *, timeout_s: float = 3.0) -> None:
        import redis

        self._redis_errors = (redis.RedisError, OSError)
        self.client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, health_check_interval=30
        )
        self._cas_delete = self.client.register_script(_CAS_DELETE)
        self._cas_pexpire = self.client.register_script(_CAS_PEXPIRE)
        self._consume = self.client.register_script(_CONSUME_TICKET)

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._redis_errors as exc:
            logger.warning("session store unavailable %s: %s", what, exc.__class__.__name__, extra={"store": "redis"})
            raise SessionStoreUnavailable(f"{what}: {exc}") from exc

    def get_binding(self, key: str) -> Binding | None:
        with self._guard("reading the binding"):
            raw = self.client.get(key)
        return Binding.from_json(raw) if raw else None

    def get_bindings(self, keys: Iterable[str]) -> dict[str, Binding]:
        wanted = list(dict.fromkeys(keys))
        found: dict[str, Binding] = {}
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            with self._guard("reading bindings"):
                values = self.client.mget(chunk)
            found.update((key, Binding.from_json(raw)) for key, raw in zip(chunk, values, strict=True) if raw)
        return found

    def set_binding_if_absent(self, key: str, binding: Binding) -> bool:
        with self._guard("writing the binding"):
            written = bool(self.client.set(key, binding.to_json(), nx=True))
        log_binding_write("bind", key, binding, written, self.name)
        return written

    def delete_binding_if(self, key: str, expected: Binding) -> bool:
        # The stored text is compared whole, so only the exact binding read is removed.
        with self._guard("removing the binding"):
            raw = self.client.get(key)
            removed = False
            if raw is not None and Binding.from_json(raw) == expected:
                removed = bool(self._cas_delete(keys=[key], args=[raw]))
        log_binding_write("unbind", key, expected, removed, self.name)
        return removed

    def acquire_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        with self._guard("taking the lifecycle lock"):
            return bool(self.client.set(key, token, nx=True, px=ttl_ms))

    def renew_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        with self._guard("renewing the lifecycle lock"):
            return bool(self._cas_pexpire(keys=[key], args=[token, ttl_ms]))

    def release_lock(self, key: str, token: str) -> bool:
        with self._guard("releasing the lifecycle lock"):
            return bool(self._cas_delete(keys=[key], args=[token]))

    def lock_holder(self, key: str) -> str | None:
        with self._guard("reading the lifecycle lock"):
            raw = self.client.get(key)
        return raw.decode() if isinstance(raw, bytes) else None

    def begin_turn(self, key: str, ttl_s: int) -> None:
        with self._guard("starting the turn"):
            self.client.set(key, TICKET_UNUSED, ex=ttl_s)

    def consume_ticket(self, key: str) -> bool:
        with self._guard("consuming the rebuild ticket"):
            return bool(self._consume(keys=[key], args=[TICKET_UNUSED, TICKET_USED]))

    def turn_lease(self, key: str) -> TurnLease:
        with self._guard("reading the turn lease"):
            pipe = self.client.pipeline()
            pipe.get(key)
            pipe.ttl(key)
            raw, ttl = pipe.execute()
        if raw is None:
            return TurnLease(in_flight=False, ticket_unused=False)
        return TurnLease(in_flight=True, ticket_unused=raw == TICKET_UNUSED.encode(), ttl_s=int(ttl))

    def end_turn(self, key: str) -> None:
        with self._guard("ending the turn"):
            self.client.delete(key)

    def read_session(self, binding_key: str, turn_key: str) -> tuple[Binding | None, TurnLease]:
        """The binding and the turn lease in one round trip (the warm resolve path)."""
        with self._guard("reading the session"):
            pipe = self.client.pipeline(transaction=False)
            pipe.get(binding_key)
            pipe.get(turn_key)
            pipe.ttl(turn_key)
            raw_binding, raw_turn, ttl = pipe.execute()
        return self._session(raw_binding, raw_turn, ttl)

    def read_session_with(self, binding_key: str, turn_key: str, other: Callable[[], T]) -> ReadWith[T]:
        """`read_session` overlapped with `other()` (the session's row from the database): the
        request is sent first, the answer read once `other` returns, so the warm path waits for
        one round trip, not two. A connection whose answer was not read (`other` raised) is
        closed, never handed to the next command with an answer pending."""
        pool = self.client.connection_pool
        try:
            conn = pool.get_connection()
        except self._redis_errors:
            return other(), None
        try:
            try:
                conn.send_packed_command(
                    conn.pack_commands([("GET", binding_key), ("GET", turn_key), ("TTL", turn_key)])
                )
            except self._redis_errors:
                conn.disconnect()
                return other(), None
            result = other()
            try:
                raw_binding, raw_turn, ttl = (conn.read_response() for _ in range(3))
            except self._redis_errors:
                conn.disconnect()
                return result, None
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        return result, self._session(raw_binding, raw_turn, ttl)

    @staticmethod
    def _session(raw_binding: bytes | None, raw_turn: bytes | None, ttl: int) -> tuple[Binding | None, TurnLease]:
        binding = Binding.from_json(raw_binding) if raw_binding else None
        if raw_turn is None:
            return binding, TurnLease(in_flight=False, ticket_unused=False)
        return binding, TurnLease(in_flight=True, ticket_unused=raw_turn == TICKET_UNUSED.encode(), ttl_s=int(ttl))

    def purge_expired(self) -> int:
        return 0  # Redis expires its own keys


# --- In memory ------------------------------------------------------------------------------


class MemorySessionStore:
    """The same semantics in this process's memory: for unit tests and nothing else (two
    processes would each see their own bindings, and a restart loses them all)."""

    name = "memory (unit tests only)"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, tuple[str, float | None]] = {}

    def _get(self, key: str) -> str | None:
        entry = self._values.get(key)
        if entry is None:
            return None
        value, expires = entry
        if expires is not None and expires <= time.monotonic():
            del self._values[key]
            return None
        return value

    def _set(self, key: str, value: str, ttl_s: float | None) -> None:
        self._values[key] = (value, None if ttl_s is None else time.monotonic() + ttl_s)

    def get_binding(self, key: str) -> Binding | None:
        with self._lock:
            raw = self._get(key)
        return Binding.from_json(raw) if raw else None

    def get_bindings(self, keys: Iterable[str]) -> dict[str, Binding]:
        found = {key: self.get_binding(key) for key in keys}
        return {key: binding for key, binding in found.items() if binding is not None}

    def set_binding_if_absent(self, key: str, binding: Binding) -> bool:
        with self._lock:
            if self._get(key) is not None:
                return False
            self._set(key, binding.to_json(), None)
            return True

    def delete_binding_if(self, key: str, expected: Binding) -> bool:
        with self._lock:
            raw = self._get(key)
            if raw is None or Binding.from_json(raw) != expected:
                return False
            del self._values[key]
            return True

    def acquire_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        with self._lock:
            if self._get(key) is not None:
                return False
            self._set(key, token, ttl_ms / 1000)
            return True

    def renew_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        with self._lock:
            if self._get(key) != token:
                return False
            self._set(key, token, ttl_ms / 1000)
            return True

    def release_lock(self, key: str, token: str) -> bool:
        with self._lock:
            if self._get(key) != token:
                return False
            del self._values[key]
            return True

    def lock_holder(self, key: str) -> str | None:
        with self._lock:
            return self._get(key)

    def begin_turn(self, key: str, ttl_s: int) -> None:
        with self._lock:
            self._set(key, TICKET_UNUSED, ttl_s)

    def consume_ticket(self, key: str) -> bool:
        with self._lock:
            if self._get(key) != TICKET_UNUSED:
                return False
            _, expires = self._values[key]
            self._values[key] = (TICKET_USED, expires)
            return True

    def turn_lease(self, key: str) -> TurnLease:
        with self._lock:
            raw = self._get(key)
            expires = self._values[key][1] if raw is not None else None
        if raw is None:
            return TurnLease(in_flight=False, ticket_unused=False)
        ttl = None if expires is None else int(expires - time.monotonic())
        return TurnLease(in_flight=True, ticket_unused=raw == TICKET_UNUSED, ttl_s=ttl)

    def end_turn(self, key: str) -> None:
        with self._lock:
            self._values.pop(key, None)

    def read_session(self, binding_key: str, turn_key: str) -> tuple[Binding | None, TurnLease]:
        return self.get_binding(binding_key), self.turn_lease(turn_key)

    def read_session_with(self, binding_key: str, turn_key: str, other: Callable[[], T]) -> ReadWith[T]:
        return read_after(self, binding_key, turn_key, other)

    def purge_expired(self) -> int:
        with self._lock:
            expired = [key for key in list(self._values) if self._get(key) is None]
        return len(expired)


# --- The lifecycle lock ----------------------------------------------------------------------


class LockTimeout(RemoteError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.CONFLICT, message, retryable=True)


class LockLost(RemoteError):
    """The holder's lease ran out (renewal failed or came too late): another process may hold
    the lock now, so nothing may be decided or written under it any more."""

    def __init__(self, key: str) -> None:
        super().__init__(
            ErrorKind.CONFLICT, f"the lifecycle lock {key} was lost before the work was done", retryable=True
        )


class HeldLock:
    """A lifecycle lock while held: its token, and whether its lease may have run out.

    `lost` is set by the renewer when a renewal is refused (someone else holds the key) or
    when no renewal succeeded for a whole lease; `check()` confirms with the store itself
    (renewing on the way) and raises `LockLost` rather than let its holder write.
    """

    def __init__(self, store: SessionStore, key: str, token: str, ttl_ms: int) -> None:
        self.store, self.key, self.token, self.ttl_ms = store, key, token, ttl_ms
        self.lost = threading.Event()
        # Measured from before the call that took (or renewed) the lease: never optimistic.
        self.renewed_at = time.monotonic()

    def expired_locally(self) -> bool:
        # 10% margin: the store's clock may run a little ahead of ours.
        return time.monotonic() - self.renewed_at >= self.ttl_ms * 0.9 / 1000

    def is_lost(self) -> bool:
        if not self.lost.is_set() and self.expired_locally():
            self.lost.set()
        return self.lost.is_set()

    def renew(self) -> bool:
        """One renewal; False when the store refused it (the lease is someone else's now)."""
        started = time.monotonic()
        if self.store.renew_lock(self.key, self.token, self.ttl_ms):
            # The store still held our token, so nobody took the lock in between.
            if not self.lost.is_set():
                self.renewed_at = started
            return True
        self.lost.set()
        return False

    def check(self) -> None:
        """Raise `LockLost` unless the lock is still ours (asks the store, extending the lease)."""
        if self.is_lost():
            raise LockLost(self.key)
        try:
            still_ours = self.renew()
        except RemoteError:
            still_ours = not self.is_lost()  # cannot ask: trust the lease while it runs
        if not still_ours:
            raise LockLost(self.key)


@contextmanager
def lifecycle_lock(
    store: SessionStore,
    key: str,
    *,
    ttl_ms: int = LOCK_TTL_MS,
    wait_s: float = 120.0,
    holder: str = "",
) -> Iterator[HeldLock]:
    """Hold the session's lifecycle lock; renewed in the background until released.

    Waiters back off with jitter; `wait_s=0` tries once. The token names the holder (for
    the binding inspector).
    """
    token = f"{holder or 'console'}:{uuid.uuid4().hex}"
    deadline = time.monotonic() + wait_s
    delay = 0.02
    while True:
        started = time.monotonic()
        if store.acquire_lock(key, token, ttl_ms):
            break
        if time.monotonic() >= deadline:
            logger.info("lifecycle lock %s busy", key, extra={"lock": key, "waited_s": wait_s})
            raise LockTimeout(f"the session is busy (lifecycle lock held by {store.lock_holder(key) or 'someone'})")
        time.sleep(delay + random.uniform(0, delay))  # noqa: S311 - jitter, not security
        delay = min(delay * 2, 0.5)
    held = HeldLock(store, key, token, ttl_ms)
    held.renewed_at = started
    logger.debug("lifecycle lock %s taken", key, extra={"lock": key, "holder": holder})
    stop = threading.Event()
    renewer = threading.Thread(target=_renew_until, args=(held, stop), daemon=True)
    renewer.start()
    try:
        yield held
    finally:
        stop.set()
        renewer.join(timeout=5)
        with contextlib.suppress(RemoteError):  # the lease expires by itself
            store.release_lock(key, token)


def _renew_until(held: HeldLock, stop: threading.Event) -> None:
    try:
        while not stop.wait(held.ttl_ms / 3000):
            try:
                if not held.renew():
                    logger.warning("lifecycle lock %s lost to another holder", held.key, extra={"lock": held.key})
                    return
            except RemoteError:
                held.is_lost()  # marks the lock lost once a whole lease passed without renewal
                continue
    finally:
        from django.db import connections

        connections.close_all()  # this thread's own (the database store's renewals)

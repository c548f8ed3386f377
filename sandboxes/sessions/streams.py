"""Ring buffers of output chunks with monotonically increasing ids.

One interface, two stores:

- `MemoryRingBuffer`: in this process's memory. The web terminal keeps one per PTY (in the
  process that owns the PTY) to replay what a reconnecting client missed.
- `RedisRingBuffer`: in Redis, readable from any process. Background commands write their
  output here from the process that started them; the agent API and the session page read
  it from anywhere. The keys get a TTL once the command has ended.

Chunk ids start at 1 and grow by one per chunk, for the life of the buffer. A reader keeps
the id of the last chunk it saw and asks for what follows (`read_after(last_id, ...)`); a
reader that asks for ids already dropped is told so (`fell_behind`) and gets the oldest
chunks still held. `read_after(None, ...)` and `read_after(0, ...)` both read from the
start of the stream.

Bounds: total bytes and chunk count. The newest chunk is always kept; data longer than
`MAX_CHUNK_BYTES` is split on append, so one page is at most `max(max_bytes, MAX_CHUNK_BYTES)`.
"""

from __future__ import annotations

import abc
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

MAX_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class ReadResult:
    """A page of chunks after some id.

    `next_after` is what to pass as `after_id` next time; `first_id` is the oldest id still
    held (None while nothing was ever appended); `last_id` the newest appended so far.
    """

    chunks: list[tuple[int, bytes]] = field(default_factory=list)
    next_after: int = 0
    fell_behind: bool = False
    first_id: int | None = None
    last_id: int = 0

    @property
    def data(self) -> bytes:
        return b"".join(chunk for _, chunk in self.chunks)

    @property
    def caught_up(self) -> bool:
        """True when this page ends at the newest chunk appended so far."""
        return self.next_after >= self.last_id


def split_chunks(data: bytes) -> list[bytes]:
    return [data[i : i + MAX_CHUNK_BYTES] for i in range(0, len(data), MAX_CHUNK_BYTES)] or [b""]


def page(
    held: list[tuple[int, bytes]], first_id: int | None, last_id: int, after_id: int | None, max_bytes: int
) -> ReadResult:
    """Select a page from `held` (chunks in id order): shared by both stores."""
    after = max(after_id or 0, 0)
    oldest = first_id if first_id is not None else last_id + 1
    fell_behind = after + 1 < oldest
    chunks: list[tuple[int, bytes]] = []
    size = 0
    for chunk_id, data in held:
        if chunk_id <= after:
            continue
        if chunks and size + len(data) > max_bytes:
            break
        chunks.append((chunk_id, data))
        size += len(data)
    # Nothing new: a reader past the end keeps its position, one behind moves to the oldest.
    caught = max(after, oldest - 1) if after <= last_id else after
    next_after = chunks[-1][0] if chunks else caught
    return ReadResult(chunks, next_after, fell_behind, first_id, last_id)


class RingBuffer(abc.ABC):
    """Bounded chunks with ids; see the module docstring for the semantics."""

    def __init__(self, *, max_bytes: int = 1024 * 1024, max_chunks: int = 1000) -> None:
        if max_bytes <= 0 or max_chunks <= 0:
            raise ValueError("ring buffer bounds must be positive")
        self.max_bytes = max_bytes
        self.max_chunks = max_chunks

    @abc.abstractmethod
    def append(self, data: bytes) -> int:
        """Store `data` (split when longer than MAX_CHUNK_BYTES); returns the last chunk id."""

    @abc.abstractmethod
    def read_after(self, after_id: int | None, max_bytes: int = 256 * 1024) -> ReadResult: ...

    @abc.abstractmethod
    def last_id(self) -> int:
        """The newest chunk id (0 while empty)."""

    def finish(self, ttl_s: int) -> None:  # noqa: B027 - optional hook, a no-op in memory
        """The writer is done; the store may forget the buffer after `ttl_s` seconds."""

    def delete(self) -> None:  # noqa: B027 - optional hook, a no-op in memory
        """Forget the buffer now."""


class MemoryRingBuffer(RingBuffer):
    """In this process only (the terminal's replay buffer). Thread-safe."""

    def __init__(self, *, max_bytes: int = 1024 * 1024, max_chunks: int = 1000) -> None:
        super().__init__(max_bytes=max_bytes, max_chunks=max_chunks)
        self._lock = threading.Lock()
        self._chunks: deque[tuple[int, bytes]] = deque()
        self._bytes = 0
        self._last = 0

    def append(self, data: bytes) -> int:
        with self._lock:
            for piece in split_chunks(bytes(data)):
                self._last += 1
                self._chunks.append((self._last, piece))
                self._bytes += len(piece)
                while len(self._chunks) > 1 and (len(self._chunks) > self.max_chunks or self._bytes > self.max_bytes):
                    self._bytes -= len(self._chunks.popleft()[1])
            return self._last

    def read_after(self, after_id: int | None, max_bytes: int = 256 * 1024) -> ReadResult:
        with self._lock:
            first = self._chunks[0][0] if self._chunks else None
            after = max(after_id or 0, 0)
            if first is not None and after >= first:
                held = list(self._chunks)[after - first + 1 :]
            else:
                held = list(self._chunks)
            return page(held, first, self._last, after_id, max_bytes)

    def last_id(self) -> int:
        with self._lock:
            return self._last


# Keys share a hash tag so a Redis cluster keeps them in one slot (the scripts need that).
# KEYS: seq (last id), first (oldest held id), bytes (total held), list (the chunks).
_APPEND = """
local ttl = tonumber(ARGV[1])
local max_bytes = tonumber(ARGV[2])
local max_chunks = tonumber(ARGV[3])
local id = 0
for i = 4, #ARGV do
  id = redis.call('INCR', KEYS[1])
  redis.call('RPUSH', KEYS[4], ARGV[i])
  redis.call('INCRBY', KEYS[3], string.len(ARGV[i]))
  if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('SET', KEYS[2], id) end
end
local n = redis.call('LLEN', KEYS[4])
local total = tonumber(redis.call('GET', KEYS[3]))
while n > 1 and (n > max_chunks or total > max_bytes) do
  local old = redis.call('LPOP', KEYS[4])
  total = total - string.len(old)
  n = n - 1
  redis.call('INCR', KEYS[2])
end
redis.call('SET', KEYS[3], total)
for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
return id
"""

# Returns {first or false, last, chunk, chunk, ...}: the held chunks after ARGV[1], at most
# ARGV[2] bytes (always at least one chunk when there is one).
_READ = """
local after = tonumber(ARGV[1])
local max_bytes = tonumber(ARGV[2])
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
local first = redis.call('GET', KEYS[2])
local out = {first or false, last}
if not first then return out end
first = tonumber(first)
local start = after - first + 1
if start < 0 then start = 0 end
local size = 0
local index = start
local full = false
while not full do
  local batch = redis.call('LRANGE', KEYS[4], index, index + 63)
  if #batch == 0 then break end
  for _, chunk in ipairs(batch) do
    if #out > 2 and size + string.len(chunk) > max_bytes then full = true break end
    table.insert(out, chunk)
    size = size + string.len(chunk)
  end
  index = index + 64
end
return out
"""


class RedisRingBuffer(RingBuffer):
    """In Redis, readable from any process (background command output).

    While the writer runs, every append refreshes a long TTL (`active_ttl_s`), so a buffer
    whose writer died still goes away; `finish(ttl)` shortens it once the writer is done.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        max_bytes: int = 4 * 1024 * 1024,
        max_chunks: int = 4096,
        active_ttl_s: int = 24 * 3600,
        prefix: str = "console:ring",
    ) -> None:
        super().__init__(max_bytes=max_bytes, max_chunks=max_chunks)
        self.client = client
        self.name = name
        self.active_ttl_s = active_ttl_s
        base = f"{prefix}:{{{name}}}"
        self.keys = [f"{base}:seq", f"{base}:first", f"{base}:bytes", f"{base}:chunks"]
        self._append = client.register_script(_APPEND)
        self._read = client.register_script(_READ)

    def append(self, data: bytes) -> int:
        pieces = split_chunks(bytes(data))
        return int(self._append(keys=self.keys, args=[self.active_ttl_s, self.max_bytes, self.max_chunks, *pieces]))

    def read_after(self, after_id: int | None, max_bytes: int = 256 * 1024) -> ReadResult:
        after = max(after_id or 0, 0)
        reply = self._read(keys=self.keys, args=[after, max(max_bytes, 1)])
        first = int(reply[0]) if reply[0] else None
        last = int(reply[1])
        start = max(after + 1, first) if first is not None else last + 1
        held = [(start + i, bytes(chunk)) for i, chunk in enumerate(reply[2:])]
        return page(held, first, last, after_id, max_bytes)

    def last_id(self) -> int:
        return int(self.client.get(self.keys[0]) or 0)

    def finish(self, ttl_s: int) -> None:
        pipe = self.client.pipeline()
        for key in self.keys:
            pipe.expire(key, max(int(ttl_s), 1))
        pipe.execute()

    def delete(self) -> None:
        self.client.delete(*self.keys)

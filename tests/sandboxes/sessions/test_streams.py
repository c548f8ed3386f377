"""The ring buffer: the same cases against the in-memory store and real Redis."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

from sandboxes.sessions.streams import MAX_CHUNK_BYTES, MemoryRingBuffer, RedisRingBuffer, RingBuffer
from tests.conftest import REDIS_URL, require_service

Factory = Callable[..., RingBuffer]


@pytest.fixture(params=["memory", "redis"])
def make_ring(request: pytest.FixtureRequest) -> Iterator[Factory]:
    if request.param == "memory":
        yield MemoryRingBuffer
        return
    require_service("redis")
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    made: list[RedisRingBuffer] = []

    def factory(**bounds: int) -> RingBuffer:
        ring = RedisRingBuffer(client, f"test-{uuid.uuid4().hex}", prefix="test:ring", **bounds)
        made.append(ring)
        return ring

    yield factory
    for ring in made:
        ring.delete()
    client.close()


def test_ids_grow_by_one_and_reads_resume_after_an_id(make_ring: Factory) -> None:
    ring = make_ring()
    assert ring.last_id() == 0
    assert ring.read_after(None).chunks == []
    assert [ring.append(b) for b in (b"a", b"b", b"c")] == [1, 2, 3]
    everything = ring.read_after(None)
    assert everything.chunks == [(1, b"a"), (2, b"b"), (3, b"c")]
    assert (everything.next_after, everything.first_id, everything.fell_behind) == (3, 1, False)
    assert everything.caught_up
    assert ring.read_after(0).chunks == everything.chunks
    assert ring.read_after(1).chunks == [(2, b"b"), (3, b"c")]
    nothing_new = ring.read_after(3)
    assert (nothing_new.chunks, nothing_new.next_after, nothing_new.fell_behind) == ([], 3, False)


def test_pages_are_bounded_by_bytes_but_always_make_progress(make_ring: Factory) -> None:
    ring = make_ring()
    for i in range(5):
        ring.append(bytes([65 + i]) * 10)
    first = ring.read_after(None, max_bytes=25)
    assert [cid for cid, _ in first.chunks] == [1, 2]
    assert not first.caught_up
    rest = ring.read_after(first.next_after, max_bytes=25)
    assert [cid for cid, _ in rest.chunks] == [3, 4]
    single = ring.read_after(None, max_bytes=1)  # one chunk larger than the page: still returned
    assert [cid for cid, _ in single.chunks] == [1]


def test_bounded_by_count_and_a_slow_reader_is_told_it_fell_behind(make_ring: Factory) -> None:
    ring = make_ring(max_chunks=3, max_bytes=10_000)
    for i in range(1, 8):
        ring.append(f"{i}".encode())
    result = ring.read_after(2)
    assert result.fell_behind
    assert result.first_id == 5
    assert result.chunks == [(5, b"5"), (6, b"6"), (7, b"7")]
    assert result.next_after == 7
    fresh = ring.read_after(None)  # reading from the start also says what was dropped
    assert fresh.fell_behind
    in_time = ring.read_after(4)
    assert not in_time.fell_behind
    assert in_time.chunks == [(5, b"5"), (6, b"6"), (7, b"7")]


def test_bounded_by_bytes_keeping_the_newest_chunk(make_ring: Factory) -> None:
    ring = make_ring(max_bytes=10, max_chunks=100)
    ring.append(b"12345")
    ring.append(b"67890")
    ring.append(b"abcdefghijklmnop")  # alone larger than the bound: kept, the rest dropped
    result = ring.read_after(None)
    assert result.chunks == [(3, b"abcdefghijklmnop")]
    assert result.first_id == 3
    assert result.fell_behind


def test_binary_data_and_large_appends_are_split_exactly(make_ring: Factory) -> None:
    ring = make_ring(max_bytes=1024 * 1024)
    payload = bytes(range(256)) * ((MAX_CHUNK_BYTES * 2 + 100) // 256 + 1)
    last = ring.append(payload)
    assert last == 3
    collected = b""
    after = None
    while True:
        result = ring.read_after(after, max_bytes=MAX_CHUNK_BYTES)
        if not result.chunks:
            break
        collected += result.data
        after = result.next_after
    assert collected == payload


def test_concurrent_writers_never_reuse_an_id(make_ring: Factory) -> None:
    ring = make_ring(max_chunks=10_000, max_bytes=10_000_000)
    ids: list[int] = []
    lock = threading.Lock()

    def writer() -> None:
        mine = [ring.append(b"x") for _ in range(100)]
        with lock:
            ids.extend(mine)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(ids) == list(range(1, 401))


@pytest.mark.redis
def test_redis_buffer_is_shared_across_clients_and_expires_after_finish() -> None:
    import redis

    name = f"test-{uuid.uuid4().hex}"
    writer_client = redis.Redis.from_url(REDIS_URL)
    reader_client = redis.Redis.from_url(REDIS_URL)
    writer = RedisRingBuffer(writer_client, name, prefix="test:ring")
    reader = RedisRingBuffer(reader_client, name, prefix="test:ring")
    try:
        writer.append(b"hello")
        assert reader.read_after(None).chunks == [(1, b"hello")]
        assert 0 < writer_client.ttl(writer.keys[3]) <= 24 * 3600
        writer.finish(5)
        assert 0 < writer_client.ttl(writer.keys[3]) <= 5
    finally:
        writer.delete()
        writer_client.close()
        reader_client.close()

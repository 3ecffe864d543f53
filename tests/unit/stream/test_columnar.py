"""The range reader (smartclient/stream/columnar.py) against a scripted consumer: where a read ends, what a
loop left early leaves behind, decoding only the range.  No broker (the integration layer has the real one:
tests/integration/test_arrow_reads.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("pyarrow", minversion="19")

from smartclient import MessageDecodeError
from smartclient.core.amqp_data import data_section
from smartclient.core.delivery import Chunk
from smartclient.stream._rstream.columns import chunk_of
from smartclient.stream._rstream.frames import decode_hot
from smartclient.stream.columnar import iter_range, read_range
from tests.unit.fakes import deliver, simple


def chunk(first: int, messages: list[bytes]) -> Chunk:
    frame = decode_hot(deliver([simple(m) for m in messages], records=len(messages), first=first))
    return chunk_of(frame, "s", first, first + len(messages), 0, None)


class Consumer:
    """Hands its script's chunks (a float: a pause) to ``on_chunk`` in turn; its close waits for the chunk being
    handed over, as the real one does."""

    def __init__(self, script: list[Any], on_chunk: Any, start: int) -> None:
        self.failure, self.recovering, self.closed, self.node = None, False, False, "replica"
        self.handing: asyncio.Future[None] | None = None
        self.last: int | None = None
        self.start = start
        self.task = asyncio.ensure_future(self.run(script, on_chunk))

    @property
    def waiting_for(self) -> int:
        return self.start if self.last is None else max(self.last + 1, self.start)

    @property
    def handing_over(self) -> bool:
        return self.handing is not None

    async def run(self, script: list[Any], on_chunk: Any) -> None:
        for item in script:
            if isinstance(item, float):
                await asyncio.sleep(item)
                continue
            if callable(item):  # the member commits more
                item()
                continue
            handed = item.after(self.start - 1) if item.first_offset < self.start else item
            self.handing = asyncio.get_running_loop().create_future()
            try:
                await on_chunk(handed)
            finally:
                self.handing.set_result(None)
                self.handing = None
            self.last = item.last_offset

    async def close(self) -> None:
        if self.handing is not None:
            await self.handing
        self.task.cancel()
        self.closed = True


class Env:
    def __init__(self, script: list[Any], stats: dict[str, int], probe: list[Any] | None = None) -> None:
        self.script, self.stats, self.probe = script, stats, probe
        self.member: dict[str, int] | None = None  # the consumer's member's view, when it trails the leader's
        self.consumers: list[Consumer] = []

    async def stream_stats(self, stream: str, node: Any = None) -> dict[str, int]:
        return dict(self.member if node == "replica" and self.member is not None else self.stats)

    async def consumer(self, stream: str, callback: Any = None, *, on_chunk: Any = None, options: Any = None
                       ) -> Consumer:
        script = self.script if not self.consumers or self.probe is None else self.probe
        consumer = Consumer(script, on_chunk, options.offset.value)
        self.consumers.append(consumer)
        return consumer


def test_a_range_ends_at_its_end_and_decodes_nothing_past_it() -> None:
    env = Env([chunk(0, [data_section(b"a"), data_section(b"b"), b"raw, not amqp"])], {"committed_offset": 2})
    table = asyncio.run(read_range(env, "s", 0, 2, decode=True))
    assert table.column("body").to_pylist() == [b"a", b"b"]
    with pytest.raises(MessageDecodeError, match="offset 2"):
        asyncio.run(read_range(Env(env.script, env.stats), "s", 0, 3, decode=True))


def test_offsets_never_handed_over_end_the_read_after_a_second_look() -> None:
    # 20 to 29: offset-tracking chunks; the second consumer, from 20, is handed nothing either
    env = Env([chunk(0, [b"a"] * 10), chunk(10, [b"b"] * 10)], {"committed_offset": 29}, probe=[5.0])
    table = asyncio.run(read_range(env, "s", 0, 30, settle=0.2))
    assert table.column("offset").to_pylist() == list(range(20)) and len(env.consumers) == 2
    assert all(consumer.closed for consumer in env.consumers)


def test_a_replica_that_lags_holds_the_read_until_it_has_committed_the_range() -> None:
    env = Env([], {"committed_offset": 29}, probe=[5.0])
    env.member = {"committed_offset": 9}  # the replica has 0 to 9 only, for 1 s (three settle periods)
    env.script = [chunk(0, [b"a"] * 10), 1.0, lambda: env.member.update(committed_offset=29),  # type: ignore
                  chunk(10, [b"b"] * 10)]
    table = asyncio.run(read_range(env, "s", 0, 30, settle=0.3))
    assert table.column("offset").to_pylist() == list(range(20))


def test_a_loop_left_early_closes_the_consumer_though_its_queue_is_full() -> None:
    async def scenario() -> Consumer:
        env = Env([chunk(i * 10, [b"x"] * 10) for i in range(40)], {"committed_offset": 399})
        batches = iter_range(env, "s", 0, 400)
        async for _ in batches:
            await asyncio.sleep(0.1)  # the queue fills behind the loop
            break
        await asyncio.wait_for(batches.aclose(), 3)  # type: ignore[attr-defined]
        return env.consumers[0]

    assert asyncio.run(scenario()).closed


def test_an_empty_stream_is_an_empty_table() -> None:
    assert asyncio.run(read_range(Env([], {"committed_offset": -1, "first_chunk_id": -1}), "s", 0, None)).num_rows == 0

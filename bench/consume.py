"""bench/consume.py: consuming throughput against the machine's limit, in one run.

A stream with a leader and one replica is filled with 1,000,000 100-byte messages, with the default encoding (each
an AMQP 1.0 message of one data section, 105 bytes); then every reader reads it from the first offset, from the
replica (where smartclient's placement goes too), so they differ only in the client.  Each round runs, in an order
that turns from round to round:

* **raw reader**: one connection counting the records of each Deliver frame from its header, granting a credit
  per chunk, decoding nothing (bench/raw_frames.py): the limit;
* **rstream**: its ``Consumer`` with a plain callback counting messages;
* **smartclient per message**: ``env.consumer(stream, callback)``, the same callback;
* **smartclient chunks**: ``env.consumer(stream, on_chunk=...)`` counting ``len(chunk.bodies)`` (the bodies split
  out of each chunk, as an application that reads them needs);
* **smartclient to_arrow**: the chunk consumer again, counting ``chunk.to_arrow().num_rows`` (each chunk as a
  RecordBatch whose body column is a view over the frame);
* **smartclient read_arrow**: ``env.iter_arrow(stream, 0, MESSAGES)``, counting each batch's rows: the range read,
  with its queue between the consumer and the loop;
* the two smartclient readers again on a second such stream filled with ``encoding="raw"`` (the bodies alone):
  what handing back the body of a data section costs, in the same sitting (not part of the verdict).

A rate runs from the first message (or chunk) delivered to the last, so connection set-up does not blur it.

Targets (issue 21): the per-message consumer at 1.5x rstream's or more, and the chunk API at 0.3 of the raw
reader or more (medians of the rounds' own ratios); (issue 33) Arrow reads (``read_arrow``) at 0.6 of the raw
reader or more.
Run from the repository root with the test bed up (./dev demo): python bench/consume.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from typing import Any

from raw_frames import raw_read

from smartclient import Environment
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams, stream_members

MESSAGES = 1_000_000
ROUNDS = 5
PER_MESSAGE_TARGET = 1.5
CHUNK_TARGET = 0.3
ARROW_TARGET = 0.6


async def fill(bed: LocalTestBed, stream: str, encoding: str = "amqp") -> None:
    node = bed.nodes[0]
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        producer = await env.producer(stream, encoding=encoding)
        for _ in range(MESSAGES // 1000):
            await producer.send_many([b"x" * 100] * 1000)
        await producer.flush()


def counter() -> tuple[Any, asyncio.Event, list[float]]:
    """A plain callback counting messages, with the times of the first and the last."""
    done = asyncio.Event()
    clock = [0.0, 0.0]
    count = 0

    def on_message(message: Any, context: Any) -> None:
        nonlocal count
        count += 1
        if count == 1:
            clock[0] = time.perf_counter()
        elif count == MESSAGES:
            clock[1] = time.perf_counter()
            done.set()

    return on_message, done, clock


def replica_node(bed: LocalTestBed, stream: str) -> Any:
    _, replicas = stream_members(bed, stream)
    (replica,) = replicas  # the stream's only replica, where smartclient's placement goes too
    return bed.node_by_advertised(replica.host, replica.port)


async def raw_reader(bed: LocalTestBed, stream: str) -> float:
    node = replica_node(bed, stream)
    return await raw_read(bed, node.host, node.stream_port, stream, MESSAGES)


async def rstream_consume(bed: LocalTestBed, stream: str) -> float:
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType

    node = replica_node(bed, stream)
    on_message, done, clock = counter()
    async with Consumer(node.host, node.stream_port, username=bed.username, password=bed.password) as consumer:
        await consumer.subscribe(stream, on_message,
                                 offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await done.wait()
        return (MESSAGES - 1) / (clock[1] - clock[0])


async def smartclient_consume(bed: LocalTestBed, stream: str) -> float:
    node = bed.nodes[0]
    on_message, done, clock = counter()
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        consumer = await env.consumer(stream, on_message, offset="first")
        await done.wait()
        rate = (MESSAGES - 1) / (clock[1] - clock[0])
        assert consumer.node != (await env.topology(stream)).leader  # on a replica
        return rate


async def chunk_rate(bed: LocalTestBed, stream: str, count_of: Any) -> float:
    """A chunk consumer's msg/s, ``count_of(chunk)`` messages counted from each chunk."""
    node = bed.nodes[0]
    done = asyncio.Event()
    clock = [0.0, 0.0]
    count = 0

    def on_chunk(chunk: Any) -> None:
        nonlocal count
        if not count:
            clock[0] = time.perf_counter()
        count += count_of(chunk)
        if count >= MESSAGES and not done.is_set():
            clock[1] = time.perf_counter()
            done.set()

    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        consumer = await env.consumer(stream, on_chunk=on_chunk, offset="first")
        await done.wait()
        assert consumer.node != (await env.topology(stream)).leader  # on a replica
        return count / (clock[1] - clock[0])


async def smartclient_chunks(bed: LocalTestBed, stream: str) -> float:
    return await chunk_rate(bed, stream, lambda chunk: len(chunk.bodies))


async def smartclient_to_arrow(bed: LocalTestBed, stream: str) -> float:
    return await chunk_rate(bed, stream, lambda chunk: chunk.to_arrow().num_rows)


async def smartclient_read_arrow(bed: LocalTestBed, stream: str) -> float:
    node = bed.nodes[0]
    count, first = 0, 0.0
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        async for batch in env.iter_arrow(stream, 0, MESSAGES):
            if not count:
                first = time.perf_counter()
            count += batch.num_rows
        return count / (time.perf_counter() - first)


async def main() -> int:
    bed = LocalTestBed.from_env()
    bed.up()
    stream = f"bench-consume-{uuid.uuid4().hex[:8]}"
    raw_stream = f"{stream}-raw"
    await create_stream_led_by(bed, stream, 0, size=2)
    await create_stream_led_by(bed, raw_stream, 0, size=2)

    async def per_message_raw(bed: LocalTestBed, _: str) -> float:
        return await smartclient_consume(bed, raw_stream)

    async def chunks_raw(bed: LocalTestBed, _: str) -> float:
        return await smartclient_chunks(bed, raw_stream)

    modes = {"raw reader": raw_reader, "rstream": rstream_consume, "smartclient per message": smartclient_consume,
             "smartclient chunks": smartclient_chunks, "smartclient to_arrow": smartclient_to_arrow,
             "smartclient read_arrow": smartclient_read_arrow, 'per message, "raw"': per_message_raw,
             'chunks, "raw"': chunks_raw}
    rates: dict[str, list[float]] = {name: [] for name in modes}
    try:
        await fill(bed, stream)
        await fill(bed, raw_stream, "raw")
        for round_no in range(ROUNDS):
            order = list(modes.items())
            order = order[round_no % len(order):] + order[:round_no % len(order)]
            for name, run in order:
                rates[name].append(await run(bed, stream))
            print(f"round {round_no + 1}: " + ", ".join(f"{name} {rates[name][-1] / 1000:.0f}k" for name in modes),
                  flush=True)
    finally:
        await delete_streams(bed, stream, raw_stream)
    print()
    limit = rates["raw reader"]
    for name in modes:
        share = statistics.median(a / b for a, b in zip(rates[name], limit, strict=True))
        print(f"median {name:<24} {statistics.median(rates[name]) / 1000:8.1f}k msg/s  {share:.3f} of the raw reader")
    per_message = statistics.median(a / b for a, b in zip(rates["smartclient per message"], rates["rstream"],
                                                          strict=True))
    chunks = statistics.median(a / b for a, b in zip(rates["smartclient chunks"], limit, strict=True))
    arrow = statistics.median(a / b for a, b in zip(rates["smartclient read_arrow"], limit, strict=True))
    ok = per_message >= PER_MESSAGE_TARGET and chunks >= CHUNK_TARGET and arrow >= ARROW_TARGET
    pairs = (("smartclient per message", 'per message, "raw"'), ("smartclient chunks", 'chunks, "raw"'))
    cost = [statistics.median(a / b for a, b in zip(rates[ours], rates[raw], strict=True)) for ours, raw in pairs]
    print(f'encoding: "amqp" / "raw" stream = {cost[0]:.2f} per message, {cost[1]:.2f} per chunk (same rounds)')
    print(f"consume: per_message_vs_rstream={per_message:.2f} target >= {PER_MESSAGE_TARGET} and "
          f"chunk_share_of_raw={chunks:.2f} target >= {CHUNK_TARGET} and arrow_share_of_raw={arrow:.2f} target >= "
          f"{ARROW_TARGET} {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

"""bench/consume.py: consuming throughput, a smartclient consumer beside a raw rstream consumer.

A stream with a leader and one replica is filled with 100-byte messages; then, alternating, a raw
rstream Consumer and a smartclient consumer (placed on a replica: the only one) read it from the first
offset, both from the same node, so the two differ only in the client.  The rate is measured
from the first message delivered to the last, so connection set-up does not blur the throughput.
The median of the rounds is reported.

Target (issue 4): smartclient at least 0.95x raw rstream.
Run from the repository root with the test bed up (./dev demo): python bench/consume.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from typing import Any

from smartclient import Environment
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams, stream_members

MESSAGES = 1_000_000
ROUNDS = 5
TARGET = 0.95


async def fill(bed: LocalTestBed, stream: str) -> None:
    node = bed.nodes[0]
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        producer = await env.producer(stream)
        for _ in range(MESSAGES):
            await producer.send(b"x" * 100)
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


async def rstream_consume(bed: LocalTestBed, stream: str) -> float:
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType

    _, replicas = stream_members(bed, stream)
    (replica,) = replicas  # the stream's only replica, where smartclient's placement goes too
    node = bed.node_by_advertised(replica.host, replica.port)
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


async def main() -> int:
    bed = LocalTestBed.from_env()
    bed.up()
    stream = f"bench-consume-{uuid.uuid4().hex[:8]}"
    await create_stream_led_by(bed, stream, 0, size=2)
    rates: dict[str, list[float]] = {"rstream": [], "smartclient": []}
    try:
        await fill(bed, stream)
        for round_no in range(ROUNDS):
            order = [("rstream", rstream_consume), ("smartclient", smartclient_consume)]
            if round_no % 2:
                order.reverse()
            for name, run in order:
                rate = await run(bed, stream)
                rates[name].append(rate)
                print(f"round {round_no + 1}: {name:<12} {rate / 1000:7.1f}k msg/s")
    finally:
        await delete_streams(bed, stream)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, value in medians.items():
        print(f"median {name:<12} {value / 1000:7.1f}k msg/s")
    ratio = medians["smartclient"] / medians["rstream"]
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"consume: consumer_ratio={ratio:.2f} target >= {TARGET} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

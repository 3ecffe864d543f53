"""bench/publish.py: publishing throughput, smartclient's per-message send() beside rstream's.

100-byte messages to a 3-node stream, all connections to the leader, every confirm awaited. Each
round runs, on a fresh stream: rstream's send() (per message; it batches internally), rstream's
send_batch() in batches of 1000, and smartclient's per-message send() followed by flush().  The
rounds alternate the order; the median of each is reported.

Target (issue 4): smartclient's send() at least as fast as rstream's send_batch(1000).
Run from the repository root with the test bed up (./dev demo): python bench/publish.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

from smartclient import Environment
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

MESSAGES = 200_000
BODY = b"x" * 100
ROUNDS = 3
TARGET = 1.0


def confirm_counter(messages: int = MESSAGES) -> tuple[Callable[[object], Awaitable[None]], asyncio.Event]:
    """rstream's confirm callback, counting, and an event set once every message is confirmed."""
    done = asyncio.Event()
    confirmed = 0

    async def on_confirm(status: object) -> None:
        nonlocal confirmed
        confirmed += 1
        if confirmed == messages:
            done.set()

    return on_confirm, done


async def rstream_send(bed: LocalTestBed, stream: str) -> float:
    from rstream import Producer

    node = bed.nodes[0]
    on_confirm, done = confirm_counter()
    async with Producer(node.host, node.stream_port, username=bed.username, password=bed.password) as producer:
        await producer.send_wait(stream, b"warm-up")
        started = time.perf_counter()
        for _ in range(MESSAGES):
            await producer.send(stream, BODY, on_publish_confirm=on_confirm)
        await done.wait()
        return MESSAGES / (time.perf_counter() - started)


async def rstream_send_batch(bed: LocalTestBed, stream: str, messages: int = MESSAGES) -> float:
    """The anchor: rstream's send_batch in batches of 1000, every confirm awaited; messages per second."""
    from rstream import Producer

    node = bed.nodes[0]
    on_confirm, done = confirm_counter(messages)
    batch = [BODY] * 1000
    async with Producer(node.host, node.stream_port, username=bed.username, password=bed.password) as producer:
        await producer.send_wait(stream, b"warm-up")
        started = time.perf_counter()
        for _ in range(messages // 1000):
            await producer.send_batch(stream, batch, on_publish_confirm=on_confirm)
        await done.wait()
        return messages / (time.perf_counter() - started)


async def smartclient_send(bed: LocalTestBed, stream: str) -> float:
    node = bed.nodes[0]
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        producer = await env.producer(stream)
        await producer.send_wait(b"warm-up")
        started = time.perf_counter()
        for _ in range(MESSAGES):
            await producer.send(BODY)
        await producer.flush()
        return MESSAGES / (time.perf_counter() - started)


async def main() -> int:
    bed = LocalTestBed.from_env()
    bed.up()
    modes: dict[str, Callable[[LocalTestBed, str], Awaitable[float]]] = {
        "rstream send()": rstream_send,
        "rstream send_batch(1000)": rstream_send_batch,
        "smartclient send()": smartclient_send,
    }
    rates: dict[str, list[float]] = {name: [] for name in modes}
    for round_no in range(ROUNDS):
        order = list(modes.items())
        order = order[round_no % len(order):] + order[:round_no % len(order)]
        for name, run in order:
            stream = f"bench-publish-{uuid.uuid4().hex[:8]}"
            await create_stream_led_by(bed, stream, 0)
            try:
                rate = await run(bed, stream)
            finally:
                await delete_streams(bed, stream)
            rates[name].append(rate)
            print(f"round {round_no + 1}: {name:<26} {rate / 1000:7.1f}k msg/s")
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print()
    for name, value in medians.items():
        print(f"median {name:<26} {value / 1000:7.1f}k msg/s")
    ratio = medians["smartclient send()"] / medians["rstream send_batch(1000)"]
    print(f"smartclient send() / rstream send() = {medians['smartclient send()'] / medians['rstream send()']:.2f}")
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"publish: send_vs_send_batch_ratio={ratio:.2f} target >= {TARGET} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

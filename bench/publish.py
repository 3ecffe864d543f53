"""bench/publish.py: publishing throughput against the machine's limit, in one run.

100-byte messages to a 3-node stream, every connection to the leader, every confirm awaited.  Each round
runs, each on a fresh stream, in an order that turns from round to round:

* **raw-frame limit**: one connection writing one pre-encoded 1000-message Publish frame in a loop and counting
  confirms from their headers (bench/raw_frames.py); it uses a few hundredths of a core, so the brokers set it.
  Its messages are what smartclient's default encoding writes: each body as an AMQP 1.0 message of one data
  section (105 bytes), so the limit and the client move the same bytes;
* **rstream** ``send_batch(1000)`` (bytes bodies: rstream writes them raw, 100 bytes);
* **smartclient** ``send()``, per message, then ``flush()`` (the per-message API), with the default encoding;
* **smartclient** ``send()`` with ``encoding="raw"`` (the body alone): the encoding's cost, in the same sitting;
* **smartclient** ``send_many(1000)`` (the batch API).

Each prints its share of the raw-frame limit of its own round; the medians over the rounds are reported.

Target (issue 21): smartclient's ``send()`` at 0.7 of the raw-frame limit or more (issue 29: with the default
encoding).
Run from the repository root with the test bed up (./dev demo): python bench/publish.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

from raw_frames import raw_publish

from smartclient import Environment
from smartclient.core.amqp_data import data_section
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

MESSAGES = 500_000
BODY = b"x" * 100
WIRE_BODY = data_section(BODY)  # what send(BODY) puts on the wire by default
ROUNDS = 5
TARGET = 0.7
LIMIT = "raw-frame limit"


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


async def raw_limit(bed: LocalTestBed, stream: str, messages: int = MESSAGES) -> float:
    node = bed.nodes[0]
    return await raw_publish(bed, node.host, node.stream_port, stream, messages, WIRE_BODY)


async def rstream_send_batch(bed: LocalTestBed, stream: str, messages: int = MESSAGES) -> float:
    """rstream's send_batch in batches of 1000, every confirm awaited; messages per second."""
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


async def smartclient_send(bed: LocalTestBed, stream: str, encoding: str = "amqp") -> float:
    node = bed.nodes[0]
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        producer = await env.producer(stream, encoding=encoding)
        await producer.send_wait(b"warm-up")
        started = time.perf_counter()
        for _ in range(MESSAGES):
            await producer.send(BODY)
        await producer.flush()
        return MESSAGES / (time.perf_counter() - started)


async def smartclient_send_raw(bed: LocalTestBed, stream: str) -> float:
    return await smartclient_send(bed, stream, "raw")


async def smartclient_send_many(bed: LocalTestBed, stream: str) -> float:
    node = bed.nodes[0]
    batch = [BODY] * 1000
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        producer = await env.producer(stream)
        await producer.send_wait(b"warm-up")
        started = time.perf_counter()
        for _ in range(MESSAGES // 1000):
            await producer.send_many(batch)
        await producer.flush()
        return MESSAGES / (time.perf_counter() - started)


async def main() -> int:
    bed = LocalTestBed.from_env()
    bed.up()
    modes: dict[str, Callable[[LocalTestBed, str], Awaitable[float]]] = {
        LIMIT: raw_limit,
        "rstream send_batch(1000)": rstream_send_batch,
        "smartclient send()": smartclient_send,
        'smartclient send() "raw"': smartclient_send_raw,
        "smartclient send_many(1000)": smartclient_send_many,
    }
    rates: dict[str, list[float]] = {name: [] for name in modes}
    shares: dict[str, list[float]] = {name: [] for name in modes}
    for round_no in range(ROUNDS):
        order = list(modes.items())
        order = order[round_no % len(order):] + order[:round_no % len(order)]
        for name, run in order:
            stream = f"bench-publish-{uuid.uuid4().hex[:8]}"
            await create_stream_led_by(bed, stream, 0)
            try:
                rates[name].append(await run(bed, stream))
            finally:
                await delete_streams(bed, stream)
        for name in modes:
            shares[name].append(rates[name][-1] / rates[LIMIT][-1])
        print(f"round {round_no + 1}: " + ", ".join(f"{name} {rates[name][-1] / 1000:.0f}k ({shares[name][-1]:.2f})"
                                                    for name in modes), flush=True)
    print()
    for name in modes:
        print(f"median {name:<28} {statistics.median(rates[name]) / 1000:7.1f}k msg/s  "
              f"{statistics.median(shares[name]):.2f} of the limit")
    send = statistics.median(shares["smartclient send()"])
    versus = statistics.median(a / b for a, b in zip(rates["smartclient send()"], rates["rstream send_batch(1000)"],
                                                     strict=True))
    print(f"smartclient send() / rstream send_batch(1000) = {versus:.2f}")
    cost = statistics.median(a / b for a, b in zip(rates["smartclient send()"], rates['smartclient send() "raw"'],
                                                   strict=True))
    print(f'encoding: send() "amqp" / send() "raw" = {cost:.2f} (the same round each time; 5 bytes more per '
          f'message on the wire)')
    print(f"publish: send_share_of_limit={send:.2f} target >= {TARGET} {'PASS' if send >= TARGET else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

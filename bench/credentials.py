"""bench/credentials.py: publish and consume throughput with OAuth2 tokens refreshed every 10 s, against a static
password, side by side in one run.

Each round runs both modes, in an order that turns from round to round, each on a fresh stream (leader and one
replica) through its own Environment:

* **password**: ``Credentials("guest", "guest")`` (the internal backend);
* **tokens**: ``TokenCredentials`` over the test bed's identity provider, tokens of 13.3 s refreshed at 3/4 of
  their lifetime (every 10 s), so a window of ``WINDOW`` seconds spans two refreshes; each refresh goes to every
  live connection (the producer's, the consumer's, the locator), on the event loop that carries the messages.

In each mode a producer ``send()``s 100-byte messages for ``WINDOW`` seconds while a consumer on the replica reads
them as they come; the publish rate counts the messages confirmed in the window, the consume rate the messages
delivered from the first to the last.  A round's ratio is tokens / password; the verdict is the median ratio of
the two rates' minimum over the rounds.

Target (issue 31): 0.95 or more.
Run from the repository root with the test bed up (./dev demo): python bench/credentials.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from typing import Any

from smartclient import Credentials, Environment, TokenCredentials
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

ROUNDS = 3
WINDOW = 22.0
LIFETIME = 40.0 / 3  # refreshed at 3/4 of it: every 10 s
TARGET = 0.95
BODY = b"x" * 100


async def run(bed: LocalTestBed, stream: str, credentials: Any) -> tuple[float, float, int]:
    """(publish rate, consume rate, token updates taken) of one window."""
    node = bed.nodes[0]
    got = 0
    first = last = 0.0

    def on_message(message: Any, context: Any) -> None:
        nonlocal got, first, last
        got += 1
        if got == 1:
            first = time.perf_counter()
        last = time.perf_counter()

    async with Environment(f"rabbitmq-stream://{node.host}:{node.stream_port}/", credentials=credentials) as env:
        producer = await env.producer(stream)
        await env.consumer(stream, on_message, offset="first")
        sent = 0
        began = time.perf_counter()
        while time.perf_counter() - began < WINDOW:
            for _ in range(1000):
                await producer.send(BODY)
            sent += 1000
        await producer.flush()
        publish = sent / (time.perf_counter() - began)
        deadline = time.monotonic() + 60
        while got < sent and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if got < sent:
            raise RuntimeError(f"the consumer read {got} of {sent} messages")
        consume = (got - 1) / (last - first)
        return publish, consume, env.streams.connector.secret_updates


async def main() -> int:
    bed = LocalTestBed.from_env()
    bed.up()
    provider = bed.tokens.provider("bench-credentials", lifetime=LIFETIME)
    modes = {"password": lambda: Credentials(bed.username, bed.password),
             "tokens": lambda: TokenCredentials(provider, refresh_at=0.75, jitter=0.0)}
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    updates: list[int] = []
    for round_no in range(ROUNDS):
        order = list(modes)
        if round_no % 2:
            order.reverse()
        for name in order:
            stream = f"bench-credentials-{uuid.uuid4().hex[:8]}"
            await create_stream_led_by(bed, stream, 0, size=2)
            try:
                publish, consume, taken = await run(bed, stream, modes[name]())
            finally:
                await delete_streams(bed, stream)
            rates[name].append((publish, consume))
            if name == "tokens":
                updates.append(taken)
        print(f"round {round_no + 1}: " + ", ".join(
            f"{name} publish {rates[name][-1][0] / 1000:.0f}k consume {rates[name][-1][1] / 1000:.0f}k msg/s"
            for name in modes) + f"; token updates taken {updates[-1]}", flush=True)
    publish_ratio = statistics.median(t[0] / p[0] for t, p in zip(rates["tokens"], rates["password"], strict=True))
    consume_ratio = statistics.median(t[1] / p[1] for t, p in zip(rates["tokens"], rates["password"], strict=True))
    print()
    for name in modes:
        print(f"median {name:<9} publish {statistics.median(r[0] for r in rates[name]) / 1000:7.1f}k msg/s, "
              f"consume {statistics.median(r[1] for r in rates[name]) / 1000:7.1f}k msg/s")
    print(f"tokens / password: publish {publish_ratio:.3f}, consume {consume_ratio:.3f}; token updates per window "
          f"{statistics.median(updates):.0f} (3 connections, 2 refreshes)")
    ratio = min(publish_ratio, consume_ratio)
    print(f"credentials: tokens_vs_password={ratio:.3f} target >= {TARGET} {'PASS' if ratio >= TARGET else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

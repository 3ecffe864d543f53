"""A slow consumer of a long stream: the credit bounds the chunks waiting in memory, whatever the strategy."""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Any

import pytest

from smartclient import ConsumerFlow, Environment
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

from ..conftest import wait_until

MESSAGES = 200_000
BODY = b"x" * 200  # 40 MB of stream


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


@pytest.mark.parametrize("flow", [ConsumerFlow(), ConsumerFlow(initial_credit=2, credit_after=0.5),
                                  ConsumerFlow(initial_credit=1, credit_after=1.0)],
                         ids=["on-start-10", "half-2", "whole-1"])
async def test_a_slow_consumer_of_a_long_stream_keeps_its_memory_flat(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, flow: ConsumerFlow
) -> None:
    bed = rabbitmq_testbed
    await create_stream_led_by(bed, rabbitmq_unique_name, 0)
    try:
        async with Environment(bed.stream_uri(bed.nodes[0].host, bed.nodes[0].stream_port)) as env:
            producer = await env.producer(rabbitmq_unique_name)
            for _ in range(MESSAGES // 10_000):
                await producer.send_many([BODY] * 10_000)
            await asyncio.wait_for(producer.flush(), 60)
            await producer.close()
            received = 0

            async def slow(message: Any, context: Any) -> None:  # an async callback that yields every message
                nonlocal received
                received += 1
                if received % 50 == 0:
                    await asyncio.sleep(0.001)
                else:
                    await asyncio.sleep(0)

            consumer = await env.consumer(rabbitmq_unique_name, slow, offset="first", flow=flow)
            await wait_until(lambda: received >= 20_000, 60, "the consumer to warm up")
            baseline, queued, rss = _rss_mb(), [], []
            started = time.monotonic()
            while received < MESSAGES:
                queued.append(consumer.queued_chunks)
                rss.append(_rss_mb())
                assert time.monotonic() - started < 180, f"{received} of {MESSAGES} after 180 s"
                await asyncio.sleep(0.05)
            growth = max(rss) - baseline
            print(f"flow {flow}: {MESSAGES} messages ({MESSAGES * len(BODY) // 2**20} MB) in "
                  f"{time.monotonic() - started:.1f} s after warm-up; chunks waiting at most {max(queued)}, "
                  f"RSS {baseline:.0f} MB then at most +{growth:.1f} MB")
            assert max(queued) <= flow.initial_credit  # the credit bounds what waits
            assert growth < 20  # flat: far below the 38 MB the stream holds
    finally:
        await delete_streams(bed, rabbitmq_unique_name)


async def test_a_super_stream_consumer_gives_its_flow_to_every_partition(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_testbed
    async with Environment(bed.stream_uri(bed.nodes[0].host, bed.nodes[0].stream_port)) as env:
        partitions = await env.create_super_stream(rabbitmq_unique_name, partitions=2)
        try:
            producer = await env.super_stream_producer(rabbitmq_unique_name, key=lambda m: str(m[-1]))
            for batch in range(10):  # many chunks in each partition
                for i in range(500):
                    await producer.send(BODY + bytes([48 + (batch * 500 + i) % 10]))
                await producer.flush()
            await producer.close()
            received, waiting = 0, []
            release = asyncio.Event()

            async def blocked(message: Any, context: Any) -> None:  # holds the first message of each partition
                nonlocal received
                received += 1
                await release.wait()

            flow = ConsumerFlow(initial_credit=1, credit_after=1.0)
            consumer = await env.super_stream_consumer(rabbitmq_unique_name, blocked, offset="first", flow=flow)
            await wait_until(lambda: received >= 2, 30, "each partition's first message")
            for _ in range(20):  # the credit is not granted while a chunk is in the callback
                waiting.append(max(c.queued_chunks for c in consumer.consumers.values()))
                await asyncio.sleep(0.05)
            release.set()
            await wait_until(lambda: received >= 5_000, 60, "every message")
            print(f"super stream, flow {flow}: chunks waiting per partition at most {max(waiting)}")
            assert set(consumer.consumers) == set(partitions)
            assert max(waiting) <= flow.initial_credit
            await consumer.close()
        finally:
            await env.delete_super_stream(rabbitmq_unique_name)

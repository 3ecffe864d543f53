"""Silent networks on the namespaced bed (issue 55): each node on its own address, reached only through the load
balancer, and a partition a silent drop inside a node's namespace (no reset, no FIN).  A connection that hears
nothing is found dead within ``ConnectionOptions.dead_after`` (10 s), not after two 60 s heartbeats; nothing
confirmed is lost; a busy connection is no false alarm."""

from __future__ import annotations

import time

import pytest

from resolvers import LoadBalancer
from smartclient import Address, ConnectionOptions, Environment
from smartclient.testing.local import LocalTestBed

from .conftest import node_index
from .test_recovery_faults import Collector, Publisher

pytestmark = pytest.mark.faults

DEAD_AFTER = ConnectionOptions().dead_after


def lb_environment(bed: LocalTestBed, **kwargs: object) -> Environment:
    host, port = bed.lb("stream")
    return Environment(bed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port)), **kwargs)  # type: ignore[arg-type]


async def test_a_consumer_whose_replica_goes_silent_finds_it_within_dead_after_and_loses_nothing(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_partitions
    async with lb_environment(bed) as env:
        await env.create_stream(rabbitmq_unique_name, {"initial-cluster-size": 3})
        collector = Collector()
        consumer = await env.consumer(rabbitmq_unique_name, collector, offset="first")
        producer = await env.producer(rabbitmq_unique_name)
        publisher = Publisher(producer).start()
        await collector.wait_for(300)
        cut = bed.nodes[node_index(bed, consumer.node)]
        assert consumer.node != producer.node  # a replica
        started = time.monotonic()
        bed.partition("cut-lb", cut.name)  # the LB's link to the consumer's node goes quiet
        deadline = started + DEAD_AFTER + 20
        while consumer.recoveries == 0:
            assert time.monotonic() < deadline, "the consumer's silent connection was never found"
            await _tick()
        recovered = time.monotonic() - started
        await collector.wait_for(len(collector.items) + 300)
        print(f"the consumer on {cut.short} recovered {recovered:.1f} s after its link went silent "
              f"(dead_after {DEAD_AFTER:g} s), on {consumer.node}")
        assert recovered < DEAD_AFTER + 3 and consumer.node != Address(*cut.advertised)
        bed.heal()
        await publisher.stop()
        await collector.wait_for(publisher.sent)
        collector.assert_no_gap(publisher.sent)
        await env.delete_stream(rabbitmq_unique_name)


async def test_an_idle_connection_that_goes_silent_is_ended_within_dead_after(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_partitions
    async with lb_environment(bed) as env:
        await env.create_stream(rabbitmq_unique_name, {"initial-cluster-size": 3})
        collector = Collector()
        consumer = await env.consumer(rabbitmq_unique_name, collector, offset="next")  # nothing comes
        cut = bed.nodes[node_index(bed, consumer.node)]
        started = time.monotonic()
        bed.partition("cut-lb", cut.name)
        deadline = started + DEAD_AFTER + 20
        while consumer.recoveries == 0:
            assert time.monotonic() < deadline, "the silent idle connection was never found"
            await _tick()
        found = time.monotonic() - started
        print(f"an idle consumer's silent connection was found and recovered in {found:.1f} s")
        assert found < DEAD_AFTER + 3  # found within dead_after, then placed again
        bed.heal()
        producer = await env.producer(rabbitmq_unique_name)
        await producer.send_wait(b"1")
        await collector.wait_for(1)
        await env.delete_stream(rabbitmq_unique_name)


async def test_a_busy_connection_is_no_false_alarm(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    """dead_after 4 s, the least: a producer and a consumer busy for 15 s (the client's event loop held by the
    publishing), then idle for 12 s, are never taken for dead."""
    bed = rabbitmq_partitions
    async with lb_environment(bed, connection=ConnectionOptions(dead_after=4)) as env:
        await env.create_stream(rabbitmq_unique_name, {"initial-cluster-size": 3})
        collector = Collector()
        consumer = await env.consumer(rabbitmq_unique_name, collector, offset="first")
        producer = await env.producer(rabbitmq_unique_name)
        publisher = Publisher(producer).start()
        started = time.monotonic()
        while time.monotonic() - started < 15:
            await _tick()
        await publisher.stop()
        await collector.wait_for(publisher.sent)
        collector.assert_no_gap(publisher.sent)
        idle = time.monotonic()
        while time.monotonic() - idle < 12:  # then idle: only heartbeats, a third of dead_after apart
            await _tick()
        assert producer.recoveries == 0 and consumer.recoveries == 0, (producer.recoveries, consumer.recoveries)
        print(f"{publisher.sent} messages in 15 s, then 12 s idle, with dead_after 4 s: no recovery")
        await env.delete_stream(rabbitmq_unique_name)


async def _tick() -> None:
    import asyncio

    await asyncio.sleep(0.1)

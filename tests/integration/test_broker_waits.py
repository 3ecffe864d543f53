"""A request the broker answers only after asking another process waits apart from the connections other work
shares (issue 32, the tail stall's cause): the broker's process of a connection waits for a stream member (a
Subscribe, QueryOffset, QueryPublisherSequence) or for the stream coordinator (a single active consumer's
Subscribe) and serves nothing else meanwhile; a member a restart has just started answers once it has
initialised, and the coordinator once it has a leader.  Here the process is held as such a one is
(``smartclient.testing.streams``), with no restart."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from smartclient import Address, Environment, PlacementPolicy, Role
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams, hold_coordinator, hold_member

from ..conftest import wait_until

HOLD = 2.5  # seconds the writer is held: under the broker's 5 s (past it, the broker closes the connection)


def uris(bed: TestBed) -> list[str]:
    return [bed.stream_uri(n.host, n.stream_port) for n in bed.nodes]


async def publish_steadily(env: Environment, stream: str, stop: asyncio.Event) -> None:
    producer = await env.producer(stream)
    while not stop.is_set():
        await producer.send_wait(b"steady")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def two_streams(bed: TestBed, first: str, second: str, leaders: tuple[int, int] = (0, 0),
                      placement: PlacementPolicy | None = None) -> AsyncIterator[tuple[Environment, str, str, str]]:
    """An Environment on ``bed`` and two new streams, led by ``leaders``; yields it, a tag and their names."""
    tag = f"held-{uuid.uuid4().hex[:6]}"
    names = f"{tag}-{first}", f"{tag}-{second}"
    for name, leader in zip(names, leaders, strict=True):
        await create_stream_led_by(bed, name, leader)
    try:
        async with Environment(uris(bed), placement=placement or PlacementPolicy()) as env:
            yield env, tag, *names
    finally:
        await delete_streams(bed, *names)


async def test_a_named_producer_asking_a_busy_writer_leaves_the_producers_on_its_connection_confirming(
        rabbitmq_testbed: TestBed) -> None:
    async with two_streams(rabbitmq_testbed, "busy", "steady") as (env, tag, busy, steady_stream):
        steady = await env.producer(steady_stream)
        confirmed: list[float] = []
        stop = asyncio.Event()

        async def publish() -> None:
            while not stop.is_set():
                await steady.send_wait(b"steady")
                confirmed.append(time.monotonic())

        publishing = asyncio.create_task(publish())
        await wait_until(lambda: len(confirmed) > 5, 10, "the steady producer's first confirms")
        await asyncio.to_thread(hold_member, rabbitmq_testbed, 0, busy, HOLD)
        started = time.monotonic()
        named = await env.producer(busy, name=f"{tag}-named")  # asks the held writer for its last publishing id
        waited = time.monotonic() - started
        stop.set()
        await publishing
        connections = {r.connection for r in env.placements() if r.role is Role.PRODUCER}
        during = [t for t in confirmed if started + 0.3 < t < started + waited - 0.3]
        print(f"the named producer waited {waited:.2f} s for the held writer; the other producer on its "
              f"connection had {len(during)} confirms meanwhile")
        assert len(connections) == 1, "the two producers were meant to share one connection"
        assert waited >= HOLD / 2, "the writer was not held: the test shows nothing"
        assert during, "the other producer on the connection got no confirm while the named one waited"
        assert await named.send_wait(b"after") is not None


async def test_an_offset_query_on_a_busy_writer_leaves_the_locator_answering(
        rabbitmq_testbed: TestBed, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="smartclient.stream.topology_cache")
    async with two_streams(rabbitmq_testbed, "busy", "other", (0, 1)) as (env, tag, busy, other):
        await env.topology(other)
        await asyncio.to_thread(hold_member, rabbitmq_testbed, 0, busy, HOLD)
        started = time.monotonic()
        query = asyncio.create_task(env.stored_offset(busy, f"{tag}-reader"))
        reads = 0
        while not query.done():
            env.streams.invalidate(other)
            await env.topology(other)  # through the locator
            reads += 1
            await asyncio.sleep(0.1)
        waited = time.monotonic() - started
        print(f"the offset query waited {waited:.2f} s for the held writer; {reads} topology reads meanwhile")
        assert await query is None  # no offset stored: answered once the writer was let go
        assert waited >= HOLD / 2, "the writer was not held: the test shows nothing"
        dropped = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
        assert not dropped, dropped


async def test_a_consumer_recovering_onto_a_member_still_initialising_leaves_its_connection_delivering(
        rabbitmq_testbed: TestBed) -> None:
    # replicas forced: with the leader as a fallback, the consumer would not wait for a replica (the next test)
    async with two_streams(rabbitmq_testbed, "busy", "steady", placement=PlacementPolicy(
            force_replica_for_consumers=True)) as (env, _tag, busy, steady_stream):
        stop = asyncio.Event()
        publishing = asyncio.create_task(publish_steadily(env, steady_stream, stop))
        arrivals: dict[int, list[float]] = {}

        def arrived(index: int) -> Callable[[Any, Any], None]:
            return lambda message, context: arrivals.setdefault(index, []).append(time.monotonic())

        moving = await env.consumer(busy, lambda message, context: None)
        # the consumers of the steady stream spread over both replicas' nodes, where the moving one recovers
        steady = [await env.consumer(steady_stream, arrived(i)) for i in range(2)]
        await wait_until(lambda: all(len(arrivals.get(i, ())) > 5 for i in range(2)), 10,
                         "the steady consumers' first messages")
        nodes = [Address(*n.advertised) for n in rabbitmq_testbed.nodes]
        # the busy stream's member there is held as one initialising is; both holds at once: one rabbitmqctl call
        # takes seconds on a loaded machine, and one after the other the first hold could end before the recovery
        # began (CI, 2026-12-02: recovered in 0.43 s, "the member was not held")
        held = [i for i in range(len(nodes)) if i != 0]  # busy's replicas' nodes (node 0 leads it)
        for _ in range(3):  # again while the calls took most of the hold (2.6 s and more under CI's whole load)
            holds = await asyncio.gather(*(asyncio.to_thread(hold_member, rabbitmq_testbed, i, busy, HOLD, "release",
                                                             True) for i in held))
            started = time.monotonic()
            # what is left of the holds now, as the nodes say (they begin somewhere inside the rabbitmqctl calls,
            # which take seconds on a loaded machine; CI, 2026-12-02: 1.5 s of the 2.5 s gone, recovered in 0.97 s)
            left = min(hold.left() for hold in holds)
            if left >= 1.2:
                break
            await asyncio.sleep(max(0.0, left) + 0.5)  # (let the holds lapse before holding again)
        recoveries = moving.recoveries
        moving.control.lost("the test: its member restarted")  # as a MetadataUpdate would
        await wait_until(lambda: moving.recoveries > recoveries, 20, "the moving consumer's recovery")
        waited = time.monotonic() - started
        stop.set()
        await publishing
        assert moving.node is not None and nodes.index(moving.node) in held, (
            f"the moving consumer recovered onto {moving.node}, where no member was held ({[nodes[i] for i in held]})")
        index = next((i for i, c in enumerate(steady) if c.node == moving.node), None)
        assert index is not None, f"no steady consumer on {moving.node}, where the moving one recovered"
        shared = {r.connection for r in env.placements() if r.role is Role.CONSUMER and r.node == moving.node}
        # what came while it recovered, less a margin each side (a quarter of the wait when that was short: under
        # load the holds may begin late, CI 2026-12-03 recovered in 0.55 s; at 20 ms a message, still a handful)
        margin = min(0.3, waited / 4)
        during = [t for t in arrivals[index] if started + margin < t < started + waited - margin]
        print(f"the moving consumer recovered onto {moving.node} in {waited:.2f} s (the member there held {left:.2f} s "
              f"more); the steady consumer on its connection received {len(during)} messages meanwhile; steps: "
              f"{moving.recovery_attempts[-1].steps}")
        assert len(shared) == 1, "the consumers on that node were meant to share one connection"
        assert waited >= min(HOLD / 2, left - 0.3), (
            f"the consumer recovered in {waited:.2f} s though its member was held {left:.2f} s more: it did not "
            f"wait on it, and the test shows nothing (steps: {moving.recovery_attempts[-1].steps})")
        assert during, (f"the steady consumer on the connection received nothing while the other recovered "
                        f"({waited:.2f} s, watched {waited - 2 * margin:.2f} s of it)")


async def test_a_consumer_recovering_while_its_replicas_initialise_reads_the_leader_then_moves_back(
        rabbitmq_testbed: TestBed) -> None:
    hold = 8.0  # seconds both replicas answer nothing, as after a restart or an election
    async with two_streams(rabbitmq_testbed, "busy", "unused") as (env, _tag, busy, _unused):
        stop = asyncio.Event()
        publishing = asyncio.create_task(publish_steadily(env, busy, stop))
        offsets: list[int] = []
        arrivals: list[float] = []

        def got(message: Any, context: Any) -> None:
            offsets.append(context.offset)
            arrivals.append(time.monotonic())

        consumer = await env.consumer(busy, got)
        await wait_until(lambda: len(offsets) > 5, 10, "the consumer's first messages")
        topology = await env.topology(busy)
        assert consumer.node in topology.replicas
        nodes = [Address(*n.advertised) for n in rabbitmq_testbed.nodes]
        held = time.monotonic()
        # both holds at once: one rabbitmqctl eval takes seconds on a loaded machine (13.8 s seen), most of it the
        # CLI starting before its eval holds the member; one after the other, the first replica was let go 0.25 s
        # into the recovery (CI, 2026-12-03)
        await asyncio.gather(*(asyncio.to_thread(hold_member, rabbitmq_testbed, nodes.index(replica), busy, hold,
                                                 "release", True) for replica in topology.replicas))
        started = time.monotonic()
        recoveries = consumer.recoveries
        consumer.control.lost("the test: its member restarted")  # as a MetadataUpdate would
        await wait_until(lambda: consumer.recoveries > recoveries, 20, "the consumer's recovery")
        recovered = time.monotonic() - started
        record = consumer.placement
        assert record is not None
        fallback_node, fallback = record.node, record.fallback
        await wait_until(lambda: any(t > started + recovered for t in arrivals), 10, "a message on the leader")
        first_message = min(t for t in arrivals if t > started) - started
        await wait_until(lambda: consumer.node in topology.replicas and not consumer.placement.fallback, 30,
                         "the consumer moving back to a replica")
        moved_back = time.monotonic() - started
        count = len(offsets)
        await wait_until(lambda: len(offsets) > count + 5, 10, "messages after the move back")
        stop.set()
        await publishing
        print(f"both replicas held {hold:.1f} s: the consumer recovered onto {fallback_node} (fallback {fallback}) "
              f"in {recovered:.2f} s, its first message {first_message:.2f} s after the loss; back on a replica "
              f"({consumer.node}) {moved_back:.2f} s after; steps: "
              f"{' / '.join(a.steps for a in consumer.recovery_attempts[-2:])}")  # (one, when the move back was quick)
        assert fallback_node == topology.leader and fallback, "it did not fall back to the leader"
        assert recovered < hold, "the consumer waited for the held replicas"
        assert started + moved_back > held + hold, "it moved back before a replica could be read"
        assert offsets == sorted(set(offsets)), "a message was handed over twice, or out of order"
        assert consumer.redelivered == 0


async def test_a_single_active_consumer_waiting_on_the_coordinator_leaves_the_plain_consumers_delivering(
        rabbitmq_testbed: TestBed) -> None:
    async with two_streams(rabbitmq_testbed, "group", "steady") as (env, tag, group, steady_stream):
        stop = asyncio.Event()
        publishing = asyncio.create_task(publish_steadily(env, steady_stream, stop))
        arrivals: dict[int, list[float]] = {0: [], 1: []}
        steady = [await env.consumer(steady_stream, lambda m, c, i=i: arrivals[i].append(time.monotonic()))
                  for i in range(2)]  # one on each replica's node
        await wait_until(lambda: all(len(a) > 5 for a in arrivals.values()), 10, "the steady consumers' messages")
        await env.topology(group)  # read now: a Metadata request waits on the coordinator too (on its node)
        node = await asyncio.to_thread(hold_coordinator, rabbitmq_testbed, HOLD)
        started = time.monotonic()
        # RabbitMQ 4.3 answers the Subscribe once the coordinator has registered it, 4.0 before; either way the
        # connection's broker process waits for the coordinator, so the window is the hold's
        single = await env.consumer(group, lambda m, c: None, name=f"{tag}-single", single_active=True)
        await asyncio.sleep(max(0.0, started + HOLD + 0.3 - time.monotonic()))
        stop.set()
        await publishing
        beside = [i for i, c in enumerate(steady) if c.node == single.node]
        during = {i: [t for t in arrivals[i] if started + 0.3 < t < started + HOLD / 2] for i in beside}
        print(f"the coordinator was held on node {node + 1}; while it was, the plain consumers on the single "
              f"active consumer's node received {[len(d) for d in during.values()]}")
        assert beside, "no plain consumer on the single active consumer's node"
        assert all(during.values()), "a plain consumer on its node received nothing while the coordinator was held"

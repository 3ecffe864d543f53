"""The fault suite: real faults on the test bed, each checked against an invariant.

* every message given to a producer ends confirmed or failed with a reason, and with a named producer
  every confirmed message is in the stream exactly once, in order (Kafka's and Jepsen's lost = dup = 0);
* consumers resume on another member with no gap (and with tracking, no duplicate);
* producers and consumers make progress again within seconds, and nothing hangs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from resolvers import DnsResolver, LoadBalancer
from smartclient import (
    Address,
    BatchingPolicy,
    Confirmation,
    Consumer,
    EnqueueTimeout,
    Environment,
    OffsetTracking,
    Producer,
    RecoveryPolicy,
    ResolutionError,
)
from smartclient.testing import TestBed
from smartclient.testing.footprint import half_closed_sockets
from smartclient.testing.streams import create_stream_led_by, delete_streams

from ..conftest import wait_until
from .conftest import all_nodes, node_index, stream_led_by

pytestmark = pytest.mark.faults


class Publisher:
    """Publishes numbered messages until stopped, and keeps the fate of each one."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.sent = 0
        self.confirmed: list[int] = []
        self.failed: list[Confirmation] = []
        self.confirm_times: list[float] = []
        self._stop = False
        self._task: asyncio.Task[None] | None = None

    def _on_confirm(self, confirmation: Confirmation) -> None:
        if confirmation.confirmed:
            self.confirmed.append(confirmation.publishing_id)
            self.confirm_times.append(time.monotonic())
        else:
            self.failed.append(confirmation)

    async def _run(self) -> None:
        while not self._stop:
            await self.producer.send(b"%d" % self.sent, on_confirm=self._on_confirm)
            self.sent += 1
            if self.sent % 50 == 0:
                await asyncio.sleep(0.002)  # a steady stream, not a flood

    def start(self) -> Publisher:
        self._task = asyncio.create_task(self._run())
        return self

    async def confirmed_after(self, moment: float, count: int = 1, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while sum(1 for t in self.confirm_times if t > moment) < count:
            assert time.monotonic() < deadline, f"no progress {timeout} s after the fault"
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self._stop = True
        assert self._task is not None
        await asyncio.wait_for(self._task, 30)
        await asyncio.wait_for(self.producer.flush(), 60)  # nothing hangs
        assert not self.failed, self.failed[:3]
        assert len(self.confirmed) == self.sent  # every message ended confirmed


class Collector:
    """A consumer callback keeping (offset, body) in order of arrival."""

    def __init__(self) -> None:
        self.items: list[tuple[int, int]] = []

    def __call__(self, message: Any, context: Any) -> None:
        self.items.append((context.offset, int(bytes(message))))

    def chunk(self, chunk: Any) -> None:  # the same, a chunk at a time (on_chunk)
        self.items.extend((offset, int(body)) for offset, body in chunk)

    def handler(self, mode: str) -> dict[str, Any]:
        """The consumer's keyword for ``mode``: a callback per message, or on_chunk."""
        return {"callback": self} if mode == "message" else {"on_chunk": self.chunk}

    def bodies(self) -> list[int]:
        return [body for _, body in self.items]

    async def wait_for(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.items) < count:
            assert time.monotonic() < deadline, f"{len(self.items)} of {count} messages after {timeout} s"
            await asyncio.sleep(0.05)

    def assert_no_gap(self, sent: int, *, no_duplicate: bool = True) -> None:
        bodies = self.bodies()
        offsets = [offset for offset, _ in self.items]
        repeated_offsets = len(offsets) - len(set(offsets))
        repeated_bodies = len(bodies) - len(set(bodies))
        where = [i for i in range(1, len(offsets)) if offsets[i] <= offsets[i - 1]][:5]
        detail = (f"{len(bodies)} received for {sent} sent; offsets delivered twice {repeated_offsets}, "
                  f"bodies stored twice {repeated_bodies - repeated_offsets}; offset went back at {where} "
                  f"{[self.items[i - 1:i + 1] for i in where]}")
        assert set(bodies) == set(range(sent)), f"a gap: {detail}"
        if no_duplicate:
            assert bodies == list(range(sent)), f"a duplicate or a reordering: {detail}"
            assert offsets == sorted(set(offsets))


async def read_stored(bed: TestBed, stream: str) -> list[int]:
    """Every body stored in ``stream``, in order.  It appends a last message (-1) and reads up to it: a
    stream delivers in order, so everything stored before it, a duplicate too, has arrived when it has."""
    collector = Collector()
    async with Environment(all_nodes(bed)) as env:
        await (await env.producer(stream)).send_wait(b"-1")
        await env.consumer(stream, collector, offset="first")
        await wait_until(lambda: collector.items and collector.items[-1][1] == -1, 30, f"the end of {stream}")
    return collector.bodies()[:-1]


async def test_leader_kill_named_producer_every_confirmed_message_once_in_order(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    async with stream_led_by(bed, rabbitmq_unique_name, 1) as stream, Environment(all_nodes(bed)) as env:
        producer = await env.producer(stream, name="kill-9")
        publisher = Publisher(producer).start()
        await publisher.confirmed_after(0, count=2000)
        killed_at = time.monotonic()
        bed.kill_node("rabbit-2")  # the leader, by PID
        await publisher.confirmed_after(killed_at, count=2000)  # publishing resumes
        await publisher.stop()
        assert producer.recoveries >= 1 and producer.node != Address(*bed.nodes[1].advertised)
        bodies = await read_stored(bed, stream)
        assert bodies == list(range(publisher.sent))  # exactly once, in order


async def test_stop_app_then_start_app_producer_and_consumer_progress(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    async with stream_led_by(bed, rabbitmq_unique_name, 0) as stream, Environment(all_nodes(bed)) as env:
        collector = Collector()
        consumer = await env.consumer(stream, collector, offset="first", name="c", tracking=OffsetTracking(every=500))
        producer = await env.producer(stream, name="p")
        publisher = Publisher(producer).start()
        await publisher.confirmed_after(0, count=500)
        for victim in (node_index(bed, consumer.node), 0):  # the consumer's node, then the leader's
            stopped_at = time.monotonic()
            name = bed.nodes[victim].name
            bed.stop_app(name)
            await publisher.confirmed_after(stopped_at, count=500)
            seen = len(collector.items)
            await collector.wait_for(seen + 200)
            bed.start_app(name)
        await publisher.stop()
        await collector.wait_for(publisher.sent)
        collector.assert_no_gap(publisher.sent)  # tracked: no duplicate either
        assert producer.recoveries >= 1 and consumer.recoveries >= 1


async def test_leader_move_producer_and_consumer_progress(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    async with stream_led_by(bed, rabbitmq_unique_name, 0) as stream, Environment(all_nodes(bed)) as env:
        collector = Collector()
        await env.consumer(stream, collector, offset="first")
        producer = await env.producer(stream, name="p")
        publisher = Publisher(producer).start()
        await publisher.confirmed_after(0, count=500)
        moved_at = time.monotonic()
        await asyncio.to_thread(bed.move_leader, stream, "rabbit-3")
        await publisher.confirmed_after(moved_at, count=500)
        await publisher.stop()
        # a recovery that read the topology while the election was open may declare the publisher on the old
        # node, which RabbitMQ accepts (it writes to the remote leader); the producer's second looks move it
        new_leader = Address(*bed.nodes[2].advertised)
        await wait_until(lambda: producer.node == new_leader, 10, "the producer to follow the leader")
        await collector.wait_for(publisher.sent)
        collector.assert_no_gap(publisher.sent)


@pytest.mark.parametrize("mode", ["message", "chunk"])
async def test_consumer_node_killed_resumes_on_another_member_without_gap_or_duplicate(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str, mode: str
) -> None:
    bed = rabbitmq_faulty_testbed
    async with stream_led_by(bed, rabbitmq_unique_name, 0) as stream, Environment(all_nodes(bed)) as env:
        collector = Collector()
        consumer: Consumer = await env.consumer(stream, **collector.handler(mode), offset="first", name="tracked",
                                                tracking=OffsetTracking(every=100))
        victim = node_index(bed, consumer.node)
        assert victim != 0  # on a replica
        publisher = Publisher(await env.producer(stream)).start()
        await collector.wait_for(1000)
        killed_at = time.monotonic()
        bed.kill_node(bed.nodes[victim].name)
        # publishing goes on (the leader is elsewhere) while the consumer recovers, and they overlap
        await wait_until(lambda: consumer.recoveries >= 1, 30, "the consumer to recover on another member")
        await publisher.confirmed_after(killed_at, count=1000)
        await publisher.stop()
        await collector.wait_for(publisher.sent)
        collector.assert_no_gap(publisher.sent)
        assert consumer.recoveries == 1 and node_index(bed, consumer.node) != victim
        await consumer.store_offset()
        assert await consumer.stored_offset() == collector.items[-1][0]


@pytest.mark.parametrize("mode", ["message", "chunk"])
async def test_untracked_consumer_connection_closed_by_management_api_recovers_without_gap(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str, mode: str
) -> None:
    bed = rabbitmq_faulty_testbed
    async with stream_led_by(bed, rabbitmq_unique_name, 2) as stream, Environment(all_nodes(bed)) as env:
        collector = Collector()
        consumer = await env.consumer(stream, **collector.handler(mode), offset="first")
        producer = await env.producer(stream, name="p")
        publisher = Publisher(producer).start()
        await collector.wait_for(500)
        for handle in (consumer, producer):
            record = handle.placement
            assert record is not None
            bed.close_connection(bed.connection_named(record.connection))
            closed_at = time.monotonic()
            await publisher.confirmed_after(closed_at, count=300)
            await collector.wait_for(len(collector.items) + 300)
        await publisher.stop()
        await collector.wait_for(publisher.sent)
        collector.assert_no_gap(publisher.sent)
        assert consumer.recoveries == 1 and producer.recoveries == 1


async def test_lb_backend_disabled_and_sessions_cut_then_lb_restarted(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    host, port = bed.lb()
    async with stream_led_by(bed, rabbitmq_unique_name, 1) as stream, Environment(
        bed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port))
    ) as env:
        collector = Collector()
        consumer = await env.consumer(stream, collector, offset="first", name="c", tracking=OffsetTracking(every=200))
        producer = await env.producer(stream, name="p")
        publisher = Publisher(producer).start()
        await collector.wait_for(300)
        # the consumer's node leaves the LB, and its sessions are cut: the consumer lands elsewhere
        victim = bed.nodes[node_index(bed, consumer.node)].name
        bed.disable_lb_backend(victim)
        bed.shutdown_lb_sessions(victim)
        await collector.wait_for(len(collector.items) + 300)
        assert consumer.node != Address(*bed.node(victim).advertised)
        bed.enable_lb_backend(victim)
        # the LB itself restarts: every session drops, everything comes back through it
        restarted_at = time.monotonic()
        bed.restart_lb()
        await publisher.confirmed_after(restarted_at, count=300)
        await collector.wait_for(len(collector.items) + 300)
        await publisher.stop()
        await collector.wait_for(publisher.sent)
        collector.assert_no_gap(publisher.sent)
        assert producer.recoveries >= 1 and consumer.recoveries >= 2
        assert producer.node == Address(*bed.nodes[1].advertised)  # still the leader, through the LB
        # every connection the LB cut has its socket closed: none is left half-closed, holding a descriptor
        # until the garbage collector finds it (rstream's close() leaves a broken connection's socket open)
        await wait_until(lambda: half_closed_sockets({port}) == 0, 10,
                         lambda: f"{half_closed_sockets({port})} socket(s) to the LB left half-closed (CLOSE_WAIT)")


TTL = 6


async def test_dns_stopped_cached_names_keep_working_until_they_expire_then_a_typed_error(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    host, port = bed.dns_address
    for i, node in enumerate(bed.nodes):  # short-lived names for this test's nodes
        bed.add_dns_record(f"n{i}-{rabbitmq_unique_name}.smartclient.test", "A", node.host, ttl=TTL)
    names = {Address(*node.advertised): Address(f"n{i}-{rabbitmq_unique_name}.smartclient.test", node.stream_port)
             for i, node in enumerate(bed.nodes)}

    class Renamed(DnsResolver):  # advertised localhost:port -> a DNS name -> its A record
        async def resolve(self, address: Address) -> Address:
            return await super().resolve(names.get(address, address))

    resolver = Renamed([host], port=port, timeout=0.5)
    policy = RecoveryPolicy(max_time=3.0, initial_delay=0.2)
    async with stream_led_by(bed, rabbitmq_unique_name, 0) as stream, Environment(
        all_nodes(bed), resolver=resolver, recovery=policy
    ) as env:
        producer = await env.producer(stream, name="p")
        resolved_at = time.monotonic()
        await producer.send_wait(b"0")
        connection = bed.connection_named(producer.placement.connection)  # type: ignore[union-attr]
        bed.stop_dns()
        bed.close_connection(connection)
        await producer.send_wait(b"1")  # recovered with the cached answer
        assert producer.recoveries == 1 and time.monotonic() - resolved_at < TTL
        # the scenario, not a wait: the cached answers must grow older than their TTL
        await asyncio.sleep(resolved_at + TTL + 0.2 - time.monotonic())
        with pytest.raises(ResolutionError, match=r"smartclient\.test"):  # a new connection needs DNS now
            # (a consumer: its replica has no connection yet; a second producer would share the leader's)
            await env.consumer(stream, lambda message, context: None)
        bed.close_connection(bed.connection_named(producer.placement.connection))  # type: ignore[union-attr]
        await wait_until(lambda: producer.failure, 10, "the producer to give up")
        assert "ResolutionTimeout" in str(producer.failure)


BURN = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end:\n    pass\n"  # bounded


async def test_each_recovery_attempt_ends_within_attempt_time_on_a_loaded_machine(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    """A leader kill -9 under a named producer while two CPU burners load both cores: every recovery attempt
    ends within RecoveryPolicy.attempt_time plus a small margin, and its log gives every step's time."""
    import subprocess
    import sys

    bed = rabbitmq_faulty_testbed
    policy = RecoveryPolicy(attempt_time=2.0)
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(2)]
    try:
        async with stream_led_by(bed, rabbitmq_unique_name, 1) as stream, Environment(
            all_nodes(bed), recovery=policy
        ) as env:
            producer = await env.producer(stream, name="loaded")
            publisher = Publisher(producer).start()
            await publisher.confirmed_after(0, count=1000)
            killed_at = time.monotonic()
            bed.kill_node("rabbit-2")  # the leader, by PID
            await publisher.confirmed_after(killed_at, count=1000, timeout=60)
            await publisher.stop()
            attempts = producer.recovery_attempts
            for item in attempts:
                print(f"attempt {item.number}: {item.seconds:.2f} s, {item.outcome}; steps: {item.steps}")
            assert producer.recoveries >= 1 and attempts[-1].outcome == "recovered"
            assert all(item.seconds <= policy.attempt_time + 0.5 for item in attempts), attempts
            assert all(item.steps for item in attempts)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@pytest.mark.requires_rabbitmq("4.3", reason="ResolveOffsetSpec")
async def test_consumer_lost_before_its_first_message_misses_nothing_published_while_away(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    """A consumer subscribed with "next" starts at the offset "next" resolved to when it subscribed: recovered
    before its first message, it does not subscribe with "next" again and skip what came meanwhile."""
    bed = rabbitmq_faulty_testbed
    async with stream_led_by(bed, rabbitmq_unique_name, 0) as stream, Environment(all_nodes(bed)) as env:
        before = await env.producer(stream)
        for i in range(10):
            await before.send_wait(b"%d" % -(i + 2))  # already there: "next" is after them
        collector = Collector()
        consumer = await env.consumer(stream, collector, offset="next")
        resolved = str(consumer.offset)
        record = consumer.placement
        assert record is not None
        connection = await asyncio.to_thread(bed.connection_named, record.connection)
        producer = await env.producer(stream, name="p")
        await asyncio.to_thread(bed.close_connection, connection)
        publisher = Publisher(producer).start()  # publishing while the consumer recovers
        await wait_until(lambda: consumer.recoveries == 1, 30, "the consumer to recover")
        await publisher.confirmed_after(time.monotonic(), count=200)
        await publisher.stop()
        await collector.wait_for(publisher.sent)
        collector.assert_no_gap(publisher.sent)
        assert collector.items[0][0] == 10
        assert resolved == "offset 10"  # "next" resolved when it subscribed


async def test_confirms_that_stop_on_the_leader_make_a_named_producer_declare_again_and_store_each_message_once(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    policy = RecoveryPolicy(stall_check=1.0)
    async with stream_led_by(bed, rabbitmq_unique_name, 1) as stream, \
            Environment(all_nodes(bed), recovery=policy) as env:
        producer = await env.producer(stream, name="stalled")
        publisher = Publisher(producer).start()
        await publisher.confirmed_after(0, count=1000)
        bed.suspend_stream_member(stream, bed.nodes[1].name, 6.0)  # the leader's: the writer
        await wait_until(lambda: producer.recoveries >= 1, 20, "the stalled producer to declare its publisher again")
        resumed_at = time.monotonic()
        await publisher.confirmed_after(resumed_at, count=1000)
        await publisher.stop()
        assert producer.node == Address(*bed.nodes[1].advertised)  # it stayed on the leader
        assert await read_stored(bed, stream) == list(range(publisher.sent))  # each message once, in order


async def test_a_broker_that_stops_confirming_raises_enqueue_timeout_and_loses_nothing(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    batching = BatchingPolicy(batch_size=100, max_in_flight=2000, enqueue_timeout=1.0)
    async with stream_led_by(bed, rabbitmq_unique_name, 1) as stream, \
            Environment(all_nodes(bed), recovery=RecoveryPolicy(stall_check=0)) as env:
        producer = await env.producer(stream, name="back-pressure", batching=batching)
        confirmed: list[int] = []
        failed: list[Confirmation] = []
        accepted = 0

        def on_confirm(c: Confirmation) -> None:
            (confirmed.append(c.publishing_id) if c.confirmed else failed.append(c))

        bed.suspend_stream_member(stream, bed.nodes[1].name, 4.0)  # the leader's: the writer
        started = time.monotonic()
        with pytest.raises(EnqueueTimeout, match="no room for a message") as caught:
            while True:
                await producer.send(b"%d" % accepted, on_confirm=on_confirm)
                accepted += 1
        assert accepted == 2000 and time.monotonic() - started >= 1.0  # the cap, then the timeout
        assert caught.value.queued == 0
        await asyncio.wait_for(producer.flush(), 30)  # the writer resumes: everything accepted is confirmed
        assert not failed and sorted(confirmed) == list(range(1, accepted + 1))
        assert await read_stored(bed, stream) == list(range(accepted))  # nothing refused was stored


async def test_a_consumer_on_a_replica_that_lags_behind_its_offset_gets_nothing_before_it(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    """A replica whose log ends before the offset asked for attaches the reader at its own end; the chunks
    it then catches up on lie before that offset.  None of their messages may reach the callback (rstream
    dropped them from the first chunk only: the 1,897 offsets a tracked consumer got again in the nemesis)."""
    bed = rabbitmq_faulty_testbed
    await create_stream_led_by(bed, rabbitmq_unique_name, 0, size=2)  # one replica: consumers go there
    stream = rabbitmq_unique_name
    try:
        async with Environment(all_nodes(bed)) as env:
            producer = await env.producer(stream)
            await producer.send_batch([b"%d" % i for i in range(100)])
            rows = await asyncio.to_thread(bed.stream_status, stream)
            replica = next(r["node"] for r in rows if r.get("role") == "replica")
            index = [n.name for n in bed.nodes].index(replica)
            await wait_until(lambda: bed.stream_status(stream) and all(  # the replica holds the first 100
                r.get("offset", -1) >= 99 for r in bed.stream_status(stream)), 30, "the replica to catch up")
            await asyncio.to_thread(bed.suspend_stream_member, stream, replica, 4.0)
            for i in range(100, 160):  # one chunk each, stored on the leader only (a quorum of 2 needs both:
                await producer.send(b"%d" % i)  # they are confirmed once the replica is back)
                await asyncio.sleep(0.005)
            got: list[int] = []
            consumer = await env.consumer(stream, lambda m, c: got.append(c.offset), offset=140)
            assert consumer.node == Address(*bed.nodes[index].advertised)  # on the lagging replica
            await asyncio.wait_for(producer.flush(), 30)
            await wait_until(lambda: got and got[-1] >= 159, 30, "the consumer to reach offset 159")
            assert got == list(range(140, 160)), f"offsets before 140 reached the callback: {got[:10]}"
    finally:
        bed.heal()
        await delete_streams(bed, stream)


async def test_a_consumer_that_gets_nothing_while_its_stream_moves_on_subscribes_again(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    async with stream_led_by(bed, rabbitmq_unique_name, 0) as stream, \
            Environment(all_nodes(bed), recovery=RecoveryPolicy(stall_check=1.0)) as env:
        collector = Collector()
        consumer = await env.consumer(stream, collector, offset="first")
        producer = await env.producer(stream, name="p")
        await producer.send_many([b"%d" % i for i in range(100)])
        await producer.flush()
        await collector.wait_for(100)
        silent = consumer.node
        assert node_index(bed, silent) != 0  # on a replica
        # its replica stops taking chunks for 12 s: the leader and the other replica commit without it, and the
        # consumer's subscription there hands over nothing (the silent subscription of issue 18, made on purpose)
        bed.suspend_stream_member(stream, bed.nodes[node_index(bed, silent)].name, 12.0)
        await producer.send_many([b"%d" % i for i in range(100, 200)])
        await producer.flush()
        started = time.monotonic()
        await collector.wait_for(200, timeout=10)  # well before the replica resumes
        print(f"the silent consumer subscribed again on {consumer.node} and had every message "
              f"{time.monotonic() - started:.1f} s after the publish (stall_check 1 s)")
        # (its deliveries may come before the recovery is counted: the count follows the subscription's last step)
        await wait_until(lambda: consumer.recoveries >= 1, 5, "the consumer's recovery counted")
        assert consumer.node != silent
        collector.assert_no_gap(200)


async def test_a_connection_without_streams_that_the_broker_closes_leaves_the_connector(
    rabbitmq_testbed: TestBed,
) -> None:
    """rstream tells its closed handler only of a connection with streams on it; one with none (its streams
    moved away, or never placed) ended unseen, and the connector kept it as open, with its client: the 2-hour
    soak's connections went from 5 to 18, their sockets closed (issue 32)."""
    bed = rabbitmq_testbed
    node = bed.nodes[0]
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        conn = await env.streams.connector.dial(Address(*node.advertised), "streamless")
        assert conn in env.streams.connector.connections and not conn.closed
        bed.close_connection(await asyncio.to_thread(bed.connection_named, conn.name))
        connector = env.streams.connector
        await wait_until(lambda: conn not in connector.connections, 10,
                         lambda: f"the closed connection to leave the connector ({len(connector.connections)})")
        assert conn.closed

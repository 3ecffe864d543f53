"""Losses the broker does not report: a producer recovered from a leader change checks the leader again once
the election settled, and a producer whose confirms stop looks again, then declares its publisher again.
No broker."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from smartclient import Address, ConnectionFailed, RecoveryPolicy
from smartclient.core.retry import Backoff
from smartclient.core.topology import Candidates, Role, StreamTopology
from smartclient.stream.handles import Producer
from smartclient.stream.host import PlacementRecord
from smartclient.stream.unreported import confirm_leader, watch_confirms, watch_deliveries
from tests.unit.fakes import Clock, FakeConsumer

NOW = Backoff.steady(0.0)  # the looks after a recovery, without their waits


class FakeHost:
    recovery = RecoveryPolicy()

    def __init__(self, node: Address, leader: Address) -> None:
        self.node, self.leader = node, leader
        self.dropped = 0

    def drop_topology(self, stream: str) -> None:
        self.dropped += 1

    async def topology(self, stream: str) -> StreamTopology:
        return StreamTopology(stream, self.leader, ())

    @staticmethod
    def of(producer: Producer) -> Any:
        return producer._host

    def placement_of(self, carrier: Any, stream: str) -> PlacementRecord | None:
        return PlacementRecord(Role.PRODUCER, stream, "p", self.node, self.node, "c-1")


def _producer(host: FakeHost) -> tuple[Producer, list[str]]:
    producer = Producer(host, object(), "s", "p")  # type: ignore[arg-type]
    losses: list[str] = []
    producer._lost = losses.append  # type: ignore[method-assign]
    return producer, losses


async def test_landed_on_the_old_leader_it_moves_again() -> None:
    host = FakeHost(node=Address("n1", 5552), leader=Address("n3", 5552))
    producer, losses = _producer(host)
    await confirm_leader(producer, host, NOW, looks=1)
    assert losses == ["the leader moved to n3:5552 while it was recovering"] and host.dropped == 1


async def test_on_the_leader_it_stays_and_a_closed_producer_is_left_alone() -> None:
    host = FakeHost(node=Address("n3", 5552), leader=Address("n3", 5552))
    producer, losses = _producer(host)
    await confirm_leader(producer, host, NOW, looks=2)
    assert losses == [] and host.dropped == 2
    producer.closed = True
    host.leader = Address("n1", 5552)
    await asyncio.wait_for(confirm_leader(producer, host, NOW, looks=1), 1)
    assert losses == []


class FakeBuffer:
    def __init__(self) -> None:
        self.confirmed = self.failed = 0
        self.in_flight = 5
        self.suspended = False


async def _watch_until(producer: Producer, clock: Clock, buffer: FakeBuffer, losses: list[str], seconds: float,
                       confirm: bool = False) -> None:
    producer._buffer = buffer  # type: ignore[assignment]
    task = asyncio.create_task(watch_confirms(producer, FakeHost.of(producer), 0.004, now=clock))
    try:
        while clock.now < seconds:
            await asyncio.sleep(0.001)
            clock.now += 0.001
            if confirm:
                buffer.confirmed += 1
    finally:
        task.cancel()


async def test_confirms_that_stop_make_it_look_again_and_move_off_a_node_that_no_longer_leads() -> None:
    host = FakeHost(node=Address("n1", 5552), leader=Address("n3", 5552))
    producer, losses = _producer(host)
    await _watch_until(producer, Clock(), FakeBuffer(), losses, 0.1)
    assert losses and losses[0].startswith("the leader moved to n3:5552 without a MetadataUpdate (no confirm for")


async def test_on_the_leader_three_looks_then_the_publisher_is_declared_again() -> None:
    host = FakeHost(node=Address("n3", 5552), leader=Address("n3", 5552))
    producer, losses = _producer(host)
    await _watch_until(producer, Clock(), FakeBuffer(), losses, 0.1)
    assert host.dropped >= 2 and losses and losses[0].endswith("the publisher is declared again")


async def test_confirms_that_keep_coming_or_nothing_pending_mean_no_look() -> None:
    host = FakeHost(node=Address("n1", 5552), leader=Address("n3", 5552))
    producer, losses = _producer(host)
    await _watch_until(producer, Clock(), FakeBuffer(), losses, 0.03, confirm=True)
    idle = FakeBuffer()
    idle.in_flight = 0
    await _watch_until(producer, Clock(), idle, losses, 0.03)
    assert losses == [] and host.dropped == 0


async def test_an_unnamed_producer_only_looks_since_sending_again_could_store_twice() -> None:
    host = FakeHost(node=Address("n3", 5552), leader=Address("n3", 5552))
    producer = Producer(host, object(), "s", None)  # type: ignore[arg-type]
    losses: list[str] = []
    producer._lost = losses.append  # type: ignore[method-assign]
    await _watch_until(producer, Clock(), FakeBuffer(), losses, 0.1)
    assert losses == [] and host.dropped >= 3


class StatsHost:
    recovery = RecoveryPolicy()

    def __init__(self, committed: int, error: Exception | None = None) -> None:
        self.committed, self.looks, self.error = committed, 0, error

    async def committed_chunk_id(self, stream: str) -> int:
        self.looks += 1
        if self.error is not None:
            raise self.error
        return self.committed


async def _deliveries(consumer: FakeConsumer, host: StatsHost, seconds: float, deliver: bool = False,
                      at: tuple[float, int] | None = None) -> None:  # at: (when, a new committed chunk id)
    clock = Clock()
    task = asyncio.create_task(watch_deliveries(consumer, host, 0.004, now=clock))  # type: ignore[arg-type]
    try:
        while clock.now < seconds:
            await asyncio.sleep(0.001)
            clock.now += 0.001
            if deliver and consumer.waiting_for is not None:
                consumer.waiting_for += 1
            if at is not None and clock.now >= at[0]:
                host.committed = at[1]
    finally:
        task.cancel()


async def test_a_silent_consumer_behind_the_committed_tail_subscribes_again() -> None:
    consumer, host = FakeConsumer(waiting_for=100), StatsHost(committed=120)
    await _deliveries(consumer, host, 0.2, at=(0.1, 130))
    assert consumer.losses and consumer.losses[0].startswith("nothing delivered for")
    assert "committed messages at offset 120" in consumer.losses[0]
    # the new subscription brought nothing: that chunk is not acted on twice, a later one is
    assert len(consumer.losses) == 2 and "offset 130" in consumer.losses[1]


async def test_each_resubscription_is_logged_with_its_kind_and_facts(caplog: pytest.LogCaptureFixture) -> None:
    from smartclient.stream import unreported

    consumer, host = FakeConsumer(waiting_for=100), StatsHost(committed=120)
    with caplog.at_level(logging.INFO, logger=unreported.__name__):
        await _deliveries(consumer, host, 0.05)
    records = [r for r in caplog.records if hasattr(r, unreported.WATCH_RECORD)]
    assert records and getattr(records[0], unreported.WATCH_RECORD) == "rescue"
    facts = getattr(records[0], unreported.WATCH_FACTS)
    assert {k: facts[k] for k in ("stream", "node", "waiting_for", "committed")} == {
        "stream": "s", "node": "localhost:5552", "waiting_for": 100, "committed": 120}
    assert facts["silent"] >= 0  # (a fake clock)


async def test_an_offset_tracking_chunk_at_the_tail_costs_one_resubscription_at_most() -> None:
    consumer, host = FakeConsumer(waiting_for=121), StatsHost(committed=121)  # a store wrote a chunk at 121
    await _deliveries(consumer, host, 0.3)
    assert len(consumer.losses) == 1 and "waiting for offset 121" in consumer.losses[0]


async def test_a_broker_without_stream_statistics_ends_the_watch() -> None:
    from smartclient import FeatureNotSupported

    consumer, host = FakeConsumer(waiting_for=100), StatsHost(0, FeatureNotSupported("no StreamStats"))
    await _deliveries(consumer, host, 0.1)
    assert consumer.losses == [] and host.looks == 1


async def test_a_consumer_at_the_tail_of_an_idle_stream_only_looks_and_spaces_its_looks_out() -> None:
    consumer, host = FakeConsumer(waiting_for=121), StatsHost(committed=120)  # the last chunk started at 120
    await _deliveries(consumer, host, 0.2)
    assert consumer.losses == [] and 1 <= host.looks <= 0.2 / 0.004 / 8 + 3  # every 8th period, once idle


async def test_no_look_while_messages_come_a_chunk_is_in_the_callback_or_the_start_is_unknown() -> None:
    host = StatsHost(committed=10_000)
    await _deliveries(flowing := FakeConsumer(waiting_for=100), host, 0.05, deliver=True)
    busy = FakeConsumer(waiting_for=100)
    busy.handing_over = True
    await _deliveries(busy, host, 0.05)
    inactive = FakeConsumer(waiting_for=100)
    inactive.active = False  # a single active consumer that is not the active one
    await _deliveries(inactive, host, 0.05)
    await _deliveries(unknown := FakeConsumer(waiting_for=None), host, 0.05)  # 'next' before any delivery
    assert flowing.losses == busy.losses == inactive.losses == unknown.losses == [] and host.looks == 0


class FallbackHost:
    """A consumer on the leader n1 of stream s (replicas n2, n3 named once ``replicas`` is set); ``ready``: the
    members that can be read."""

    recovery = RecoveryPolicy()

    def __init__(self) -> None:
        self.replicas: tuple[Address, ...] = ()
        self.ready: set[Address] = set()
        self.asked: list[tuple[Address, ...]] = []
        self.reads = 0

    def drop_topology(self, stream: str) -> None:
        pass

    async def topology(self, stream: str) -> StreamTopology:
        self.reads += 1
        return StreamTopology(stream, Address("n1", 5552), self.replicas)

    async def ready_member(self, stream: str, candidates: Candidates) -> Address:
        self.asked.append(candidates.all)
        for node in candidates.all:
            if node in self.ready:
                return node
        raise ConnectionFailed("not ready")


async def test_a_consumer_on_a_fallback_moves_back_once_a_first_choice_can_be_read() -> None:
    from smartclient.stream.unreported import move_back

    consumer, host = FakeConsumer(None), FallbackHost()
    consumer.node, consumer.role = Address("n1", 5552), Role.CONSUMER  # type: ignore[assignment,attr-defined]
    task = asyncio.create_task(move_back(consumer, host, Backoff.steady(0.001), looks=50))  # type: ignore[arg-type]
    while host.reads < 2:
        await asyncio.sleep(0)
    assert consumer.losses == [] and host.asked == []  # no replica named yet: nothing to ask
    host.replicas = (Address("n2", 5552), Address("n3", 5552))
    await asyncio.sleep(0.02)
    assert consumer.losses == [] and host.asked  # named, but none can be read yet: asked, and waited for
    host.ready = {Address("n3", 5552)}
    await asyncio.wait_for(task, 1)
    assert consumer.losses == ["moving back to n3:5552, a first choice that can be read again"]
    assert set(host.asked[-1]) == {Address("n2", 5552), Address("n3", 5552)}  # the first choices only


async def test_a_consumer_on_a_first_choice_or_closed_or_recovering_stays() -> None:
    from smartclient.stream.unreported import move_back

    host = FallbackHost()
    host.replicas, host.ready = (Address("n2", 5552),), {Address("n2", 5552)}
    consumer = FakeConsumer(None)
    consumer.node, consumer.role = Address("n2", 5552), Role.CONSUMER  # type: ignore[assignment,attr-defined]
    await asyncio.wait_for(move_back(consumer, host, NOW, looks=3), 1)  # type: ignore[arg-type]
    consumer.node, consumer.recovering = Address("n1", 5552), True  # type: ignore[assignment]
    await asyncio.wait_for(move_back(consumer, host, NOW, looks=3), 1)  # type: ignore[arg-type]
    consumer.recovering, consumer.closed = False, True
    await asyncio.wait_for(move_back(consumer, host, NOW, looks=3), 1)  # type: ignore[arg-type]
    assert consumer.losses == [] and host.asked == []


async def test_a_consumer_of_a_stream_with_no_replica_stops_looking() -> None:
    from smartclient.stream.unreported import MOVE_BACK_ALONE, move_back

    consumer, host = FakeConsumer(None), FallbackHost()
    consumer.node, consumer.role = Address("n1", 5552), Role.CONSUMER  # type: ignore[assignment,attr-defined]
    await asyncio.wait_for(move_back(consumer, host, NOW, looks=50), 1)  # type: ignore[arg-type]
    assert host.reads == MOVE_BACK_ALONE and consumer.losses == [] and host.asked == []


class SharedHost(StatsHost):
    """A host whose watches tick every millisecond (a stall_check of 4 ms), and whose committed chunk reads wait
    for ``gate`` while it is set."""

    recovery = RecoveryPolicy(stall_check=0.004)

    def __init__(self, committed: int) -> None:
        super().__init__(committed)
        self.gate: asyncio.Event | None = None

    async def committed_chunk_id(self, stream: str) -> int:
        if self.gate is not None:
            await self.gate.wait()
        return await super().committed_chunk_id(stream)


def _ticking() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t.get_coro().__qualname__.startswith("_Watches.")}  # type: ignore[union-attr]


async def test_the_watches_of_a_host_share_one_task_that_ends_with_the_last_of_them() -> None:
    from smartclient.stream.unreported import DeliveryWatch, watch

    host = SharedHost(committed=120)
    consumers = [FakeConsumer(waiting_for=100, stream=f"s{i}") for i in range(50)]
    watches = [watch(c, host, DeliveryWatch) for c in consumers]  # type: ignore[arg-type]
    assert len(_ticking()) == 1
    await _until(lambda: all(c.losses for c in consumers))  # each silent consumer was found, by the one task
    for consumer in consumers:
        consumer.closed = True
    await _until(lambda: not _ticking())
    assert all(w.over for w in watches)
    watch(later := FakeConsumer(waiting_for=100), host, DeliveryWatch)  # type: ignore[arg-type]
    assert len(_ticking()) == 1  # a new one starts it again
    await later.close()
    await _until(lambda: not _ticking())


async def _until(condition: Any, seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "not within the deadline"
        await asyncio.sleep(0.001)


async def test_a_watch_making_a_look_is_not_ticked_again_and_its_cancel_ends_the_look() -> None:
    from smartclient.stream.unreported import DeliveryWatch, watch

    host = SharedHost(committed=120)
    host.gate = asyncio.Event()  # the read hangs
    consumer = FakeConsumer(waiting_for=100)
    made = watch(consumer, host, DeliveryWatch)  # type: ignore[arg-type]
    await _until(lambda: made._making is not None)
    looking = made._making
    await asyncio.sleep(0.03)  # about 30 ticks
    assert made._making is looking and host.looks == 0 and consumer.losses == []
    made.cancel()  # what the handle's close does
    await _until(lambda: looking is not None and looking.done())
    assert looking is not None and looking.cancelled() and made.over
    await _until(lambda: not _ticking())


async def test_a_look_that_fails_ends_its_own_watch_and_says_so_and_the_others_go_on(
        caplog: pytest.LogCaptureFixture) -> None:
    from smartclient.stream.unreported import DeliveryWatch, watch

    class Broken(FakeConsumer):
        @property
        def node(self) -> str:  # read when a look acts: a bug there
            raise RuntimeError("a bug")

        @node.setter
        def node(self, value: str) -> None:
            pass

    host = SharedHost(committed=120)
    broken, sound = Broken(waiting_for=100), FakeConsumer(waiting_for=100, stream="t")
    with caplog.at_level(logging.ERROR, logger="smartclient.stream.unreported"):
        first = watch(broken, host, DeliveryWatch)  # type: ignore[arg-type]
        watch(sound, host, DeliveryWatch)  # type: ignore[arg-type]
        await _until(lambda: first.over and bool(sound.losses))
    assert broken.losses == [] and "its watch failed" in caplog.text and "a bug" in caplog.text
    sound.closed = True
    await _until(lambda: not _ticking())


async def test_a_tick_that_fails_ends_its_own_watch_and_the_last_watch_to_leave_stops_the_task_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    from smartclient.stream.unreported import DeliveryWatch, watch

    class Odd(FakeConsumer):
        @property
        def waiting_for(self) -> int:  # read at every tick: a bug there
            raise RuntimeError("a tick's bug")

        @waiting_for.setter
        def waiting_for(self, value: int | None) -> None:
            pass

    host = SharedHost(committed=120)
    odd, sound = Odd(), FakeConsumer(waiting_for=100, stream="t")
    with caplog.at_level(logging.ERROR, logger="smartclient.stream.unreported"):
        first = watch(odd, host, DeliveryWatch)  # type: ignore[arg-type]
        second = watch(sound, host, DeliveryWatch)  # type: ignore[arg-type]
        await _until(lambda: first.over and bool(sound.losses))
    assert "a tick's bug" in caplog.text and len(_ticking()) == 1
    second.cancel()  # what the handle's close does: the task goes now, not at its next tick
    await asyncio.sleep(0)
    assert not _ticking()


def test_a_loop_that_ends_with_watches_left_keeps_nothing_of_their_host() -> None:
    import gc
    import weakref

    from smartclient.stream.unreported import _WATCHES, DeliveryWatch, watch

    async def scenario() -> weakref.ref[SharedHost]:
        host = SharedHost(committed=120)
        watch(FakeConsumer(waiting_for=100), host, DeliveryWatch)  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        return weakref.ref(host)  # (the loop ends with the watch still there: asyncio.run cancels its task)

    gone = asyncio.run(scenario())
    gc.collect()
    assert gone() is None and not [h for h in _WATCHES if isinstance(h, SharedHost)]

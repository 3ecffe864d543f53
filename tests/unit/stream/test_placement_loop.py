"""The one placement loop (smartclient.core.landing.Placement), driven by each protocol's shell with a fake
dialer: the stream connector (async, the node read from the Open response) and the node placer of AMQP and
MQTT (sync, the node read from the management API).  No broker."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest

from smartclient import Address, ConnectionFailed, NodeUnreachable, RetryPolicy, StreamTopology
from smartclient.core.broker_nodes import BrokerNode
from smartclient.core.landing import Dial, Done, GiveUp, Keep, KeptList, Placement
from smartclient.core.settings import Credentials, PoolLimits
from smartclient.core.shared import Shared
from smartclient.core.topology import Candidates, Role
from smartclient.node_placement import Landed, NodePlacer
from smartclient.options import ClientSettings
from smartclient.stream.connector import StreamConnector
from smartclient.stream.host import Connection
from tests.unit.fakes import FakeClient, direct_network

N1, N2, N3 = (Address(f"n{i}", 5552) for i in (1, 2, 3))
NODES = (N1, N2, N3)
LB = Address("lb", 5552)
FAST = RetryPolicy(backoff_initial=0.0, backoff_max=0.0, sticky_window=6)

Network = Callable[[Address], Address]  # what a connection aimed at a target reaches (raises when down)


def round_robin() -> Network:
    cycle = itertools.cycle(NODES)
    return lambda target: next(cycle)


def sticky(node: Address) -> Network:
    return lambda target: node


def random_lb(seed: int) -> Network:
    rng = random.Random(seed)
    return lambda target: rng.choice(NODES)


def dies_after(network: Network, node: Address, connections: int) -> Network:
    """``node`` answers the first ``connections`` connections, then is gone (killed mid-placement)."""
    count = itertools.count()

    def reach(target: Address) -> Address:
        reached = network(target)
        if reached == node and next(count) >= connections:
            raise ConnectionFailed(f"{node} is gone")
        return reached

    return reach


class FakeStreamConnector(StreamConnector):
    """The real stream shell, dialling a simulated network."""

    def __init__(self, network: Network) -> None:
        from smartclient.resolution import Resolution

        super().__init__(ClientSettings(Credentials(), "/", None), Resolution(None), retry=FAST,
                         limits=PoolLimits(idle_timeout=60))
        self.network = network

    async def dial(self, target: Address, name: str, client_class: Any = None) -> Connection:
        self.opened += 1
        return Connection(FakeClient(), self.network(target), target, f"{name}-{self.opened}")

    async def park(self, conn: Connection) -> None:
        self.parking.put(conn)


def place_stream(candidates: Candidates, network: Network) -> tuple[Address, int]:
    connector = FakeStreamConnector(network)
    conn = asyncio.run(connector.acquire(candidates, "test"))
    return conn.node, connector.opened


class FakeNodePlacer(NodePlacer[str]):
    """The real AMQP/MQTT shell (management API and dialling simulated)."""

    default_port = 5672
    name_column = "name"

    def __init__(self, protocol: str, network: Network, keep_fallbacks: bool) -> None:
        self.protocol = protocol
        super().__init__(None, settings=ClientSettings(retry=FAST))
        self.network = network
        self.keep_fallbacks = keep_fallbacks  # type: ignore[misc]
        self._nodes = [BrokerNode(f"{n.host}@localhost", {protocol: n}) for n in NODES]
        self.closed: list[str] = []

    def _open(self, target: Address, by_address: Any, name: str | None, newer_than: int = -1) -> Landed[str]:
        self.opened += 1
        reached = self.network(target)
        return Landed(f"c{self.opened}", f"{reached.host}@localhost", target, f"c{self.opened}")

    def _close(self, connection: str) -> None:
        self.closed.append(connection)


def place_node(protocol: str, keep: bool) -> Callable[[Candidates, Network], tuple[Address, int]]:
    def run(candidates: Candidates, network: Network) -> tuple[Address, int]:
        placer = FakeNodePlacer(protocol, network, keep)
        node = None if len(candidates.tiers[0]) > 1 else candidates.tiers[0][0].host
        landed = placer.place(node)
        return Address(str(landed.node).split("@")[0], 5552), placer.opened

    return run


SHELLS = {"stream": place_stream, "amqp": place_node("amqp", True), "mqtt": place_node("mqtt", False)}
LEADER = StreamTopology("s", N1, (N2, N3)).candidates(Role.PRODUCER)


def one_node(node: Address) -> Candidates:
    return Candidates("s", Role.CONNECTION, ((node,),))


@pytest.mark.parametrize("shell", SHELLS)
def test_round_robin_lb_reaches_the_node_within_one_cycle(shell: str) -> None:
    for target in NODES:
        node, opened = SHELLS[shell](one_node(target), round_robin())
        assert node == target and opened <= 3


@pytest.mark.parametrize("shell", SHELLS)
def test_random_lb_reaches_the_node_within_the_caps(shell: str) -> None:
    for seed in range(30):
        node, _ = SHELLS[shell](one_node(N3), random_lb(seed))
        assert node == N3


@pytest.mark.parametrize("shell", SHELLS)
def test_sticky_lb_gives_up_fast_and_typed(shell: str) -> None:
    with pytest.raises(NodeUnreachable, match="reached only n2:5552"):
        SHELLS[shell](one_node(N1), sticky(N2))


@pytest.mark.parametrize("shell", SHELLS)
def test_a_node_that_dies_mid_placement_is_skipped(shell: str) -> None:
    # a round-robin LB whose first node answers once, then dies: the placement still lands on n3
    node, _ = SHELLS[shell](one_node(N3), dies_after(round_robin(), N1, 1))
    assert node == N3


def test_stream_with_its_replica_missing_falls_back_to_the_leader_directly() -> None:
    consumer = StreamTopology("s", N1, (N2,)).candidates(Role.CONSUMER)
    node, opened = place_stream(consumer, direct_network(down={N2}))
    assert node == N1 and opened == 2  # the replica refused, then the leader (tier 1) is accepted


def test_stream_consumer_through_a_sticky_lb_on_the_leader_uses_the_kept_fallback() -> None:
    consumer = StreamTopology("s", N1, (N2, N3)).candidates(Role.CONSUMER)
    node, opened = place_stream(consumer, sticky(N1))
    assert node == N1 and opened <= FAST.sticky_window + 1


def test_a_kept_connection_is_reused_before_any_dial() -> None:
    connector = FakeStreamConnector(sticky(N2))
    kept = Connection(FakeClient(), N1, LB, "kept")
    connector.parking.put(kept)
    assert asyncio.run(connector.acquire(LEADER, "test")) is kept and connector.opened == 0


def test_the_plan_alone_says_every_step() -> None:
    plan: Placement[str] = Placement(LEADER, FAST)
    step = plan.start()
    assert step == Dial(N1)
    step = plan.landed(N1, LB, N2, "to-n2")
    assert isinstance(step, Keep) and step.node == N2 and not step.stale  # through the LB: not stale
    step = plan.next()
    assert isinstance(step, Dial)
    step = plan.landed(N1, N1, N3, "direct-n3")
    assert isinstance(step, Keep) and step.stale  # dialled n1 directly and n3 answered: stale topology
    assert plan.landed(N1, LB, N1, "to-n1") == Done("to-n1")
    gave_up = Placement(LEADER, RetryPolicy(max_attempts=1)).failed(N1, None, ConnectionFailed("x"))
    assert isinstance(gave_up, GiveUp)


def test_a_failed_stream_attempt_names_the_address_it_dialled() -> None:
    """The real stream shell, its resolver sending each node to a closed local port: every attempt failed, and
    each names the port it dialled (it once said "dialled ?")."""
    import socket

    from smartclient import PlacementError
    from smartclient.resolution import Resolution

    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    mapped = Address("127.0.0.1", port)
    connector = StreamConnector(ClientSettings(Credentials(), "/", None), Resolution(lambda target: mapped),
                                retry=RetryPolicy(max_attempts=3, backoff_initial=0.0, backoff_max=0.0, hedge_after=0),
                                limits=PoolLimits(idle_timeout=60))
    with pytest.raises(PlacementError) as caught:
        asyncio.run(connector.acquire(one_node(N1), "test"))
    attempts = caught.value.attempts
    assert len(attempts) == 3 and all(a.dialled == mapped and a.target == N1 for a in attempts)
    assert f"dialled 127.0.0.1:{port} for n1:5552: reached nothing, failed: ConnectionFailed" in str(caught.value)
    assert "dialled ?" not in str(caught.value)


# -- the shared connections of a role, behind the Kept hook -----------------------------------------------------
class _Shared:
    def __init__(self, node: Address, alive: bool = True, room: bool = True) -> None:
        self.node, self._alive, self._room = node, alive, room

    def alive(self) -> bool:
        return self._alive

    def has_room(self) -> bool:
        return self._room


def test_shared_offers_the_first_live_connection_with_room_on_the_nodes_and_keeps_it_shared() -> None:
    full, dead, good = _Shared(N1, room=False), _Shared(N1, alive=False), _Shared(N1)
    shared = Shared([_Shared(N2), full, dead, good])
    assert shared.take((N1,)) is good and shared.take((N1, N3)) is good  # taking it takes nothing away
    assert shared.take((N3,)) is None


def test_shared_sets_the_full_aside_until_told_of_room_drops_the_dead_and_forgets_what_is_discarded() -> None:
    older, newer, dead = _Shared(N1), _Shared(N1), _Shared(N1, alive=False)
    shared = Shared([dead, older, newer, _Shared(N2)])
    assert shared.take((N1,)) is older and len(shared) == 3 and dead not in shared  # the dead one went on the way
    older._room = False  # full: set aside on the next look, which takes the newer one
    assert shared.take((N3, N1)) is newer and older in shared and list(shared._open[N1].values()) == [newer]
    older._room = True
    assert shared.take((N1,)) is newer  # not looked at again until told
    shared.room(older)
    shared.room(newer)  # (not set aside: nothing)
    assert shared.take((N1,)) is newer and set(shared._open[N1].values()) == {newer, older}
    assert shared.discard(older) and not shared.discard(older) and older not in shared
    newer._room = False
    assert shared.take((N1,)) is None and shared.take((N2,)) is not None
    assert shared.discard(newer) and not shared._full  # a full one goes too
    shared.add(shared.take((N2,)))  # already shared: nothing changes
    assert len(shared) == 1


def test_a_connection_that_gets_an_id_back_when_full_tells_its_lane() -> None:
    conn = Connection(FakeClient(), N1, LB, "c", max_ids=2)
    told: list[Connection] = []
    conn.on_room = told.append
    first, second = conn.take_id(), conn.take_id()
    conn.give_back(first)
    conn.give_back(first)  # (not full any more: told once)
    conn.give_back(second)
    assert told == [conn] and not conn.ids


def test_a_connection_counts_those_placed_on_it_before_their_ids_are_taken() -> None:
    """500 partitions' producers placed at once each saw a free id on a shared connection, before any id was
    taken: the 201st found none.  A record placed holds a place until it is popped (moved, closed)."""
    from smartclient.stream.host import PlacementRecord
    from smartclient.stream.placement import PlacementBook

    conn = Connection(FakeClient(), N1, LB, "c", max_ids=2)
    told: list[Connection] = []
    conn.on_room = told.append
    book = PlacementBook()
    book.put((1, "s1"), PlacementRecord(Role.PRODUCER, "s1", None, N1, LB, "c"), conn)
    assert conn.has_room()
    book.put((2, "s2"), PlacementRecord(Role.PRODUCER, "s2", None, N1, LB, "c"), conn)
    assert not conn.has_room() and not conn.ids  # no id taken yet: full all the same
    book.put((2, "s2"), PlacementRecord(Role.PRODUCER, "s2", None, N1, LB, "c"), conn)  # placed again: one place
    assert conn.held == 2 and not conn.has_room()
    told.clear()
    book.pop((1, "s1"))
    assert conn.has_room() and told == [conn]
    book.drop_connection("c")
    assert conn.held == 0


def test_the_placement_book_keeps_each_streams_consumers_by_node_and_each_connections_records() -> None:
    from smartclient.stream.host import PlacementRecord
    from smartclient.stream.placement import PlacementBook

    book = PlacementBook()

    def record(role: Role, stream: str, node: Address, conn: str) -> PlacementRecord:
        return PlacementRecord(role, stream, None, node, LB, conn)

    book.put((1, "s"), record(Role.CONSUMER, "s", N2, "c1"))
    book.put((2, "s"), record(Role.CONSUMER, "s", N2, "c1"))
    book.put((3, "s"), record(Role.CONSUMER, "s", N3, "c2"))
    book.put((4, "s"), record(Role.PRODUCER, "s", N1, "p1"))
    assert book.load("s") == {N2: 2, N3: 1} and book.load("other") == {}
    book.put((2, "s"), record(Role.CONSUMER, "s", N3, "c2"))  # placed again, elsewhere
    assert book.load("s") == {N2: 1, N3: 2}
    book.drop_connection("c2")
    assert book.load("s") == {N2: 1} and set(book.records) == {(1, "s"), (4, "s")}
    book.pop((1, "s"))
    book.pop((1, "s"))  # (twice: nothing)
    assert book.load("s") == {} and list(book.records) == [(4, "s")]
    book.drop_connection("p1")
    assert not book.records and not book._loads and not book._on_connection


def test_a_shared_connection_comes_before_a_kept_one_and_before_any_dial() -> None:
    kept: KeptList[Any] = KeptList()
    parked = _Shared(N1)
    kept.put(N1, parked)
    in_use = _Shared(N1)
    plan: Placement[Any] = Placement(LEADER, FAST, kept, shared=Shared([in_use]))
    assert plan.start() == Done(in_use, reused=True, shared=True)
    assert Placement(LEADER, FAST, kept, shared=Shared([])).start() == Done(parked, reused=True)


def test_what_another_placement_opened_meanwhile_is_offered_before_the_next_dial() -> None:
    opened_elsewhere: Shared[_Shared] = Shared()
    plan: Placement[Any] = Placement(LEADER, FAST, KeptList(), shared=opened_elsewhere)
    assert plan.start() == Dial(N1)
    assert isinstance(plan.landed(N1, LB, N2, _Shared(N2)), Keep)
    other = _Shared(N1)
    opened_elsewhere.add(other)  # a concurrent placement landed on n1 while this one dialled
    assert plan.next() == Done(other, reused=True, shared=True) and plan.attempts == 1


def test_a_fallback_takes_a_shared_connection_to_its_node_first() -> None:
    consumer = StreamTopology("s", N1, (N2, N3)).candidates(Role.CONSUMER, load={N2: 0, N3: 0})
    kept: KeptList[Any] = KeptList()
    on_leader = _Shared(N1)
    plan: Placement[Any] = Placement(consumer, RetryPolicy(max_attempts=1), kept, shared=Shared([on_leader]))
    step = plan.start()
    assert isinstance(step, Dial)
    parked = _Shared(N1)
    step = plan.landed(step.target, LB, N1, parked)  # the leader: tier 1, kept
    assert isinstance(step, Keep)
    kept.put(step.node, step.connection)
    assert plan.next() == Done(on_leader, reused=True, shared=True)  # attempts ran out: fall back to the leader


def test_the_stream_shell_shares_through_the_hook_without_dialling() -> None:
    connector = FakeStreamConnector(sticky(N2))
    in_use = Connection(FakeClient(), N1, LB, "in-use")
    conn = asyncio.run(connector.acquire(LEADER, "test", shared=Shared([in_use])))
    assert conn is in_use and connector.opened == 0 and connector.reused == 0 and conn.sessions == 0
    in_use.ids.update(range(in_use.max_ids))  # no free id: not offered
    connector = FakeStreamConnector(round_robin())
    conn = asyncio.run(connector.acquire(LEADER, "test", shared=Shared([in_use])))
    assert conn is not in_use and conn.node == N1 and conn.sessions == connector.opened


def test_after_a_dial_went_unanswered_the_next_dials_to_that_address_are_hedged_quickly() -> None:
    """Behind an LB, a node stopping gracefully takes every few connections and answers none: once one dial
    went unanswered for ``hedge_after``, the dials to that address for HANG_MEMORY seconds get their second
    one after a fifth of it (the pure rule: RetryPolicy.hedge_wait)."""
    from smartclient.core.retry import HANG_MEMORY, QUICK_HEDGE
    from smartclient.resolution import Resolution

    policy = RetryPolicy(hedge_after=1.0)
    assert policy.hedge_wait(HANG_MEMORY + 1) == 1.0 and policy.hedge_wait(1.0) == QUICK_HEDGE == 0.2
    assert RetryPolicy().hedge_wait(1.0) == pytest.approx(0.1) and RetryPolicy(hedge_after=0).hedge_wait(1.0) == 0
    held: list[float] = []

    class Connector(StreamConnector):
        hold = True

        async def _dial_once(self, target: Address, name: str, client_class: Any, hedge: bool = False) -> Connection:
            if self.hold:  # every first dial is taken by the stopping node, and held
                self.hold = False
                held.append(asyncio.get_running_loop().time())
                await asyncio.sleep(30)
            self.hold = True
            return Connection(FakeClient(), target, target, name)

    async def main() -> list[float]:
        connector = Connector(ClientSettings(Credentials(), "/", None), Resolution(None), retry=policy)
        took = []
        for _ in range(3):
            began = asyncio.get_running_loop().time()
            await connector.dial(NODES[0], "t")
            took.append(asyncio.get_running_loop().time() - began)
        assert connector.hedged == 3  # each dial got its second one (counted: each opens one connection more)
        return took

    first, second, third = asyncio.run(main())
    assert first >= 1.0  # the first hang costs hedge_after
    assert second < 0.7 and third < 0.7  # the next ones, a fifth of it (0.2 s)
    assert len(held) == 3


def test_after_a_connection_through_an_address_was_lost_its_next_dials_are_hedged_quickly() -> None:
    """A connection lost (not closed by this side) may mean its node is gone, and an LB sends connections to a dead
    node until its checks find it, holding each: the next dials through that address get their second one after
    the quick wait from the first (a fleet's first dial after a kill waited the whole ``hedge_after``).  A
    connection this side closed says nothing."""
    from resolvers import LoadBalancer
    from smartclient.resolution import Resolution

    class Connector(StreamConnector):
        async def _dial_once(self, target: Address, name: str, client_class: Any, hedge: bool = False) -> Connection:
            if not hedge:  # the first dial lands on the dead node, and is held
                await asyncio.sleep(30)
            return Connection(FakeClient(), target, LB, name)

    async def main(lost: bool) -> float:
        connector = Connector(ClientSettings(Credentials(), "/", None), Resolution(LoadBalancer(LB)),
                              retry=RetryPolicy(hedge_after=1.0))
        # (NODES[0] was never dialled: the resolver says its dials go through the LB, as the lost one did)
        conn = Connection(FakeClient(), NODES[1], LB, "through-the-lb")
        if not lost:
            await connector.close_connection(conn)
        await connector._closed(conn, None)  # (its close handler also runs after this side closed it)
        began = asyncio.get_running_loop().time()
        await connector.dial(NODES[0], "t")
        return asyncio.get_running_loop().time() - began

    assert asyncio.run(main(lost=False)) >= 1.0  # closed here: the whole hedge_after
    assert asyncio.run(main(lost=True)) < 0.5  # lost: a fifth of it (0.2 s)


def test_while_no_dial_opens_one_more_goes_after_each_hedge_wait_up_to_hedges() -> None:
    """Through a round-robin LB that still sends a third of its connections to a node that has just died (and
    holds each for seconds), the hedge can land there too: another dial goes after each further wait in which
    none opened, up to HEDGES beside the first (the fleet of issue 57: a locator's first dial and its hedge both
    held 3 s, and every recovering handle of that process waited for it)."""
    from smartclient.core.retry import HEDGES
    from smartclient.resolution import Resolution

    class Connector(StreamConnector):
        def __init__(self, held: int, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.held, self.dials = held, 0

        async def _dial_once(self, target: Address, name: str, client_class: Any, hedge: bool = False) -> Connection:
            self.dials += 1
            if self.dials <= self.held:  # held by the dead node's backend
                await asyncio.sleep(30)
            return Connection(FakeClient(), target, target, name)

    async def main(held: int) -> tuple[float, int, int]:
        connector = Connector(held, ClientSettings(Credentials(), "/", None), Resolution(None),
                              retry=RetryPolicy(hedge_after=0.1))
        began = asyncio.get_running_loop().time()
        dial = asyncio.ensure_future(connector.dial(NODES[0], "t"))
        done, _ = await asyncio.wait([dial], timeout=2.0)
        took = asyncio.get_running_loop().time() - began
        if not done:
            dial.cancel()
        return took, connector.dials, connector.hedged

    took, dials, hedged = asyncio.run(main(held=2))
    assert dials == 3 and hedged == 2 and took < 1.0  # the third dial opened, after two waits (0.1 s, then 0.02)
    took, dials, hedged = asyncio.run(main(held=20))
    assert dials == 1 + HEDGES == 8 and hedged == HEDGES  # never more than HEDGES beside the first


def test_a_connection_put_back_after_a_borrow_keeps_its_idle_time() -> None:
    """A statistics read every few seconds borrows a parked connection and puts it back: its idle time goes on
    from when it was parked, so it still closes after ``idle_timeout`` (parked anew, it never would)."""
    from smartclient.stream.connector import ParkingLot

    now = [0.0]
    lot = ParkingLot(PoolLimits(idle_timeout=5.0), clock=lambda: now[0])
    conn = Connection(FakeClient(), NODES[0], NODES[0], "c")
    lot.put(conn)
    for t in (2.0, 4.0):
        now[0] = t
        taken = lot.take((NODES[0],))
        assert taken is conn and conn.idle_since == 0.0
        lot.put(conn, conn.idle_since)
    now[0] = 5.0
    assert lot.expired() == [conn]


def test_the_hedge_s_losing_dial_that_opened_is_parked_for_the_placement_not_closed() -> None:
    """Two dials at once through a round-robin LB reach two nodes: the first to open is returned, and the other,
    which may be the node the placement wants, is parked (its next look at the parking lot takes it); through an
    SNI ingress (``keep`` False) it is closed."""
    from smartclient.stream.connector import _first_opened

    class Lot(FakeStreamConnector):
        def __init__(self) -> None:
            super().__init__(round_robin())
            self.closed: list[Connection] = []

        async def close_connection(self, conn: Connection, handshake: bool = True) -> None:
            self.closed.append(conn)

    async def race(keep: bool) -> tuple[Connection, Lot, Connection]:
        connector = Lot()
        won, lost = (Connection(FakeClient(), node, node, node.host) for node in NODES[:2])
        dials: list[asyncio.Future[Connection]] = []
        for conn in (won, lost):  # both opened by the time the race looks
            dials.append(asyncio.get_running_loop().create_future())
            dials[-1].set_result(conn)
        return await _first_opened(dials, connector, keep), connector, lost

    taken, connector, lost = asyncio.run(race(keep=True))
    assert taken.node == NODES[0] and connector.parking.take((NODES[1],)) is lost and connector.closed == []
    taken, connector, lost = asyncio.run(race(keep=False))
    assert len(connector.parking) == 0 and connector.closed == [lost]


def test_any_node_takes_one_not_avoided_first_and_an_avoided_one_only_as_the_fallback() -> None:
    """AMQP 0.9.1's placer avoids a node its queue watch found cut off from its queues' leaders (a partition's
    minority): any node but that one, through the LB; only an LB that reaches nothing else gets it."""
    for start in range(3):
        network = round_robin()
        for _ in range(start):
            network(N1)
        placer = FakeNodePlacer("amqp", network, True)
        assert placer.place(None, avoid={"n1@localhost"}).node != "n1@localhost"
    placer = FakeNodePlacer("amqp", sticky(N1), True)
    assert placer.place(None, avoid={"n1@localhost"}).node == "n1@localhost"  # the kept fallback
    placer = FakeNodePlacer("amqp", sticky(N1), True)
    every = {"n1@localhost", "n2@localhost", "n3@localhost"}
    assert placer.place(None, avoid=every).node == "n1@localhost" and placer.opened == 1  # all avoided: any


def test_a_carriers_ids_are_found_among_all_256_so_one_of_56_streams_always_gets_one() -> None:
    """rstream keys a carrier's publishers and subscribers by id over all its connections: a carrier holding 200
    streams found no id free on a connection the others used (a 500-partition super stream)."""
    from smartclient.stream.host import ID_SPACE, carrier_streams

    assert carrier_streams(200) == 56 and carrier_streams(1) == 255 and ID_SPACE == 256
    conn = Connection(FakeClient(), N1, LB, "c", max_ids=200)
    for _ in range(199):
        conn.take_id()  # 199 in use on it (other carriers')
    taken_elsewhere = set(range(199, 199 + carrier_streams(200) - 1))  # the carrier's 55 others, elsewhere
    ident = conn.take_id(taken_elsewhere)
    assert ident not in taken_elsewhere and ident not in set(range(199)) and 0 <= ident < ID_SPACE


async def test_a_connection_has_at_most_8_subscribes_in_flight() -> None:
    """200 Subscribes sent at once held the broker's process past its heartbeat check, which closed the
    connection; a few at a time, it reads between them."""
    import asyncio

    from smartclient.stream._rstream.wire import few_at_a_time
    from smartclient.stream.host import SUBSCRIBES_IN_FLIGHT

    conn = Connection(FakeClient(), N1, LB, "c")
    now, most = 0, 0

    async def subscribe() -> int:
        nonlocal now, most
        now += 1
        most = max(most, now)
        await asyncio.sleep(0.01)
        now -= 1
        return 1

    assert sum(await asyncio.gather(*(few_at_a_time(conn, subscribe()) for _ in range(40)))) == 40
    assert most == SUBSCRIBES_IN_FLIGHT == 8
    assert await few_at_a_time(None, subscribe()) == 1  # no Connection: not gated


def test_a_dial_cancelled_at_any_moment_of_its_opening_ends_at_once() -> None:
    """A hedge that lost the race is cancelled wherever it is in its opening, and the dial that won waits for it to
    end: one cancelled as its TCP open ended went on to its handshake (Python 3.11's ``wait_for`` dropped the
    cancellation), with a peer that holds the connection and answers nothing, as an LB holds one it sent to a dead
    node (3 s): the dial that had won waited that long (issue 57's fleet).  A local socket that accepts and stays
    silent, the dial cancelled after each number of event-loop turns in turn."""
    from smartclient.resolution import Resolution

    async def main() -> list[tuple[int, float]]:
        held: list[asyncio.StreamWriter] = []

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)  # (closed at the end: it answers nothing meanwhile)

        server = await asyncio.start_server(hold, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connector = StreamConnector(ClientSettings(Credentials(), "/", None), Resolution(None))
        slow: list[tuple[int, float]] = []
        try:
            for turns in range(40):
                dial = asyncio.ensure_future(connector._dial_once(Address("127.0.0.1", port), "t", None))
                for _ in range(turns):
                    await asyncio.sleep(0)
                began = asyncio.get_running_loop().time()
                dial.cancel()
                try:
                    await asyncio.wait_for(asyncio.shield(dial), 1.0)
                except asyncio.CancelledError:
                    pass
                except asyncio.TimeoutError:
                    slow.append((turns, asyncio.get_running_loop().time() - began))
                    dial.cancel()
                    await asyncio.gather(dial, return_exceptions=True)
                assert dial.cancelled() or turns in dict(slow), (turns, dial)
        finally:
            for writer in held:
                writer.close()
            server.close()
        return slow

    assert asyncio.run(main()) == []  # (9 to 11 turns went on to the handshake before)

"""The Environment's pure parts: argument checks, the parking lot, shared topology lookups. No broker."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from smartclient import (
    Address,
    ConfigurationError,
    Environment,
    PlacementPolicy,
    PoolLimits,
    RetryPolicy,
    StreamTopology,
)
from smartclient.stream.connector import Connection, ParkingLot
from smartclient.stream.topology_cache import TopologyCache
from tests.unit.fakes import FakeClient


def test_entry_points_and_credentials() -> None:
    env = Environment(["rabbitmq-stream://app:pw@n1:5552/prod", "n2:5553", Address("n3", 5554)])
    assert env.streams.entry_points == (Address("n1", 5552), Address("n2", 5553), Address("n3", 5554))
    assert env.settings.vhost == "prod" and env.settings.credentials.username == "app"
    assert "pw" not in repr(env) and "pw" not in repr(env.settings)
    assert Environment("rabbitmq-stream+tls://h").settings.tls is not None


@pytest.mark.parametrize("entry, kwargs, message", [
    ([], {}, "no entry point"),
    (["rabbitmq-stream://a:1@h/x", "rabbitmq-stream://b:2@h/x"], {}, "different credentials"),
    (["rabbitmq-stream://h/a", "rabbitmq-stream://h/b"], {}, "different vhosts"),
    ("h:5552", {"connection": {"topology_max_age": 0}}, "connection must be a ConnectionOptions"),
    ("stomp://h", {}, "unsupported URI scheme"),
])
def test_bad_arguments(entry: object, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Environment(entry, **kwargs)  # type: ignore[arg-type]


class _CountingTopologies(TopologyCache):
    """The cache with its broker query replaced: counts the requests."""

    def __init__(self) -> None:
        super().__init__(None, (), None, "t", 60.0, PlacementPolicy(), RetryPolicy())  # type: ignore[arg-type]
        self.calls: list[str] = []

    async def _query(self, stream: str) -> StreamTopology:
        self.calls.append(stream)
        await asyncio.sleep(0.05)
        topo = StreamTopology(stream, Address("n1", 1), ())
        self._keep(topo)
        return topo


async def test_dropping_a_node_forgets_exactly_the_topologies_with_a_member_there() -> None:
    cache = _CountingTopologies()
    n1, n2, n3 = (Address(f"n{i}", 1) for i in (1, 2, 3))
    for name, leader, replicas in (("a", n1, (n2,)), ("b", n2, (n3,)), ("c", n3, ())):
        cache._keep(StreamTopology(name, leader, replicas))
    cache._keep(StreamTopology("c", n3, (n1,)))  # read again, with another member: indexed anew
    cache.drop(node=n2)
    assert "a" not in cache and "b" not in cache and "c" in cache
    cache.drop(node=n1)
    assert "c" not in cache and not cache._on_node
    cache._keep(StreamTopology("a", n1, (n2,)))
    cache.drop(stream="a")
    cache.drop(stream="gone")  # (not cached: nothing)
    assert "a" not in cache and not cache._on_node


async def test_concurrent_lookups_of_one_stream_share_one_request() -> None:
    cache = _CountingTopologies()
    results = await asyncio.gather(*(cache.topology("s") for _ in range(10)), cache.topology("t"))
    assert cache.calls == ["s", "t"]
    assert len({id(r) for r in results[:10]}) == 1
    await cache.topology("s")
    assert cache.calls == ["s", "t"]  # cached
    cache.drop(node=Address("n1", 1))
    await cache.topology("s")
    assert cache.calls == ["s", "t", "s"]


def _conn(node: Address) -> Connection:
    return Connection(FakeClient(), node, node, "c")  # type: ignore[arg-type]


def test_parking_lot_takes_by_node_expires_and_evicts() -> None:
    now = [0.0]
    lot = ParkingLot(PoolLimits(idle_timeout=5, max_parked_per_node=2), clock=lambda: now[0])
    a, b, c = (_conn(Address("n1", 1)) for _ in range(3))
    assert lot.put(a) is None and lot.put(b) is None
    assert lot.put(c) is a  # over the per-node limit: the oldest leaves
    assert lot.take((Address("n2", 1),)) is None
    assert lot.take((Address("n2", 1), Address("n1", 1))) is c
    b.client.closed = True  # type: ignore[attr-defined]
    assert lot.take((Address("n1", 1),)) is None  # a dead connection is never handed out
    d = _conn(Address("n3", 1))
    lot.put(d)
    now[0] = 4.9
    assert lot.expired() == []
    now[0] = 5.0
    assert lot.expired() == [d] and len(lot) == 0


def test_a_connection_parked_twice_is_kept_once_and_a_taken_copy_never_stays() -> None:
    now = [0.0]
    lot = ParkingLot(PoolLimits(idle_timeout=5, max_parked_per_node=4), clock=lambda: now[0])
    a = _conn(Address("n1", 1))
    lot.put(a)
    now[0] = 3.0
    lot.put(a)  # let go of by a second carrier: its idle time starts over, one entry only
    assert len(lot) == 1 and lot.parked_twice == 1
    now[0] = 6.0
    assert lot.expired() == []  # 3 s since it was parked again
    assert lot.take((Address("n1", 1),)) is a and len(lot) == 0
    lot._by_node[a.node] = [a]  # an entry no longer parked (taken elsewhere) is dropped, never handed on
    assert lot.expired() == [] and len(lot) == 0 and lot.stale == 1


class _OldBroker:
    """A locator of a broker that knows neither Publish v2 nor CreateSuperStream."""

    def __init__(self) -> None:
        from itertools import count

        self._corr_id_seq = SimpleNamespace(next=count(1).__next__)

    async def sync_request(self, frame: object, resp_schema: object, raise_exception: bool = True) -> object:
        infos = [SimpleNamespace(key_command=2, min_version=1, max_version=1)]
        return SimpleNamespace(command_versions=infos)


async def test_filtering_on_a_broker_without_it_is_a_typed_error() -> None:
    from smartclient import FeatureNotSupported

    env = Environment("h:5552")
    old = _OldBroker()

    async def locator() -> _OldBroker:
        return old

    env.streams._topologies.locator = locator  # type: ignore[method-assign]
    with pytest.raises(FeatureNotSupported, match=r"RabbitMQ 3\.13"):
        await env.streams.require_filtering()
    with pytest.raises(FeatureNotSupported):
        await env.producer("s", filter_value=lambda body: "x")


async def test_super_stream_falls_back_to_the_management_api_without_the_command() -> None:
    from smartclient import FeatureNotSupported

    calls: list[tuple[str, str]] = []

    class FakeManagement:
        def get(self, path: str) -> object:
            from smartclient.management import ManagementError

            raise ManagementError("not found", status=404)

        def put(self, path: str, body: object) -> None:
            calls.append(("PUT", path))

        def post(self, path: str, body: object) -> None:
            calls.append(("POST", path))

    old = _OldBroker()

    async def locator() -> _OldBroker:
        return old

    env = Environment("h:5552")
    env.streams._topologies.locator = locator  # type: ignore[method-assign]
    with pytest.raises(FeatureNotSupported, match="ManagementClient"):
        await env.create_super_stream("inv", partitions=2)
    env.management = FakeManagement()  # type: ignore[assignment]
    assert await env.create_super_stream("inv", partitions=2) == ["inv-0", "inv-1"]
    assert calls == [("PUT", "/api/exchanges/%2F/inv"), ("PUT", "/api/queues/%2F/inv-0"),
                     ("POST", "/api/bindings/%2F/e/inv/q/inv-0"), ("PUT", "/api/queues/%2F/inv-1"),
                     ("POST", "/api/bindings/%2F/e/inv/q/inv-1")]


def test_the_face_hands_its_settings_to_the_federation_wing() -> None:
    from smartclient.federation.topology import FederatedBroker, pair
    from smartclient.management import ManagementClient

    api = ManagementClient("http://site-a:15672/", "fed", "s3cret")
    env = Environment("rabbitmq-stream://app:pw@site-a:5552/orders", management=api)
    broker = env.federated_broker("site-a", "amqp://fed:s3cret@site-a:5672")
    assert broker == FederatedBroker("site-a", "http://site-a:15672", "amqp://fed:s3cret@site-a:5672", "fed",
                                     "s3cret", "orders")
    assert "s3cret" not in repr(broker) and "s3cret" not in repr(api)
    other = FederatedBroker("site-b", "http://site-b:15672", "amqp://fed:s3cret@site-b:5672", vhost="orders")
    assert pair(broker, other, "events").brokers[0] is broker  # a topology takes it as any other broker
    with pytest.raises(ConfigurationError, match="needs the management API"):
        Environment("h:5552").federated_broker("site-a", "amqp://h:5672")
    with pytest.raises(ConfigurationError, match="amqp_uri"):
        env.federated_broker("site-a", 5672)  # type: ignore[arg-type]


def test_an_environment_counts_its_tables_before_any_connection() -> None:
    from smartclient import Environment

    counts = Environment("rabbitmq-stream://localhost:5552").streams.resources()
    assert counts["connections"] == 0 and counts["handles"] == 0 and counts["pending confirms"] == 0
    assert {"parked connections", "metadata cache entries", "placement locks", "producer carriers",
            "recovery keys"} <= set(counts)


class _OneNode:
    """Every stream's candidates: one node."""

    def __init__(self, node: Address) -> None:
        self.node = node
        self.on_metadata_update = None

    async def candidates(self, stream: str, role: object, load: object = None, recovering: bool = False) -> object:
        from smartclient.core.topology import Candidates, Role

        return Candidates(stream, Role.CONSUMER, ((self.node,),))


class _Connector:
    """Dials only when told to: ``release`` lets the dial in progress finish with a new connection."""

    def __init__(self) -> None:
        self.on_closed = self.on_mismatch = None
        self.release = asyncio.Event()
        self.dials = 0

    async def acquire(self, candidates: Any, name: str, retry: Any = None, shared: Any = None) -> Connection:
        if shared is not None and (conn := shared.take(candidates.tiers[0])) is not None:
            return conn
        self.dials += 1
        await self.release.wait()
        return _conn(candidates.tiers[0][0])


async def test_a_placement_with_a_shared_connection_open_does_not_queue_behind_one_that_dials_and_locks_go(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from smartclient.core.recovery import RecoveryPolicy
    from smartclient.core.retry import RetryPolicy
    from smartclient.core.topology import Role
    from smartclient.stream import _rstream
    from smartclient.stream.placement import StreamPlacement

    monkeypatch.setattr(_rstream, "on_metadata_update", lambda *args: None)
    node = Address("n1", 1)
    connector = _Connector()
    placement = StreamPlacement(connector, _OneNode(node), RetryPolicy(), RecoveryPolicy(), "t")  # type: ignore[arg-type]
    monkeypatch.setattr(placement, "_record", lambda *args: None)
    pool = SimpleNamespace(role=Role.CONSUMER)
    dialling = asyncio.ensure_future(placement.place(pool, "s1", None))  # holds the lock for n1, dialling
    for _ in range(100):
        if connector.dials:
            break
        await asyncio.sleep(0)
    opened = _conn(node)
    placement.shared[(Role.CONSUMER, False)].add(opened)  # meanwhile a connection to n1 is open, with room
    conn = await asyncio.wait_for(placement.place(pool, "s2", None), 1)  # taken at once, not behind the dial
    assert conn is opened and not dialling.done()
    connector.release.set()
    await dialling
    assert placement._locks == {} and not placement._waiting  # the lock went with its last placement


async def test_single_active_consumers_keep_to_a_lane_apart_and_its_emptied_connections_close(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A single active consumer's connection may still carry an unsubscription waiting for the stream coordinator:
    plain consumers never share it, nor take it parked."""
    from smartclient.core.recovery import RecoveryPolicy
    from smartclient.core.retry import RetryPolicy
    from smartclient.core.topology import Role
    from smartclient.stream import _rstream
    from smartclient.stream.placement import StreamPlacement

    monkeypatch.setattr(_rstream, "on_metadata_update", lambda *args: None)
    node = Address("n1", 1)
    connector = _Connector()
    connector.release.set()
    closed: list[tuple[Connection, bool]] = []
    parked: list[Connection] = []

    async def close_connection(conn: Connection, handshake: bool = True) -> None:
        closed.append((conn, handshake))

    async def park(conn: Connection) -> None:
        parked.append(conn)

    connector.close_connection = close_connection  # type: ignore[attr-defined]
    connector.park = park  # type: ignore[attr-defined]
    placement = StreamPlacement(connector, _OneNode(node), RetryPolicy(), RecoveryPolicy(), "t")  # type: ignore[arg-type]
    monkeypatch.setattr(placement, "_record", lambda *args: None)
    plain = await placement.place(SimpleNamespace(role=Role.CONSUMER, apart=set()), "s1", None)
    single = await placement.place(SimpleNamespace(role=Role.CONSUMER, apart={"s2"}), "s2", None)
    other = await placement.place(SimpleNamespace(role=Role.CONSUMER, apart={"s3"}), "s3", None)
    assert single is not plain and other is single and connector.dials == 2
    await placement.unused(single)
    await placement.unused(plain)
    assert closed == [(single, False)] and parked == [plain]

"""The one "first entry point that answers" loop (smartclient.core.entry_points.EntryPoints), alone and driven
by both shells with fake dialers: the stream locator (async) and the AMQP/MQTT node placer (sync).  No broker."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from smartclient import (
    Address,
    AddressNotAllowed,
    AuthenticationFailed,
    CertificateRejected,
    ConnectionFailed,
    StepTimeout,
    StreamNotFound,
    TopologyError,
)
from smartclient.core.entry_points import EntryPoints
from smartclient.core.retry import RetryPolicy
from smartclient.core.topology import PlacementPolicy
from smartclient.node_placement import NodePlacer
from smartclient.stream.host import Connection
from smartclient.stream.topology_cache import TopologyCache
from tests.unit.fakes import FakeClient

A, B, C = Address("a", 5552), Address("b", 5552), Address("c", 5552)


def drive(entries: EntryPoints, answers: dict[Address, BaseException | str]) -> str:
    """The loop every shell runs, with a dialer that answers from ``answers``."""
    while (entry := entries.next_entry()) is not None:
        answer = answers[entry]
        if isinstance(answer, BaseException):
            entries.failed(entry, Address("lb", 1), answer)
            continue
        return answer
    raise entries.error()


def test_the_first_entry_point_that_answers_is_used_in_order() -> None:
    entries = EntryPoints((A, B, C), "a test")
    assert drive(entries, {A: ConnectionFailed("down"), B: "b!", C: "c!"}) == "b!"
    assert entries.tried == 2 and [a.target for a in entries.attempts] == [A]


def test_when_none_answers_the_error_lists_each_and_chains_the_last() -> None:
    entries = EntryPoints((A, B), "the stream locator")
    down, slow = ConnectionFailed("refused"), StepTimeout("connect took too long")
    with pytest.raises(ConnectionFailed) as caught:
        drive(entries, {A: down, B: slow})
    message = str(caught.value)
    assert message.startswith("no entry point could be reached for the stream locator (2 tried): ")
    assert "dialled lb:1 for a:5552: reached nothing, failed: ConnectionFailed: refused" in message
    assert "for b:5552: reached nothing, failed: StepTimeout: connect took too long" in message
    assert caught.value.__cause__ is slow


@pytest.mark.parametrize("refusal", [AuthenticationFailed("no"), CertificateRejected("bad name"),
                                     AddressNotAllowed("outside"), RuntimeError("a bug")])
def test_a_refusal_every_entry_point_would_repeat_is_raised_at_once(refusal: BaseException) -> None:
    entries = EntryPoints((A, B), "a test")
    with pytest.raises(type(refusal)) as caught:
        drive(entries, {A: refusal, B: "never dialled"})
    assert caught.value is refusal and entries.tried == 1


def test_no_entry_point_at_all_says_so() -> None:
    entries = EntryPoints((), "a test")
    assert entries.next_entry() is None
    assert "none was given" in str(entries.error())


# -- the async stream shell: the locator ------------------------------------------------------------------
class _StreamConnector:
    def __init__(self, answers: dict[Address, BaseException | None]) -> None:
        self.answers = answers
        self.dialled: dict[Address, Address] = {}
        self.connections: set[Connection] = set()
        self.tried: list[Address] = []

    async def dial(self, target: Address, name: str, client_class: Any = None) -> Connection:
        self.tried.append(target)
        self.dialled[target] = Address("mapped-" + target.host, target.port)
        answer = self.answers[target]
        if answer is not None:
            raise answer
        conn = Connection(FakeClient(), target, target, name)
        self.connections.add(conn)
        return conn


def _cache(connector: _StreamConnector) -> TopologyCache:
    return TopologyCache(connector, (A, B, C), None, "test", 60.0, PlacementPolicy(),  # type: ignore[arg-type]
                         RetryPolicy())


def test_the_stream_locator_drives_the_loop() -> None:
    connector = _StreamConnector({A: ConnectionFailed("down"), B: None, C: None})
    client = asyncio.run(_cache(connector).locator())
    assert isinstance(client, FakeClient) and connector.tried == [A, B] and not connector.connections


def test_the_stream_locator_names_what_each_entry_point_dialled() -> None:
    connector = _StreamConnector({A: ConnectionFailed("down"), B: ConnectionFailed("down"),
                                  C: AuthenticationFailed("no")})
    with pytest.raises(AuthenticationFailed):
        asyncio.run(_cache(connector).locator())
    connector.answers[C] = ConnectionFailed("down too")
    with pytest.raises(ConnectionFailed, match="no entry point could be reached for the stream locator") as caught:
        asyncio.run(_cache(connector).locator())
    assert "dialled mapped-a:5552 for a:5552" in str(caught.value)


# -- the sync AMQP/MQTT shell: any node, entry points only ----------------------------------------------------
class _Placer(NodePlacer[str]):
    protocol = "amqp"
    default_port = 5672
    name_column = "name"

    def __init__(self, answers: dict[Address, BaseException | None]) -> None:
        super().__init__(None, entry_points=list(answers))
        self.answers = answers

    def _dial(self, target: Address, dialled: Address, name: str) -> str:
        answer = self.answers[target]
        if answer is not None:
            raise answer
        return f"connection to {target}"

    def _close(self, connection: str) -> None:
        pass

    def _new_name(self, purpose: str) -> str:
        return f"test-{purpose}"


class _AsideConnector(_StreamConnector):
    async def acquire(self, candidates: Any, name: str) -> Connection:
        assert candidates == "any member"
        return await self.dial(A, name)


def _aside_cache() -> tuple[_AsideConnector, TopologyCache]:
    connector = _AsideConnector({A: None, B: None, C: None})
    cache = _cache(connector)

    async def topology(stream: str) -> Any:
        return SimpleNamespace(candidates=lambda role: "any member")

    cache.topology = topology  # type: ignore[method-assign]
    return connector, cache


def test_requests_that_wait_on_a_member_share_a_connection_of_their_own_beside_the_locator() -> None:
    connector, cache = _aside_cache()

    async def run() -> tuple[Any, list[Any]]:
        locator = await cache.locator()
        seen = [await cache.aside("s", "offset", _answer) for _ in range(3)]
        return locator, seen

    locator, seen = asyncio.run(run())
    assert len({id(c) for c in seen}) == 1 and seen[0] is not locator
    assert connector.tried == [A, A] and not connector.connections  # one dial each; neither a handle's


@pytest.mark.parametrize("failure", [StepTimeout("offset query: no answer"), ConnectionFailed("closed"),
                                     asyncio.CancelledError()])
def test_a_request_that_did_not_end_leaves_the_aside_connection_to_the_member_it_waits_on(
        failure: BaseException) -> None:
    connector, cache = _aside_cache()

    async def fail(client: Any) -> None:
        raise failure

    async def run() -> tuple[Any, Any]:
        first = await cache.aside("s", "offset", _answer)
        with pytest.raises(type(failure)):
            await cache.aside("s", "offset", fail)
        return first, await cache.aside("s", "offset", _answer)

    first, then = asyncio.run(run())
    assert then is not first and len(connector.tried) == 2


def test_an_answer_that_is_an_error_keeps_the_aside_connection() -> None:
    connector, cache = _aside_cache()

    async def missing(client: Any) -> None:
        raise StreamNotFound("no such stream")

    async def run() -> tuple[Any, Any]:
        first = await cache.aside("s", "offset", _answer)
        with pytest.raises(StreamNotFound):
            await cache.aside("s", "offset", missing)
        return first, await cache.aside("s", "offset", _answer)

    first, then = asyncio.run(run())
    assert then is first and len(connector.tried) == 1


async def _answer(client: Any) -> Any:
    return client


def test_the_node_placer_drives_the_same_loop() -> None:
    placer = _Placer({A: ConnectionFailed("down"), B: ConnectionFailed("down"), C: None})
    landed = placer.place()
    assert landed.connection == "connection to c:5552" and landed.attempts == 3 and landed.node is None
    placer = _Placer({A: ConnectionFailed("down"), B: CertificateRejected("name"), C: None})
    with pytest.raises(CertificateRejected):
        placer.place()
    placer = _Placer({A: ConnectionFailed("down")})
    with pytest.raises(ConnectionFailed, match=r"for an amqp connection \(1 tried\): dialled a:5552 for a:5552"):
        placer.place()


# -- a lookup through an election asks another node too ----------------------------------------------------
class _MetadataClient(FakeClient):
    """Names ``leader`` (with ``replicas``), or no leader while ``leader`` is None."""

    def __init__(self, leader: Address | None, replicas: tuple[Address, ...] = ()) -> None:
        self.leader, self.replicas, self.asked = leader, replicas, 0

    async def query_leader_and_replicas(self, stream: str) -> Any:
        from rstream import exceptions

        self.asked += 1
        if self.leader is None:
            raise exceptions.LeaderNotAvailable(f"Leader not yet elected for stream {stream}")
        broker = lambda a: SimpleNamespace(host=a.host, port=a.port)  # noqa: E731
        return broker(self.leader), [broker(r) for r in self.replicas]


class _ElectionConnector(_StreamConnector):
    """The locator (on A) names no leader; a connection to another node (B) names C."""

    def __init__(self) -> None:
        super().__init__({A: None, B: None, C: None})
        self.clients = {A: _MetadataClient(None), B: _MetadataClient(C, (A,))}
        self.acquired: list[Any] = []
        self.closed: list[Address] = []

    async def dial(self, target: Address, name: str, client_class: Any = None) -> Connection:
        self.tried.append(target)
        return Connection(self.clients[target], target, target, name)

    async def acquire(self, candidates: Any, name: str) -> Connection:
        self.acquired.append(candidates)
        return await self.dial(candidates.all[0], name)

    async def close_connection(self, conn: Connection, handshake: bool = True) -> None:
        self.closed.append(conn.node)


def test_a_locator_that_names_no_leader_for_a_second_has_another_node_asked_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from smartclient.stream import topology_cache

    monkeypatch.setattr(topology_cache, "SECOND_OPINION", 0.1)
    connector = _ElectionConnector()
    cache = _cache(connector)
    cache._seen((A, B))  # known from earlier topologies

    async def run() -> Any:
        return await cache.topology("s")

    topo = asyncio.run(run())
    assert topo.leader == C and topo.replicas == (A,)
    assert [c.all for c in connector.acquired] == [(B,)]  # another node than the locator's, asked once
    assert connector.clients[A].asked >= 2 and connector.clients[B].asked == 1
    assert connector.closed == [B]  # that connection ends with the lookup
    assert set(cache._nodes) == {A, B, C}


def test_with_no_other_node_known_the_lookup_asks_its_locator_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from smartclient.stream import topology_cache

    monkeypatch.setattr(topology_cache, "SECOND_OPINION", 0.0)
    monkeypatch.setattr(topology_cache, "TOPOLOGY_TIME", 0.3)
    connector = _ElectionConnector()
    cache = _cache(connector)
    with pytest.raises(TopologyError, match="no leader available yet"):
        asyncio.run(cache.topology("s"))
    assert connector.acquired == [] and connector.closed == []

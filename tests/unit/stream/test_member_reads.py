"""Member reads (MemberReads): a node's reads share one reading connection, a read held behind one still
unanswered goes its own way after QUEUE_BOUND, and a reading connection is parked once its reads were answered
(closed if one failed).  Fake connector and StreamStats: each member answers when the test lets it.  No broker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from smartclient import Address, ConnectionFailed, FeatureNotSupported
from smartclient.core.topology import StreamTopology
from smartclient.stream import stats as stats_module
from smartclient.stream.member_reads import QUEUE_BOUND, MemberReads

N1, N2 = Address("n1", 5552), Address("n2", 5552)
TOPOLOGY = StreamTopology("s", N1, (N2,))


class BrokerClient:
    def __init__(self, version: str) -> None:
        self.server_properties = {"version": version}


class ReadingConn:
    def __init__(self, node: Address, version: str) -> None:
        self.node, self.client, self.closed = node, BrokerClient(version), False

    def alive(self) -> bool:
        return not self.closed


class ReadingConnector:
    def __init__(self, version: str = "4.3.6") -> None:
        self.version = version
        self.opened: list[ReadingConn] = []
        self.parked: list[ReadingConn] = []
        self.closed: list[ReadingConn] = []

    async def acquire(self, candidates: Any, name: str) -> ReadingConn:
        await asyncio.sleep(0)  # (a dial takes a moment: reads that come meanwhile wait for it)
        conn = ReadingConn(candidates.all[0], self.version)
        self.opened.append(conn)
        return conn

    async def park(self, conn: ReadingConn, since: float | None = None) -> None:
        self.parked.append(conn)

    async def close_connection(self, conn: ReadingConn, handshake: bool = True) -> None:
        conn.closed = True
        self.closed.append(conn)


class MemberAnswers:
    """StreamStats of each stream: answered once its gate opens (with its error, if it has one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.errors: dict[str, Exception] = {}
        self.sent: list[tuple[str, ReadingConn]] = []

        async def query(client: Any, stream: str, in_place: bool = False) -> dict[str, int]:
            assert in_place
            self.sent.append((stream, next(c for c in self.on if c.client is client)))
            await self.gate(stream).wait()
            if stream in self.errors:
                raise self.errors[stream]
            return {"first_chunk_id": 0}

        monkeypatch.setattr(stats_module, "query_stream_stats", query)
        self.on: list[ReadingConn] = []

    def gate(self, stream: str) -> asyncio.Event:
        return self.gates.setdefault(stream, asyncio.Event())

    def answer(self, *streams: str) -> None:
        for stream in streams:
            self.gate(stream).set()


@pytest.fixture
def members(monkeypatch: pytest.MonkeyPatch) -> MemberAnswers:
    return MemberAnswers(monkeypatch)


def reads_on(connector: ReadingConnector, members: MemberAnswers) -> MemberReads:
    acquire = connector.acquire

    async def tracked(candidates: Any, name: str) -> ReadingConn:
        conn = await acquire(candidates, name)
        members.on.append(conn)
        return conn

    connector.acquire = tracked  # type: ignore[method-assign]
    return MemberReads(connector, "t")  # type: ignore[arg-type]


def start(reads: MemberReads, stream: str, node: Address = N1) -> asyncio.Task[dict[str, int]]:
    return asyncio.ensure_future(reads.read(stream, node, TOPOLOGY.member_candidates(node)))


async def settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


async def test_reads_of_one_node_share_a_connection_parked_once_all_are_answered(members: MemberAnswers) -> None:
    connector = ReadingConnector()
    reads = reads_on(connector, members)
    a, b, other = start(reads, "a"), start(reads, "b"), start(reads, "c", N2)
    await settle()
    assert [(stream, conn.node) for stream, conn in members.sent] == [("a", N1), ("b", N1), ("c", N2)]
    assert len(connector.opened) == 2 and len(reads) == 2  # one per node
    members.answer("a")
    assert await a == {"first_chunk_id": 0}
    assert connector.parked == []  # (b is still under way on it: no placement may take it)
    members.answer("b", "c")
    await asyncio.gather(b, other)
    await settle()
    assert connector.parked == connector.opened and len(reads) == 0
    assert reads.opened == 2 and reads.detours == 0


async def test_a_read_held_behind_an_unanswered_one_goes_its_own_way(members: MemberAnswers) -> None:
    connector = ReadingConnector()
    reads = reads_on(connector, members)
    initialising, behind = start(reads, "initialising"), start(reads, "behind")
    await settle()
    first = connector.opened[0]
    await asyncio.sleep(QUEUE_BOUND * 1.5)
    assert [(stream, conn) for stream, conn in members.sent][-1][0] == "behind"
    assert len(connector.opened) == 2 and reads.detours == 1  # a reading connection of its own
    members.answer("behind")
    assert await behind == {"first_chunk_id": 0}
    await settle()
    assert connector.parked == [connector.opened[1]]  # the first one is still held by the initialising member
    later = start(reads, "later")  # (and the node's next reads do not go on the held one)
    await settle()
    assert members.sent[-1] == ("later", connector.opened[2]) and first not in connector.parked
    members.answer("later", "initialising")
    await asyncio.gather(initialising, later)
    await settle()
    assert first in connector.parked  # all its reads answered: usable again


async def test_a_read_first_in_line_waits_for_its_member_however_long(members: MemberAnswers) -> None:
    connector = ReadingConnector()
    reads = reads_on(connector, members)
    alone = start(reads, "initialising")
    await asyncio.sleep(QUEUE_BOUND * 1.5)
    assert not alone.done() and len(connector.opened) == 1 and reads.detours == 0
    members.answer("initialising")
    assert await alone == {"first_chunk_id": 0}


async def test_a_connection_with_a_read_that_failed_is_closed_once_the_others_are_over(members: MemberAnswers) -> None:
    connector = ReadingConnector()
    reads = reads_on(connector, members)
    members.errors["a"] = ConnectionFailed("the broker did not answer in time")
    a, b = start(reads, "a"), start(reads, "b")
    await settle()
    members.answer("a")
    with pytest.raises(ConnectionFailed):
        await a
    assert connector.closed == []  # (b is still under way on it)
    members.answer("b")
    assert await b == {"first_chunk_id": 0}
    await settle()
    assert (connector.closed, connector.parked) == (connector.opened, [])


async def test_a_broker_before_3_11_is_not_asked(members: MemberAnswers) -> None:
    connector = ReadingConnector(version="3.10.7")
    reads = reads_on(connector, members)
    with pytest.raises(FeatureNotSupported, match=r"3\.11 or later \(3\.10\.7\)"):
        await start(reads, "a")
    assert members.sent == [] and connector.parked == connector.opened  # (a healthy connection: kept)


async def test_close_stops_the_reads_under_way(members: MemberAnswers) -> None:
    connector = ReadingConnector()
    reads = reads_on(connector, members)
    a = start(reads, "a")
    await settle()
    reads.close()
    with pytest.raises(asyncio.CancelledError):
        await a
    await settle()
    assert connector.parked == connector.closed == []  # (the connector closes its connections itself)

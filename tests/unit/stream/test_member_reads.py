"""Member reads (MemberReads): a node's reads share one reading connection, a read held behind one still
unanswered goes its own way after QUEUE_BOUND, and a reading connection is parked once its reads were answered
(closed if one got no answer).  Fake connector, and a fake broker that answers each connection's StreamStats in
the order they were sent, each once the test lets its member answer.  No broker."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from smartclient import Address, ConnectionFailed, FeatureNotSupported, StreamNotFound
from smartclient.core.topology import StreamTopology
from smartclient.stream import _rstream
from smartclient.stream.member_reads import QUEUE_BOUND, MemberReads
from smartclient.stream.stats import STREAM_STATS_RESPONSE
from tests.conftest import wait_until

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
        self.closed: list[tuple[ReadingConn, bool]] = []  # (connection, with a Close exchange)

    async def acquire(self, candidates: Any, name: str) -> ReadingConn:
        await asyncio.sleep(0)  # (a dial takes a moment: reads that come meanwhile wait for it)
        conn = ReadingConn(candidates.all[0], self.version)
        self.opened.append(conn)
        return conn

    async def park(self, conn: ReadingConn, since: float | None = None) -> None:
        self.parked.append(conn)

    async def close_connection(self, conn: ReadingConn, handshake: bool = True) -> None:
        conn.closed = True
        self.closed.append((conn, handshake))


class MemberAnswers:
    """The broker's side: each connection's StreamStats answered in the order they were sent, each once its
    stream's gate opens (no answer at all for a stream in ``errors``; "no such stream" for one in ``missing``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.errors: dict[str, Exception] = {}
        self.missing: set[str] = set()
        self.sent: list[tuple[str, BrokerClient]] = []
        self.answered: list[tuple[str, BrokerClient]] = []
        last: dict[int, asyncio.Future[None]] = {}  # id(client) -> its last request's turn being over

        async def extra_request(client: Any, encode: Any, key: int) -> bytes:
            assert key == STREAM_STATS_RESPONSE
            frame = encode(7)
            (size,) = struct.unpack_from(">h", frame, 12)
            stream = frame[14 : 14 + size].decode()
            self.sent.append((stream, client))
            before, turn = last.get(id(client)), asyncio.get_running_loop().create_future()
            last[id(client)] = turn
            try:
                if before is not None:
                    await asyncio.shield(before)  # (the broker's process answers one after the other)
                await self.gate(stream).wait()
            finally:
                turn.set_result(None)
            if stream in self.errors:
                raise self.errors[stream]
            self.answered.append((stream, client))
            code = 2 if stream in self.missing else 1
            return struct.pack(">HHIHi", key, 1, 7, code, 0)

        monkeypatch.setattr(_rstream, "extra_request", extra_request)

    def gate(self, stream: str) -> asyncio.Event:
        return self.gates.setdefault(stream, asyncio.Event())

    def answer(self, *streams: str) -> None:
        for stream in streams:
            self.gate(stream).set()

    def streams_sent(self, conn: ReadingConn) -> list[str]:
        return [stream for stream, client in self.sent if client is conn.client]


@pytest.fixture
def members(monkeypatch: pytest.MonkeyPatch) -> MemberAnswers:
    return MemberAnswers(monkeypatch)


def start(reads: MemberReads, stream: str, node: Address = N1) -> asyncio.Task[dict[str, int]]:
    return asyncio.ensure_future(reads.read(stream, node, TOPOLOGY.member_candidates(node)))


async def settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


def reads_on(connector: ReadingConnector) -> MemberReads:
    return MemberReads(connector, "t")  # type: ignore[arg-type]


async def test_reads_of_one_node_share_a_connection_parked_once_all_are_answered(members: MemberAnswers) -> None:
    connector = ReadingConnector()
    reads = reads_on(connector)
    a, b, other = start(reads, "a"), start(reads, "b"), start(reads, "c", N2)
    await settle()
    first, second = connector.opened  # one per node
    assert (members.streams_sent(first), members.streams_sent(second)) == (["a", "b"], ["c"])
    members.answer("a")
    assert await a == {}
    assert connector.parked == []  # (b is still under way on it: no placement may take it)
    members.answer("b", "c")
    await asyncio.gather(b, other)
    await settle()
    assert connector.parked == [first, second] and len(reads) == 0
    assert reads.opened == 2 and reads.detours == 0


async def test_a_read_held_behind_an_unanswered_one_goes_its_own_way(members: MemberAnswers) -> None:
    connector = ReadingConnector()
    reads = reads_on(connector)
    initialising, behind = start(reads, "initialising"), start(reads, "behind")
    # (not a fixed sleep past QUEUE_BOUND: CI 2026-12-04, a loaded machine, had opened only one by then)
    await wait_until(lambda: len(members.sent) == 3, 10, lambda: f"the detour; sent so far: {members.sent}")
    held, own = connector.opened
    assert (members.streams_sent(held), members.streams_sent(own)) == (["initialising", "behind"], ["behind"])
    assert reads.detours == 1
    members.answer("behind")
    assert await behind == {}
    await settle()
    assert connector.parked == [own]  # the held one waits on: its broker process answers in order
    later = start(reads, "later")  # (the node's next reads do not go on the held one)
    await settle()
    assert members.streams_sent(held) == ["initialising", "behind"] and not later.done()
    members.answer("later")
    await later
    members.answer("initialising")
    assert await initialising == {}
    await settle()
    assert members.answered[-2:] == [("initialising", held.client), ("behind", held.client)]
    assert connector.parked[-1] is held and connector.closed == []  # every read on it answered: usable again
    assert len(reads) == 0


async def test_a_read_first_in_line_waits_for_its_member_however_long(members: MemberAnswers) -> None:
    connector = ReadingConnector()
    reads = reads_on(connector)
    alone = start(reads, "initialising")
    await asyncio.sleep(QUEUE_BOUND * 1.5)
    assert not alone.done() and len(connector.opened) == 1 and reads.detours == 0
    members.answer("initialising")
    assert await alone == {}


async def test_a_connection_a_request_got_no_answer_on_is_closed_once_the_others_are_over(
        members: MemberAnswers) -> None:
    connector = ReadingConnector()
    reads = reads_on(connector)
    members.errors["a"] = ConnectionFailed("the broker did not answer in time")
    a, b = start(reads, "a"), start(reads, "b")
    await settle()
    members.answer("a")
    with pytest.raises(ConnectionFailed):
        await a
    assert connector.closed == []  # (b is still under way on it)
    members.answer("b")
    assert await b == {}
    await settle()
    assert (connector.closed, connector.parked) == ([(connector.opened[0], False)], [])


async def test_an_answer_that_the_stream_is_gone_leaves_the_connection_usable(members: MemberAnswers) -> None:
    connector = ReadingConnector()
    reads = reads_on(connector)
    members.missing.add("gone")
    members.answer("gone")
    with pytest.raises(StreamNotFound):
        await start(reads, "gone")
    await settle()
    assert connector.parked == connector.opened and connector.closed == []


async def test_a_broker_before_3_11_is_not_asked(members: MemberAnswers) -> None:
    connector = ReadingConnector(version="3.10.7")
    reads = reads_on(connector)
    with pytest.raises(FeatureNotSupported, match=r"3\.11 or later \(3\.10\.7\)"):
        await start(reads, "a")
    assert members.sent == [] and connector.parked == connector.opened  # (a healthy connection: kept)


async def test_close_stops_every_read_and_drops_every_reading_connection_at_once(members: MemberAnswers) -> None:
    connector = ReadingConnector()
    reads = reads_on(connector)
    initialising, behind = start(reads, "initialising"), start(reads, "behind")
    # behind went its own way: two reading connections, one held
    await wait_until(lambda: len(members.sent) == 3, 10, lambda: f"the detour; sent so far: {members.sent}")
    await reads.close()
    for read in (initialising, behind):
        with pytest.raises(asyncio.CancelledError):
            await read
    await settle()
    assert sorted(connector.closed, key=lambda c: connector.opened.index(c[0])) == [
        (conn, False) for conn in connector.opened]
    assert connector.parked == [] and len(reads) == 0
    with pytest.raises(ConnectionFailed, match="closed"):
        await start(reads, "after")

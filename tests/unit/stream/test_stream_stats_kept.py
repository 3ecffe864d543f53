"""StreamStats on a connection of its own (stream_stats_from): on a 3.11+ broker it is sent in place, and the
connection is parked once it answered when it came from the parking lot; otherwise, and whenever it failed, it
is closed.  Fake connector and requests: no broker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from smartclient import Address, ConnectionFailed
from smartclient.core.topology import StreamTopology
from smartclient.stream import _rstream
from smartclient.stream._rstream.wire import EXTRA_RESPONSES
from smartclient.stream.stats import STREAM_STATS_KEY, stream_stats_from

NODE = Address("n1", 5552)
CANDIDATES = StreamTopology("s", NODE, ()).member_candidates(NODE)


class Client:
    def __init__(self, version: str) -> None:
        self.server_properties = {"version": version}


class Conn:
    def __init__(self, version: str, sessions: int) -> None:
        self.client, self.sessions = Client(version), sessions
        self.idle_since = 100.0 if sessions == 0 else None  # (parked at 100.0, when taken from the parking lot)

    def alive(self) -> bool:
        return True


class Connector:
    def __init__(self, conn: Conn) -> None:
        self.conn, self.parked, self.closed = conn, [], []  # type: tuple[Conn, list[Conn], list[Conn]]
        self.since: list[float | None] = []

    async def acquire(self, candidates: Any, name: str) -> Conn:
        return self.conn

    async def park(self, conn: Conn, since: float | None = None) -> None:
        self.parked.append(conn)
        self.since.append(since)

    async def close_connection(self, conn: Conn, handshake: bool = True) -> None:
        self.closed.append(conn)


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []
    answer = (STREAM_STATS_KEY | 0x8000).to_bytes(2, "big") + bytes(6) + (1).to_bytes(2, "big") + bytes(4)

    async def extra_request(client: Any, encode: Any, key: int) -> bytes:
        sent.append("in place")
        if getattr(client, "fail", False):
            raise ConnectionFailed("the connection ended")
        return answer

    async def raw_request(client: Any, frame: bytes, key: int, refused: Any) -> bytes:
        sent.append("reader stopped")
        return answer

    monkeypatch.setattr(_rstream, "extra_request", extra_request)
    monkeypatch.setattr(_rstream, "raw_request", raw_request)
    return sent


def read(connector: Connector) -> dict[str, int]:
    return asyncio.run(stream_stats_from(connector, CANDIDATES, "s", "t"))  # type: ignore[arg-type]


def test_the_seam_hands_a_stream_stats_answer_back() -> None:
    assert STREAM_STATS_KEY | 0x8000 in EXTRA_RESPONSES


@pytest.mark.parametrize(("version", "sessions", "sent", "parked", "since"), [
    ("4.3.6", 1, "in place", False, None),  # dialled for this read alone: closed
    ("4.0.5", 0, "in place", True, 100.0),  # borrowed from the parking lot: back, its idle time going on
    ("3.10.7", 1, "reader stopped", False, None),  # a broker that would close it: asked the old way, closed
    ("", 0, "reader stopped", False, None),
])
def test_where_the_connection_goes_after_an_answer(requests: list[str], version: str, sessions: int, sent: str,
                                                   parked: bool, since: float | None) -> None:
    connector = Connector(Conn(version, sessions))
    assert read(connector) == {}
    assert requests == [sent]
    assert (connector.parked, connector.closed) == (([connector.conn], []) if parked else ([], [connector.conn]))
    assert connector.since == ([since] if parked else [])


def test_a_read_that_failed_closes_its_connection(requests: list[str]) -> None:
    connector = Connector(Conn("4.3.6", 1))
    connector.conn.client.fail = True  # type: ignore[attr-defined]
    with pytest.raises(ConnectionFailed):
        read(connector)
    assert (connector.parked, connector.closed) == ([], [connector.conn])

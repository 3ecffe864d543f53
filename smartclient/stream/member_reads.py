"""Member reads: the StreamStats a recovering consumer asks a stream's member with before it subscribes there
(:meth:`~smartclient.stream.carriers.Carriers.member_ready`), on a reading connection per node that the
Environment's reads of that node share.

A member that a restart or a leader change has just started answers only once it has initialised, and the
broker's process of the connection that asks waits for it meanwhile, serving nothing else
(``bench/tail_stall/member_wait.py``).  So:

- a read never goes on a connection a producer or consumer uses, and a reading connection is parked (for the
  placement about to dial that node, or the node's next read) only once every read sent on it was answered;
- a read sent behind another that is still unanswered :data:`QUEUE_BOUND` seconds later goes its own way: to a
  new reading connection for that node, which the node's next reads share.  The first one stays until its
  reads are answered (one where a read got no answer is closed, not parked: its broker process may still
  be held).

Each read had a connection of its own before: after a node loss, a fleet of 20 processes made 377 dials for its
reads, for 215 handles back (``bench/scale.py --fleet``), when two or three per process reach both nodes left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from smartclient._errors import ConnectionFailed, FeatureNotSupported
from smartclient.core.address import Address

if TYPE_CHECKING:
    from smartclient.core.topology import Candidates
    from smartclient.stream.connector import StreamConnector
    from smartclient.stream.host import Connection

__all__ = ["QUEUE_BOUND", "MemberReads"]

log = logging.getLogger(__name__)
#: seconds a read sent behind another still unanswered waits before it goes its own way (a member answers in a
#: few milliseconds once it can be read: a read that waits longer waits for one that is initialising)
QUEUE_BOUND = 0.1
Stats = dict[str, int]


class _Reader:
    """A reading connection, and the reads under way on it (in the order they were sent, with when)."""

    __slots__ = ("conn", "failed", "gone", "pending")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pending: dict[asyncio.Future[Stats], float] = {}
        self.failed = False  # a request here got no answer: closed once the others are over, never parked
        self.gone = False  # let go: parked or closed

    def takes_more(self, now: float) -> bool:
        """Alive, with no read under way for :data:`QUEUE_BOUND` (one that has been is held: reads behind it went
        their own way, and so do the next ones until it is let go)."""
        return self.conn.alive() and all(now - sent < QUEUE_BOUND for sent in self.pending.values())

    def behind(self, request: asyncio.Future[Stats]) -> bool:
        """Whether a read sent before ``request`` is still unanswered."""
        return next(iter(self.pending), request) is not request


class MemberReads:
    """The reading connections of one Environment's stream wing, a node's reads sharing one (see the module)."""

    def __init__(self, connector: StreamConnector, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._connector = connector
        self._name = name
        self._clock = clock
        self._readers: dict[Address, _Reader] = {}  # node -> the reading connection its next reads go on
        self._live: set[_Reader] = set()  # every reading connection not let go (the node's, and those held)
        self._opening: dict[Address, asyncio.Future[_Reader]] = {}
        self._ending: set[asyncio.Future[None]] = set()  # connections being parked or closed
        self._closed = False
        self.opened = 0  # reading connections taken (parked or dialled)
        self.detours = 0  # reads that went their own way, behind one unanswered

    def __len__(self) -> int:  # (reading connections, opening or not let go: the soak's accounting)
        return len(self._live) + len(self._opening) + len(self._ending)

    async def read(self, stream: str, node: Address, candidates: Candidates) -> Stats:
        """``stream``'s statistics as its member on ``node`` (reached through ``candidates``) gives them, once
        it can be read: each request within the default step (``core.deadline``).

        :raises FeatureNotSupported: the broker does not answer StreamStats (before RabbitMQ 3.11).
        :raises ConnectionFailed: no answer (the connection ended, or the step ran out), or the Environment
            is closed."""
        from smartclient.stream._rstream import map_stream_errors

        with map_stream_errors(f"reading the statistics of {stream!r}"):
            while True:
                reader = await self._reader(node, candidates)
                request = self._send(node, reader, stream)
                if reader.behind(request):
                    done, _ = await asyncio.wait({request}, timeout=QUEUE_BOUND)
                    if not done and reader.behind(request):  # (held by a member still initialising)
                        self.detours += 1
                        log.debug("a read of %s on %s waits behind another: a reading connection of its own",
                                  stream, node)
                        continue
                return await asyncio.shield(request)

    async def _reader(self, node: Address, candidates: Candidates) -> _Reader:
        """The node's reading connection, if it takes more reads, or the one opening for it (opened if none is)."""
        while True:
            if self._closed:
                raise ConnectionFailed("the Environment is closed: no member read")
            reader = self._readers.get(node)
            if reader is not None and reader.takes_more(self._clock()):
                return reader
            opening = self._opening.get(node)
            if opening is None:
                opening = self._opening[node] = asyncio.ensure_future(self._open(node, candidates))
                opening.add_done_callback(partial(self._opened, node))
            reader = await asyncio.shield(opening)
            if self._readers.get(node) is reader:  # (not let go meanwhile: its first reads were over at once)
                return reader

    async def _open(self, node: Address, candidates: Candidates) -> _Reader:
        from smartclient.stream._rstream import broker_version

        conn = await self._connector.acquire(candidates, f"{self._name}-ready")
        self.opened += 1
        if (version := broker_version(conn.client)) < (3, 11):  # (it would close the connection: not asked)
            await self._connector.park(conn)
            raise FeatureNotSupported("the broker does not answer StreamStats: it needs RabbitMQ 3.11 or later"
                                      f" ({'.'.join(map(str, version)) or 'it gave no version'})")
        reader = self._readers[node] = _Reader(conn)
        self._live.add(reader)
        if self._closed:  # (close() came during the dial)
            self._let_go(node, reader)
        # (each waiter sends at once: one that was cancelled meanwhile leaves a reader nobody read on)
        asyncio.get_running_loop().call_later(QUEUE_BOUND, self._unused, node, reader)
        return reader

    def _opened(self, node: Address, opening: asyncio.Future[_Reader]) -> None:
        if self._opening.get(node) is opening:
            del self._opening[node]
        if not opening.cancelled():
            opening.exception()  # (its waiters were told, or have gone)

    def _send(self, node: Address, reader: _Reader, stream: str) -> asyncio.Future[Stats]:
        request = asyncio.ensure_future(self._ask(reader, stream))
        reader.pending[request] = self._clock()
        request.add_done_callback(partial(self._answered, node, reader))
        return request

    @staticmethod
    async def _ask(reader: _Reader, stream: str) -> Stats:
        from smartclient.core.deadline import step
        from smartclient.stream.stats import decode_stream_stats, request_stream_stats

        try:
            raw = await step("stream statistics", request_stream_stats(reader.conn.client, stream))
        except BaseException:  # (no answer: the broker's process may still be held by it)
            reader.failed = True
            raise
        return decode_stream_stats(raw, stream)  # (an answer, even "no such stream": the connection is fine)

    def _answered(self, node: Address, reader: _Reader, request: asyncio.Future[Stats]) -> None:
        del reader.pending[request]
        if request.cancelled():
            reader.failed = True
        else:
            request.exception()  # (its waiter was told, or went its own way)
        if not reader.pending:
            self._let_go(node, reader)

    def _unused(self, node: Address, reader: _Reader) -> None:
        if not reader.pending:
            self._let_go(node, reader)

    def _let_go(self, node: Address, reader: _Reader) -> None:
        """Every read on ``reader`` is over: parked (healthy) or closed (one got no answer), and no longer the
        node's.  After :meth:`close`, which closes them all, nothing more."""
        if reader.gone:
            return
        reader.gone = True
        self._live.discard(reader)
        if self._readers.get(node) is reader:
            del self._readers[node]
        if self._closed:
            return
        conn = reader.conn
        if not reader.failed and conn.alive():
            ending = asyncio.ensure_future(self._connector.park(conn))
        else:  # (no Close exchange: the broker's process may still be held by the read that failed)
            ending = asyncio.ensure_future(self._connector.close_connection(conn, handshake=False))
        self._ending.add(ending)
        ending.add_done_callback(self._ended)

    def _ended(self, ending: asyncio.Future[None]) -> None:
        self._ending.discard(ending)
        if not ending.cancelled() and (error := ending.exception()) is not None:
            log.debug("letting a reading connection go: %s", error)

    async def close(self) -> None:
        """Stop every read and opening under way, and close every reading connection not let go, at once (no
        Close exchange: a member still initialising holds the broker's process, which would not answer one)."""
        self._closed = True
        for opening in list(self._opening.values()):
            opening.cancel()
        live = list(self._live)
        for reader in live:
            for request in list(reader.pending):
                request.cancel()
        for reader in live:
            await self._connector.close_connection(reader.conn, handshake=False)
        for ending in list(self._ending):
            await asyncio.wait({ending})

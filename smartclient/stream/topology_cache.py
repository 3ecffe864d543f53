"""The topology cache: one locator connection, and each stream's leader and replicas.

Lookups of one stream that overlap share one request.  A cached topology is dropped on a MetadataUpdate,
on the loss of a connection to one of its members, on a node mismatch, or after ``max_age`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from smartclient._errors import REFUSALS, ConnectionFailed, HandleClosed, SmartClientError, StepTimeout, StreamNotReady
from smartclient.core.address import Address
from smartclient.core.deadline import TOPOLOGY_READ, detach, remaining, step
from smartclient.core.entry_points import EntryPoints
from smartclient.core.retry import Backoff, RetryPolicy
from smartclient.core.topology import Candidates, PlacementPolicy, Role, StreamTopology, replica_wait
from smartclient.stream import _rstream
from smartclient.stream._rstream import map_stream_errors

if TYPE_CHECKING:
    from resolvers import SrvDiscovery
    from smartclient.stream.connector import StreamConnector
    from smartclient.stream.host import Connection

__all__ = ["TOPOLOGY_TIME", "TopologyCache"]

T = TypeVar("T")

log = logging.getLogger(__name__)

TOPOLOGY_TIME = 5.0  # seconds a metadata lookup keeps asking while the stream has no leader, since its last asker
# a stream with no leader: asking again soon, then a little less (a leader named between two asks is a wait of the
# client's own: the soak measured up to the whole step, 0.5 s, at 2 asks a second)
ELECTION_POLL = Backoff(initial=0.05, factor=1.5, max=0.15)
#: seconds a lookup is told "no leader" by its locator before it also asks another node
SECOND_OPINION = 1.0
#: seconds one Metadata request may take: a locator on a node that is stopping (stop_app, a rolling restart)
#: neither answers nor closes for seconds; after this it is dropped and another one asked (it answers in
#: milliseconds otherwise)
METADATA_TIME = 1.0  # (0.5 s dropped locators over and over while the coordinator elected: it answers late then)
TOPOLOGY_LIMIT = 30.0  # seconds a lookup asks at most, however often callers join it
#: seconds a lookup's connection to another node may take to open (the LB may first send it to the stopping node:
#: the connector's second dial beside it, RetryPolicy.hedge_after, goes elsewhere), and tries per lookup
OTHER_NODE_TIME = 1.5
OTHER_NODE_TRIES = 3
NODE_MEMORY = 3600.0  # seconds a node a topology named is kept as one to ask (nodes leave a cluster too)
DROPPED_GRACE = 10.0  # seconds a dropped locator stays open for the requests other callers made on it
# a new stream's replicas come up a moment after its leader (core.topology.replica_wait says how long to wait)
REPLICA_POLL = Backoff.steady(0.1)


class TopologyCache:
    """Each stream's members, read through the shared locator connection."""

    def __init__(self, connector: StreamConnector, entry_points: tuple[Address, ...], srv: SrvDiscovery | None,
                 connection_name: str, max_age: float, policy: PlacementPolicy, retry: RetryPolicy) -> None:
        self.connector = connector
        self.entry_points = entry_points
        self._srv = srv
        self.connection_name = connection_name
        self.max_age = max_age
        self.policy = policy
        self.retry = retry
        self._topologies: dict[str, StreamTopology] = {}
        self._routed: dict[str, StreamTopology] = {}  # the same, with where each member is dialled (to show)
        self._on_node: dict[Address, set[str]] = {}  # the cached topologies with a member on each node
        self.metadata_requests = 0  # Metadata commands sent, to the locator or another node (bench/scale.py)
        self._inflight: dict[str, asyncio.Task[StreamTopology]] = {}
        self._asked: dict[str, float] = {}  # stream -> when a caller last joined its lookup under way
        self._nodes: dict[Address, float] = {}  # members topologies named, and when (another node to ask)
        self._dials: set[asyncio.Future[None]] = set()  # lookups' dials to another node under way
        # the locator's Connection, held here: its client refers to it only weakly (``_rstream.attach``), and the
        # connector does not hold a locator's
        self._locator_conn: Connection | None = None
        self._aside_conn: Connection | None = None  # for the requests that wait on a member (see aside)
        self._aside_lock = asyncio.Lock()
        self._lock = asyncio.Lock()
        self._closed = False
        self._closing: dict[asyncio.Future[None], Any] = {}  # dropped connections being shut -> their client

    # -- the locator -------------------------------------------------------------------------------
    async def locator(self) -> Any:
        """The shared metadata connection, to the first entry point that answers.

        :raises ConnectionFailed: no entry point could be reached (each one's error is listed).
        :raises AuthenticationFailed: the credentials or vhost were refused (not tried elsewhere).
        """
        async with self._lock:
            if self._closed:
                raise HandleClosed("the Environment is closed")
            if self._locator is not None and self._locator.is_connection_alive():
                return self._locator
            conn = self._locator_conn = await self._dial_entry("locator", _rstream.LocatorClient)
            return conn.client

    async def _dial_entry(self, purpose: str, client_class: type[Any] | None = None) -> Connection:
        """A connection to the first entry point that answers, owned by the caller (not by a producer or
        consumer)."""
        entries = EntryPoints(await self._srv.discover() if self._srv is not None else self.entry_points,
                              "the stream locator")
        while (entry := entries.next_entry()) is not None:
            try:
                conn = await self.connector.dial(entry, f"{self.connection_name}-{purpose}", client_class)
            except SmartClientError as exc:
                entries.failed(entry, self.connector.dialled.get(entry), exc)  # refusals raise at once
                continue
            self.connector.connections.discard(conn)
            return conn
        raise entries.error()

    async def on_own_connection(self, purpose: str, request: Callable[[Any], Awaitable[T]]) -> T:
        """``request(client)`` on a connection of its own to an entry point, closed after it: for the commands
        the broker runs in the connection's own process for many seconds (a super stream's creation or deletion,
        14 s for 500 partitions on the test bed).  That process reads nothing meanwhile, so the broker's
        heartbeat check sees the client silent and closes the connection right after answering: on the locator,
        the next request there failed."""
        conn = await self._dial_entry(purpose)
        try:
            return await request(conn.client)
        finally:
            await self.connector.close_connection(conn, handshake=False)

    async def aside(self, stream: str, purpose: str, request: Callable[[Any], Awaitable[T]]) -> T:
        """``request(client)`` about ``stream`` on the Environment's second metadata connection, not the locator:
        for the requests the broker answers only after asking a stream member process.

        QueryOffset and QueryPublisherSequence ask the stream's writer, and ResolveOffsetSpec a member; the broker
        process of the connection waits for that member and serves nothing else meanwhile.  A member that a
        restart or a leader change has just started answers only once it has initialised (22.5 s once in the
        2-hour soak), and a QueryOffset kept past 5 s crashes the whole connection: on the locator, that held
        every topology read of the Environment, and then closed it; on a producer's connection, every producer on
        it (``bench/tail_stall/member_wait.py``).  The connection goes to any member of ``stream`` (any node
        answers these), and stays for the next request.  A request that does not end there (its time ran out, or
        the connection went) leaves it to what it waits on: the next request opens another.  ``purpose`` names
        the request in the log."""
        async with self._aside_lock:
            if self._closed:
                raise HandleClosed("the Environment is closed")
            conn = self._aside_conn
            if conn is None or not conn.client.is_connection_alive():
                # any member of any stream answers: a cached topology's, so that no election is waited for
                topology = next(iter(self._topologies.values()), None) or await self.topology(stream)
                conn = await self.connector.acquire(topology.candidates(Role.LOCATOR), f"{self.connection_name}-aside")
                self.connector.connections.discard(conn)  # owned here, not by a producer or consumer
                if self._closed:  # (closed while it was dialled)
                    await self.connector.close_connection(conn, handshake=False)
                    raise HandleClosed("the Environment is closed")
                self._aside_conn = conn
        try:
            return await request(conn.client)
        except (asyncio.CancelledError, StepTimeout, ConnectionFailed, OSError):
            if self._aside_conn is conn:
                log.info("%s on the aside connection did not end: another one is opened for the next request",
                         purpose)
                self._aside_conn = None
                self._shut_later(conn)
            raise

    @property
    def _locator(self) -> Any:
        return self._locator_conn.client if self._locator_conn is not None else None

    def _drop_locator(self, locator: Any) -> None:
        if self._locator_conn is not None and self._locator_conn.client is locator:
            log.info("the locator connection did not answer within %.1f s: another one is opened (this one is shut in "
                     "%.0f s)", METADATA_TIME, DROPPED_GRACE)
            self._shut_later(self._locator_conn)
            self._locator_conn = None

    def _shut_later(self, conn: Connection) -> None:
        """Shut a dropped connection once what other callers still asked of it has had :data:`DROPPED_GRACE`
        seconds to be answered (at once if the Environment closes first).  Shut by this side: not a loss (see
        ``StreamConnector._closed``)."""
        conn.closed = True
        task = asyncio.ensure_future(_quietly_shut(conn.client))
        self._closing[task] = conn.client
        task.add_done_callback(lambda done: self._closing.pop(done, None))

    async def close(self) -> None:
        self._closed = True
        lookups = list(self._inflight.values())
        for task in lookups:
            task.cancel()
        # (each closes its connection to another node, and a dial still under way closes what it opens)
        await asyncio.gather(*lookups, *self._dials, return_exceptions=True)
        if self._locator_conn is not None and isinstance(self._locator_conn.client, _rstream.LocatorClient):
            self._locator_conn.closed = True  # (shut by this side: not a loss)
            await self._locator_conn.client.shutdown()
        if self._aside_conn is not None:  # (at once: it may be waiting on a member, which would not let it answer)
            await self.connector.close_connection(self._aside_conn, handshake=False)
            self._aside_conn = None
        for shutting, client in list(self._closing.items()):
            shutting.cancel()
            await _rstream.abort(client)

    # -- topologies ----------------------------------------------------------------------------------
    async def topology(self, stream: str) -> StreamTopology:
        """The stream's leader and replicas, from the cache or the broker.

        :raises StreamNotFound: the stream does not exist.
        :raises StreamNotReady: it has no leader within a few seconds.
        """
        cached = self._topologies.get(stream)
        if cached is not None and time.monotonic() - cached.read_at < self.max_age:
            return cached
        task = self._inflight.get(stream)
        if task is None:
            task = asyncio.create_task(self._query(stream))
            self._inflight[stream] = task
            # (its error is read here too: every asker may have stopped waiting before it ended)
            task.add_done_callback(lambda done: (self._inflight.pop(stream, None), self._asked.pop(stream, None),
                                                 done.cancelled() or done.exception()))
        self._asked[stream] = time.monotonic()
        return await step(f"{TOPOLOGY_READ} of {stream!r}", asyncio.shield(task))

    async def _query(self, stream: str) -> StreamTopology:
        # shared by every placement that asks meanwhile: bounded on its own (each asker bounds its wait)
        detach()
        polls = 0
        began = time.monotonic()
        other = _OtherNode(stream)
        try:
            while True:
                if time.monotonic() - began >= SECOND_OPINION:
                    self._open_another(other)  # (in the background: the locator is asked on meanwhile)
                if other.conn is None:
                    members = await self._ask_locator(stream)
                else:  # both at once: the first to name a leader
                    members = await self._ask_both(stream, other)
                if members is None and (self._late(stream) or time.monotonic() - began > TOPOLOGY_LIMIT):
                    raise StreamNotReady(f"reading the topology of {stream!r}: the stream has no leader available yet")
                if members is None:  # an election: ask again soon
                    polls += 1
                    await asyncio.sleep(ELECTION_POLL.delay(polls))
                    continue
                leader, replicas = members  # advertised addresses: resolved only when dialled (one seam)
                self._seen((leader, *replicas))
                topo = StreamTopology(stream, leader, tuple(replicas))
                self._keep(topo)
                return topo
        finally:  # (a dial still under way closes what it opens: it sees ``over``)
            other.over = True
            if other.conn is not None:
                await self.connector.close_connection(other.conn, handshake=False)

    async def _ask_both(self, stream: str, other: _OtherNode) -> tuple[Address, list[Address]] | None:
        """The locator and ``other``'s node asked at once: the first answer naming a leader (the other request
        is cancelled); None if neither does.  The locator's error is raised only if the other named none."""
        asks = {asyncio.ensure_future(self._ask_locator(stream)): True, asyncio.ensure_future(self._ask_another(other)):
                False}
        pending: set[asyncio.Future[Any]] = set(asks)
        members: tuple[Address, list[Address]] | None = None
        error: BaseException | None = None
        try:
            while pending and members is None:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for ask in done:
                    if ask.exception() is not None:
                        if isinstance(ask.exception(), REFUSALS):  # (from either: every node would repeat it)
                            raise ask.exception()
                        if asks[ask]:
                            error = ask.exception()
                        else:
                            log.info("reading the topology of %r on another node: %s", stream, ask.exception())
                    elif members is None:
                        members = ask.result()
        finally:
            for ask in pending:
                ask.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if members is None and error is not None:
            raise error
        return members

    def _seen(self, nodes: Iterable[Address]) -> None:
        """Members a topology named: nodes another lookup may ask (each kept for :data:`NODE_MEMORY` seconds)."""
        now = time.monotonic()
        for node in [node for node, at in self._nodes.items() if now - at > NODE_MEMORY]:
            del self._nodes[node]
        self._nodes.update(dict.fromkeys(nodes, now))

    async def _ask_locator(self, stream: str) -> tuple[Address, list[Address]] | None:
        """The locator's answer: the members, or None while the stream has no leader, or while the locator's
        node went away or did not answer in time (its node stopping: it is dropped); the next ask opens another.

        :raises ConnectionFailed: so, once the lookup is late (see :meth:`_late`).
        :raises AuthenticationFailed: at once (and so every refusal another node would repeat: a token expired or
            refused, a token provider failing, a certificate rejected): asking again would only repeat it."""
        try:
            locator = await self.locator()
            try:
                self.metadata_requests += 1
                with map_stream_errors(f"reading the topology of {stream!r}"):
                    return await step("metadata query", _rstream.leader_and_replicas(locator, stream),
                                      default=METADATA_TIME)
            except StepTimeout:
                self._drop_locator(locator)
                raise
        except REFUSALS:
            raise
        except ConnectionFailed:
            if self._late(stream):
                raise
            return None

    def _open_another(self, other: _OtherNode) -> None:
        """Open ``other``'s connection to another node than the locator's (not one that failed it), in the
        background, unless it is open, opening, or out of tries: the broker answers Metadata from its node's own
        copy of the stream coordinator's state, and the locator's node may be one that is stopping, whose copy
        no longer follows (the 45-minute soak: clients told "no leader" for 2 s after their stream took a write
        again)."""
        if other.conn is not None or other.opening is not None or other.tries >= OTHER_NODE_TRIES:
            return
        mine = self._locator_conn.node if self._locator_conn is not None else None
        nodes = list(set(self._nodes) - {mine} - other.failed)
        if not nodes:
            return
        random.shuffle(nodes)
        other.tries += 1
        other.opening = asyncio.ensure_future(self._dial_another(other, tuple(nodes)))
        self._dials.add(other.opening)  # (close() waits for it: what it opens late, it closes)
        other.opening.add_done_callback(self._dials.discard)

    async def _dial_another(self, other: _OtherNode, nodes: tuple[Address, ...]) -> None:
        try:
            conn = await step("opening a connection to another node", self.connector.acquire(
                Candidates(other.stream, Role.LOCATOR, (nodes,)), f"{self.connection_name}-metadata"),
                default=OTHER_NODE_TIME)
        except Exception as exc:  # (the next ask may open another, up to OTHER_NODE_TRIES)
            log.info("reading the topology of %r on another node: %s", other.stream, exc)
            return
        finally:
            other.opening = None
        self.connector.connections.discard(conn)  # owned by the lookup, closed at its end
        if other.over or self._closed:  # (it ended while this one opened)
            await self.connector.close_connection(conn, handshake=False)
            return
        other.conn = conn

    async def _ask_another(self, other: _OtherNode) -> tuple[Address, list[Address]] | None:
        """``other``'s node's answer, None if it names no leader; on a failure its connection is closed (the next
        ask may open another, up to :data:`OTHER_NODE_TRIES`)."""
        conn = other.conn
        assert conn is not None
        self.metadata_requests += 1
        try:
            with map_stream_errors(f"reading the topology of {other.stream!r} on another node"):
                return await step("metadata query (another node)",
                                  _rstream.leader_and_replicas(conn.client, other.stream), default=METADATA_TIME)
        except REFUSALS:
            raise
        except Exception as exc:
            log.info("reading the topology of %r on another node (%s): %s", other.stream, conn.node, exc)
            if other.conn is conn:
                other.conn = None
                other.failed.add(conn.node)
                await self.connector.close_connection(conn, handshake=False)
            return None

    def _late(self, stream: str) -> bool:
        """Whether the shared lookup of ``stream`` has asked for :data:`TOPOLOGY_TIME` seconds since the last
        caller joined it (one that joined late, a recovery's next attempt, is not told "no leader" at once)."""
        return time.monotonic() - self._asked.get(stream, 0.0) > TOPOLOGY_TIME

    async def with_routes(self, topo: StreamTopology) -> StreamTopology:
        """``topo`` with where each member would be dialled (or why it cannot be), for people to read; the
        answers come from the one resolution seam, as a connection's would."""
        routed = self._routed.get(topo.stream)
        if routed is not None and routed.read_at == topo.read_at:
            return routed
        dial: dict[Address, Address | str] = {}
        for member in topo.members:
            try:
                dial[member] = await self.connector.resolve(member)
            except SmartClientError as exc:
                dial[member] = f"{type(exc).__name__}: {exc}"
        routed = self._routed[topo.stream] = replace(topo, dial=dial)
        return routed

    def __contains__(self, stream: object) -> bool:
        """Whether ``stream``'s topology is cached."""
        return stream in self._topologies

    def drop(self, stream: str | None = None, node: Address | None = None) -> None:
        """Forget cached topologies: one stream's, those with a member on ``node``, or all (what it costs follows
        the topologies forgotten, not those cached: a node's connections closing one by one each drop it)."""
        if stream is None and node is None:
            names: list[str] = list(self._topologies)
        else:
            names = [stream] if stream is not None else []
            names += self._on_node.get(node, ()) if node is not None else ()
        for name in names:
            self._forget(name)

    def _keep(self, topo: StreamTopology) -> None:
        self._forget(topo.stream)
        self._topologies[topo.stream] = topo
        for member in topo.members:
            self._on_node.setdefault(member, set()).add(topo.stream)

    def _forget(self, stream: str) -> None:
        topo = self._topologies.pop(stream, None)
        self._routed.pop(stream, None)  # (kept only beside a cached topology: a deleted stream's goes with it)
        for member in topo.members if topo is not None else ():
            streams = self._on_node[member]
            streams.discard(stream)
            if not streams:
                del self._on_node[member]

    async def on_metadata_update(self, frame: Any) -> None:
        stream = _rstream.metadata_stream(frame)
        log.info("MetadataUpdate for %s: topology invalidated", stream)
        self.drop(stream=stream)

    async def candidates(self, stream: str, role: Role, load: Mapping[Address, int] | None = None,
                         recovering: bool = False) -> Candidates:
        """The nodes a producer or consumer of ``stream`` may use, by tier (see :class:`Candidates`);
        ``recovering``: while one of the stream's recovers (see :func:`replica_wait`)."""
        topo = await self.topology(stream)
        wait = replica_wait(topo, role, self.policy, self.retry.max_time, recovering)
        if wait:
            deadline = time.monotonic() + min(wait, remaining(wait))
            polls = REPLICA_POLL.delays()
            while not topo.replicas and time.monotonic() < deadline:
                await asyncio.sleep(next(polls))
                self.drop(stream=stream)
                topo = await self.topology(stream)
        return topo.candidates(role, self.policy, load)


class _OtherNode:
    """A lookup's connection to another node than the locator's (see ``_open_another``)."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.conn: Connection | None = None
        self.opening: asyncio.Future[None] | None = None
        self.tries = 0  # connections opened (or tried)
        self.failed: set[Address] = set()  # nodes whose connection failed in this lookup
        self.over = False  # the lookup has ended


async def _quietly_shut(locator: Any) -> None:
    """Shut a dropped locator once what other callers still asked of it (a create, a delete, an offset query) has had
    :data:`DROPPED_GRACE` seconds to be answered: no new request goes to it meanwhile."""
    await asyncio.sleep(DROPPED_GRACE)
    try:
        await asyncio.wait_for(locator.shutdown() if hasattr(locator, "shutdown") else locator.close(), 5)
    except Exception as exc:  # it was not answering anyway
        log.debug("shutting a dropped locator: %s", exc)

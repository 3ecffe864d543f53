"""Stream placement: which connection a producer or consumer of a stream uses.

An Environment's producers share one connection per node, and so do its consumers (up to
``PoolLimits.max_streams_per_connection`` each), so the placement cost grows with the nodes, not with the
producers and consumers.  A placement asks the connector, which runs :class:`~smartclient.core.landing.Placement`
with this role's shared connections behind its ``Kept`` hook: a shared connection to a tier-0 node with room, a
parked one, or new ones until one lands on a candidate (offered the shared and parked ones again before each
dial).  A connection nobody uses any more is parked for the next placement.

Single active consumers keep to connections of their own (a lane apart): their Subscribe and Unsubscribe are
commands to the stream coordinator, for which the broker's process of the connection waits, serving nothing else,
up to 30 s on each coordinator server while the coordinator elects a leader (every rolling restart); the 2-hour
soak's one silent consumer was a plain one on a connection held that way (``bench/tail_stall/member_wait.py``).

A consumer placed while one of its stream's recovers goes to a member that can be read now (``ready``, which
asks each candidate on a connection of its own; :func:`~smartclient.core.topology.ready_choice` decides): after a
restart or an election the first choice may still be initialising while the stream takes writes again.  A
placement below the first tier is marked ``fallback`` in its record, and the consumer moves back later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from smartclient.core.address import Address
from smartclient.core.deadline import step
from smartclient.core.recovery import RecoveryPolicy
from smartclient.core.retry import RetryPolicy
from smartclient.core.shared import Shared
from smartclient.core.topology import Candidates, Role, consumer_fallback
from smartclient.stream import _rstream
from smartclient.stream.host import PlacementRecord

if TYPE_CHECKING:
    from smartclient.stream.connector import StreamConnector
    from smartclient.stream.host import Connection
    from smartclient.stream.topology_cache import TopologyCache
    from smartclient.stream.tracing import StreamTracing

__all__ = ["PlacementBook", "StreamPlacement"]

log = logging.getLogger(__name__)
Lane = tuple[Role, bool]  # a role, and whether its handles keep to connections apart
Key = tuple[int, str]  # a placement record's: the carrier's id, the stream
_NOTHING = contextlib.nullcontext()
_NONE: Mapping[Address, int] = MappingProxyType({})


class PlacementBook:
    """Where every producer and consumer sits, by (carrier, stream), indexed so that nothing a placement asks
    reads them all: the consumers of each stream by node (the load that orders its replicas), and the records
    of each connection (dropped with it)."""

    def __init__(self) -> None:
        self.records: dict[Key, PlacementRecord] = {}
        self._loads: dict[str, Counter[Address]] = {}
        self._on_connection: dict[str, set[Key]] = {}
        self._held: dict[Key, Connection] = {}  # the connection each record holds a place on

    def put(self, key: Key, record: PlacementRecord, conn: Connection | None = None) -> None:
        """Record ``key`` placed, holding a place on ``conn`` until it is popped."""
        self.pop(key)
        self.records[key] = record
        if conn is not None:
            conn.hold()
            self._held[key] = conn
        if record.role is Role.CONSUMER:
            self._loads.setdefault(record.stream, Counter())[record.node] += 1
        self._on_connection.setdefault(record.connection, set()).add(key)

    def pop(self, key: Key) -> None:
        record = self.records.pop(key, None)
        if record is None:
            return
        if (conn := self._held.pop(key, None)) is not None:
            conn.let_go()
        if record.role is Role.CONSUMER:
            load = self._loads[record.stream]
            load[record.node] -= 1
            if load[record.node] <= 0:
                del load[record.node]
                if not load:
                    del self._loads[record.stream]
        keys = self._on_connection[record.connection]
        keys.discard(key)
        if not keys:
            del self._on_connection[record.connection]

    def load(self, stream: str) -> Mapping[Address, int]:
        """How many of ``stream``'s consumers sit on each node (a view: read it before the next placement)."""
        return self._loads.get(stream, _NONE)

    def drop_connection(self, name: str) -> None:
        for key in list(self._on_connection.get(name, ())):
            self.pop(key)


class StreamPlacement:
    """Shared connections by role, and where every producer and consumer sits."""

    def __init__(self, connector: StreamConnector, topologies: TopologyCache, retry: RetryPolicy,
                 recovery: RecoveryPolicy, connection_name: str) -> None:
        self.connector = connector
        self.topologies = topologies
        self.connection_name = connection_name
        # one placement attempt during a recovery: short, so that a stale leader is looked up again soon
        self.recovery_retry = replace(retry, max_time=min(retry.max_time, recovery.attempt_time),
                                      backoff_max=min(retry.backoff_max, recovery.attempt_time))
        self.recovering: Counter[tuple[Role, str]] = Counter()  # recoveries under way, by role and stream
        #: (stream, candidates) -> the first candidate that can be read (set by the Carriers: member_ready's reads)
        self.ready: Callable[[str, Candidates], Awaitable[Address]] | None = None
        self._locks: dict[tuple[Lane, tuple[Address, ...]], asyncio.Lock] = {}
        self._waiting: Counter[tuple[Lane, tuple[Address, ...]]] = Counter()  # placements holding or awaiting each
        #: the connections each lane shares: a role, and whether its handles keep apart (single active consumers)
        self.shared: dict[Lane, Shared[Connection]] = {
            (role, apart): Shared() for role in (Role.PRODUCER, Role.CONSUMER) for apart in (False, True)}
        self.book = PlacementBook()
        #: told each placement's time and the connections it opened (telemetry)
        self.on_placed: Callable[[Role, float, int], None] | None = None
        self.tracing: StreamTracing | None = None  # a span per placement, when tracing
        connector.on_closed = self.on_connection_closed
        connector.on_mismatch = self.on_mismatch

    @property
    def records(self) -> dict[tuple[int, str], PlacementRecord]:
        return self.book.records

    def consumer_load(self, stream: str) -> Mapping[Address, int]:
        return self.book.load(stream)

    async def place(self, pool: Any, stream: str, closed_handler: Any) -> Connection:
        """A connection for ``stream`` on a node of its candidates, from the connector: a shared one of its lane
        (its role, and whether it keeps apart) with a free id, a parked one or a new one (in a ``smartclient.place``
        span when tracing)."""
        role: Role = pool.role
        began = time.monotonic()
        with _NOTHING if self.tracing is None else self.tracing.placing(role, stream) as placed:
            conn, sessions = await self._place(pool, stream, closed_handler, role)
            if placed is not None:
                placed["conn"] = conn
        if self.on_placed is not None:
            self.on_placed(role, time.monotonic() - began, sessions)
        return conn

    async def _place(self, pool: Any, stream: str, closed_handler: Any, role: Role) -> tuple[Connection, int]:
        candidates = await self._candidates(stream, role)
        lane = (role, stream in getattr(pool, "apart", ()))
        if self.shared[lane].take(candidates.tiers[0]) is not None:
            # a connection of this role to a first-choice node is open and has room: nothing to wait for (a
            # recovery must not queue behind a placement that dials, maybe while an election goes on)
            return await self._acquire(pool, stream, closed_handler, lane, candidates)
        # placements that would dial the same nodes wait for one another, then share what the first opened
        key = (lane, candidates.tiers[0])
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._waiting[key] += 1
        try:
            await step("waiting for a placement on the same nodes", lock.acquire())
        except BaseException:
            self._let_go(key)
            raise
        try:
            candidates = await self._candidates(stream, role)
            return await self._acquire(pool, stream, closed_handler, lane, candidates)
        finally:
            lock.release()
            self._let_go(key)

    async def _candidates(self, stream: str, role: Role) -> Candidates:
        """Where a ``role`` of ``stream`` may go.  While one of the stream's consumers recovers, a consumer goes
        only to the first member that can be read (``ready``), marked ``fallback`` if it is not a first choice."""
        recovering = bool(self.recovering[(role, stream)])
        candidates = await self.topologies.candidates(stream, role, self.consumer_load(stream), recovering)
        if role is not Role.CONSUMER or not recovering or self.ready is None:
            return candidates
        node = await step("waiting for a member that can be read", self.ready(stream, candidates))
        return Candidates(stream, role, ((node,),),
                          fallback=consumer_fallback(await self.topologies.topology(stream), node))

    async def _acquire(self, pool: Any, stream: str, closed_handler: Any, lane: Lane,
                       candidates: Candidates) -> tuple[Connection, int]:
        role = lane[0]
        shared = self.shared[lane]
        conn = shared.take(candidates.tiers[0])
        if conn is not None:  # (what the connector's placement would start with: no need to build one)
            conn.sessions = 0
        else:
            retry = self.recovery_retry if self.recovering[(role, stream)] else None
            conn = await self.connector.acquire(candidates, self.connection_name, retry=retry, shared=shared)
        if conn not in shared:  # a new or parked one: shared from now on
            _rstream.on_metadata_update(conn.client, self.topologies.on_metadata_update, "smartclient-topology")
            if conn.alive():
                shared.add(conn)
                conn.on_room = shared.room
        self._record(pool, stream, conn, closed_handler, candidates.fallback)
        return conn, conn.sessions

    def _let_go(self, key: tuple[Lane, tuple[Address, ...]]) -> None:
        """One placement less on ``key``'s lock: the last one drops it (leaders move: a lock per set of nodes
        ever placed on would pile up over weeks)."""
        self._waiting[key] -= 1
        if not self._waiting[key]:
            del self._waiting[key]
            self._locks.pop(key, None)

    def _record(self, pool: Any, stream: str, conn: Connection, closed_handler: Any, fallback: bool) -> None:
        role: Role = pool.role
        conn.forwards[id(pool.carrier)] = _rstream.closed_forwarder(pool.carrier, conn.client, closed_handler)
        conn.client.add_stream(stream)
        name = pool.names.get(stream)
        self.book.put((id(pool.carrier), stream), PlacementRecord(role, stream, name, conn.node, conn.dialled,
                                                                  conn.name, fallback), conn)

    async def unused(self, conn: Connection) -> None:
        """No producer or consumer uses ``conn`` any more: park it, for the next placement on its node (it
        closes after ``PoolLimits.idle_timeout``).  One of single active consumers is closed at once instead: an
        unsubscription of theirs may still be waiting for the coordinator there (its id is retired until the
        broker answers), and a parked connection goes to any lane next."""
        apart = False
        for (_, lane_apart), shared in self.shared.items():
            if shared.discard(conn):
                apart = apart or lane_apart
        if apart:
            await self.connector.close_connection(conn, handshake=False)  # (a waiting broker would not answer)
        else:
            await self.connector.park(conn)

    def placement_of(self, carrier: Any, stream: str) -> PlacementRecord | None:
        return self.records.get((id(carrier), stream))

    def forget(self, carrier: Any, stream: str) -> None:
        self.book.pop((id(carrier), stream))

    def placements(self) -> list[PlacementRecord]:
        return sorted(self.records.values(), key=lambda r: (r.role.value, r.stream, r.connection))

    async def on_connection_closed(self, conn: Connection, info: Any) -> None:
        log.info("connection %s to %s closed: topologies with that node invalidated", conn.name, conn.node)
        self.topologies.drop(node=conn.node)
        self.book.drop_connection(conn.name)
        for shared in self.shared.values():
            shared.discard(conn)

    def on_mismatch(self, target: Address, reached: Address, candidates: Candidates) -> None:
        self.topologies.drop(node=target)
        self.topologies.drop(stream=candidates.stream)

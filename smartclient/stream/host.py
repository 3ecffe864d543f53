"""What handles (and the rstream seam) may ask of the stream machinery they live in, and what the machinery may
ask of a handle.

Producers, consumers and super streams are given a :class:`StreamHost` (or a :class:`StreamOpener`), never
the Environment: they place, report a loss, release, and read what they need through this small
protocol, defined below everything that implements it, so no import runs back up.  The other way round, the
machinery (the Environment's carriers, the watches) reaches a handle only through its :class:`HandleControl`
(``handle.control``), never through its private state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from smartclient._errors import ConnectionFailed
from smartclient.core.address import Address
from smartclient.core.recovery import RecoveryEvent, RecoveryPolicy
from smartclient.core.topology import Candidates, Role, StreamTopology
from smartclient.options import ConsumerOptions, ProducerOptions

__all__ = ["ID_SPACE", "SUBSCRIBES_IN_FLIGHT", "Connection", "HandleControl", "PlacementRecord", "StreamHost",
           "StreamOpener", "carrier_streams"]

ClosedHandler = Callable[[Any], Any]
T = TypeVar("T")


class HandleControl(Protocol):
    """What the stream machinery may ask of a producer or consumer (``handle.control``): where it sits, that it
    was lost, that its stream ended; and of a consumer, rstream's subscriber it reads through."""

    @property
    def carrier(self) -> Any:
        """The rstream carrier (Producer or Consumer) its stream is on."""

    @property
    def subscriber(self) -> Any:
        """A consumer's rstream subscriber now (None for a producer, or before it subscribed)."""

    def lost(self, reason: str) -> None:
        """Its connection, publisher or subscription is gone: it recovers (see RecoveryPolicy)."""

    async def end(self, reason: str) -> None:
        """Its stream was deleted by this Environment: it closes quietly, with ``reason`` as its failure."""


#: publisher and subscription ids are a byte on the wire: a connection holds at most ``max_ids``
#: (``PoolLimits.max_streams_per_connection``, at most 200) of them, chosen among all 256, so that an rstream carrier
#: with at most ``ID_SPACE - max_ids`` streams (its ids unique over all its connections) always finds one free
ID_SPACE = 256


def carrier_streams(max_ids: int) -> int:
    """How many streams an rstream carrier may hold so that each always finds an id free (see ``ID_SPACE``)."""
    return max(1, ID_SPACE - max_ids)


#: Subscribes a connection has sent and not had answered, at most.  The broker's process of a connection reads
#: nothing while it works through what it read (a single active consumer's Subscribe goes through the stream
#: coordinator's log: 20 ms and more each on the test bed), so its heartbeat check sees the client silent: 200
#: Subscribes sent at once (a 500-partition super stream) held it past two 2 s heartbeats, and it closed the
#: connection, its 200 consumers with it.  A few at a time, it reads between them.
SUBSCRIBES_IN_FLIGHT = 8


@dataclass(eq=False)
class Connection:
    """A stream connection smartclient opened: the rstream client, the node it reached, what was dialled."""

    client: Any
    node: Address
    dialled: Address
    name: str
    max_ids: int = 200
    # rstream's closed handlers of the Producers/Consumers sharing it, by carrier
    forwards: dict[int, ClosedHandler] = field(default_factory=dict)
    ids: set[int] = field(default_factory=set)  # publisher or subscription ids in use on it
    held: int = 0  # producers and consumers placed on it (see has_room)
    last_id: int = -1  # the id given last (ids go round)
    parked_at: float | None = None
    idle_since: float | None = None  # when it was parked, the last time it was taken from the parking lot
    sessions: int = 0  # connections the placement that took it last opened (0: a kept one, reused)
    closed: bool = False
    subscribing: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(SUBSCRIBES_IN_FLIGHT),
                                           repr=False)  # (see SUBSCRIBES_IN_FLIGHT)
    #: told when an id is given back on a full connection (the lane sharing it offers it again)
    on_room: Callable[[Connection], None] | None = field(default=None, repr=False)

    def alive(self) -> bool:
        return not self.closed and self.client.is_connection_alive()

    def has_room(self) -> bool:
        """Whether one more producer or consumer may be placed here: counting the ids in use, and those placed
        here whose id is not taken yet (hundreds placed at once would each see a free id otherwise, and the
        201st would find none: a super stream of 500 partitions did)."""
        return len(self.ids) < self.max_ids and self.held < self.max_ids

    def hold(self) -> None:
        """One more producer or consumer placed here (its id may come later)."""
        self.held += 1

    def let_go(self) -> None:
        """One producer or consumer placed here less (moved, closed, or its placement given up)."""
        full = not self.has_room()
        self.held = max(0, self.held - 1)
        self._freed(full)

    def give_back(self, ident: int) -> None:
        """Id ``ident`` is free on this connection again."""
        full = not self.has_room()
        self.ids.discard(ident)
        self._freed(full)

    def _freed(self, was_full: bool) -> None:
        if was_full and self.has_room() and self.on_room is not None:
            self.on_room(self)  # (the lane sharing it offers it again)

    def take_id(self, taken: Collection[int] = ()) -> int:
        """The next publisher/subscription id free on this connection and not in ``taken`` (the ids the
        rstream carrier already uses, on any connection: it keys its own tables by them).  Ids go round: one
        just given back is the last to be used again, so nothing keyed by it (rstream's delivery queue and
        task, the broker's subscription) can meet a newer subscription of the same id."""
        for step in range(ID_SPACE):
            ident = (self.last_id + 1 + step) % ID_SPACE
            if ident not in self.ids and ident not in taken:
                self.ids.add(ident)
                self.last_id = ident
                return ident
        raise ConnectionFailed(f"connection {self.name} to {self.node} has no free id left ({len(self.ids)} in use "
                               f"on it, {len(taken)} taken by its carrier elsewhere)")


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    """Where one producer or consumer landed: for the placement table and for the tests."""

    role: Role
    stream: str
    name: str | None
    node: Address
    dialled: Address
    connection: str
    #: a consumer placed on a later tier than its first choice, which could not be read then (it moves back)
    fallback: bool = False

    def row(self) -> str:
        return (f"{self.role.value:<9} {self.stream:<28} {self.name or '-':<16} node {self.node!s:<22} "
                f"via {self.dialled!s:<22} {self.connection}" + (" (fallback)" if self.fallback else ""))


class StreamHost(Protocol):
    """The stream machinery, as a producer or consumer handle and the rstream seam see it."""

    recovery: RecoveryPolicy

    async def locator(self) -> Any:
        """The shared metadata connection."""

    async def place(self, pool: Any, stream: str, closed_handler: Any) -> Connection:
        """A connection for ``stream`` on a node the candidates allow (shared, parked or new)."""

    def lost(self, role: Role, carrier: Any, stream: str, reason: str) -> None:
        """rstream says the publisher or subscriber of ``stream`` on ``carrier`` is gone."""

    async def unused(self, conn: Connection) -> None:
        """No producer or consumer uses ``conn`` any more."""

    def recovering(self, role: Role, stream: str, active: bool, handle: Any = None) -> None:
        """A recovery of ``stream``'s producer or consumer (``handle``) starts (or ends): placements use short
        attempts meanwhile."""

    def recovered(self, event: RecoveryEvent) -> None:
        """A recovery ended (recovered, gave up, or its handle closed): the telemetry and the recovery hooks are
        told."""

    def confirm_watch(self, stream: str) -> Callable[[float, list[tuple[int, float, int]]], None] | None:
        """What a producer of ``stream`` tells of each confirm frame: the time, and the Publish frames it
        confirmed (last id, written at, messages).  None: metrics and traces are off."""

    def drop_topology(self, stream: str) -> None:
        """Forget the cached topology of ``stream``."""

    async def topology(self, stream: str) -> StreamTopology:
        """The leader and replicas of ``stream`` (cached, or read from the broker)."""

    def placement_of(self, carrier: Any, stream: str) -> PlacementRecord | None:
        """Where the producer or consumer of ``stream`` on ``carrier`` sits."""

    def release(self, handle: Any) -> None:
        """``handle`` closed: its carrier slot and placement record are free."""

    def forget_when_unused(self, stream: str) -> None:
        """``stream`` is gone: what its handles left is forgotten once none is open on it."""

    async def aside(self, stream: str, purpose: str, request: Callable[[Any], Awaitable[T]]) -> T:
        """``request(client)`` about ``stream`` on the second metadata connection: for a request the broker
        answers only after asking a stream member (see :meth:`TopologyCache.aside`)."""

    async def ready_member(self, stream: str, candidates: Candidates) -> Address:
        """The first of ``candidates`` whose member of ``stream`` can be read (see
        :meth:`Carriers.ready_member`)."""

    async def member_ready(self, stream: str, node: Address) -> None:
        """Wait until ``stream``'s member on ``node`` answers, on a connection of its own (see
        :meth:`Carriers.member_ready`)."""

    async def stored_offset(self, stream: str, name: str) -> int | None:
        """The offset stored for consumer ``name`` on ``stream``."""

    async def committed_chunk_id(self, stream: str) -> int:
        """The first offset of ``stream``'s last committed chunk (-1: none), as its leader sees it."""


class StreamOpener(Protocol):
    """What a super stream needs: producers and consumers of its partitions, and the broker's routes."""

    async def producer(self, stream: str, options: ProducerOptions = ...) -> Any: ...

    async def consumer(self, stream: str, callback: Any = ..., *, on_chunk: Any = ...,
                       options: ConsumerOptions = ..., super_stream: str | None = ...) -> Any: ...

    async def route(self, super_stream: str, routing_key: str) -> list[str]: ...

"""The rstream carriers of an Environment's producers and consumers, and what happens when one is lost.

Each producer or consumer handle rides on an rstream Producer or Consumer (a *carrier*); rstream allows one
publisher or subscription per stream and carrier, so a carrier is reused for another stream and a new one
made only for a second handle on the same stream.  The connections underneath are shared anyway (see
:mod:`smartclient.stream.placement`).  :class:`Carriers` is the :class:`~smartclient.stream.host.StreamHost`
the handles are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from smartclient._errors import ConfigurationError, ConnectionFailed, SmartClientError
from smartclient.core.address import Address
from smartclient.core.recovery import RecoveryEvent, RecoveryPolicy
from smartclient.core.topology import Candidates, Role, StreamTopology, ready_choice
from smartclient.stream import _rstream
from smartclient.stream._rstream import map_stream_errors
from smartclient.stream.host import PlacementRecord, carrier_streams
from smartclient.stream.member_reads import MemberReads

if TYPE_CHECKING:
    from smartclient.core.flow import ConsumerFlow
    from smartclient.core.settings import PoolLimits
    from smartclient.options import ClientSettings
    from smartclient.stream.host import Connection
    from smartclient.stream.placement import StreamPlacement
    from smartclient.stream.telemetry import StreamTelemetry
    from smartclient.stream.topology_cache import TopologyCache
    from smartclient.stream.tracing import StreamTracing
    from smartclient.telemetry import EnvironmentTelemetry

__all__ = ["Carriers"]

log = logging.getLogger(__name__)
#: seconds a recovering consumer waits for a first-choice member that cannot be read yet before it takes another
#: that can (it moves back later): after an election the replicas join the new leader one by one
READY_GRACE = 0.25
READY_FRESH = 1.0  # seconds a member read ready is taken as ready without asking it again
P = TypeVar("P")
T = TypeVar("T")


class Carriers:
    """The carriers, the open handles, and the hand-over of losses to them."""

    def __init__(self, placement: StreamPlacement, topologies: TopologyCache, settings: ClientSettings,
                 limits: PoolLimits, recovery: RecoveryPolicy, connection_name: str, entry: Address,
                 telemetry: EnvironmentTelemetry | None = None, tracer_provider: Any = None,
                 propagate: bool = False) -> None:
        from smartclient import _otel

        self.placement = placement
        self.topologies = topologies
        self.settings = settings
        self.limits = limits
        self.recovery = recovery
        self.connection_name = connection_name
        self.entry = entry
        self._carriers: dict[Role, list[tuple[Any, set[str]]]] = {Role.PRODUCER: [], Role.CONSUMER: []}
        self.handles: list[Any] = []
        self._tasks: set[asyncio.Future[Any]] = set()
        self._committed: dict[str, tuple[float, int]] = {}  # stream -> (read at, committed chunk id)
        #: (stream, node) -> the read the consumers recovering onto that member wait for (member_ready)
        self._probes: dict[tuple[str, Address], asyncio.Future[None]] = {}
        self._ready_at: dict[tuple[str, Address], float] = {}  # (stream, node) -> when its member last answered
        self._fell_back: dict[str, float] = {}  # stream -> when a consumer of it last took a member not its first
        self._chosen: dict[tuple[str, Address], float] = {}  # (stream, node) -> when ready_member last chose it
        self.reads = MemberReads(placement.connector, connection_name)  # (the connections member reads go on)
        placement.ready = self.ready_member
        #: streams gone (deleted, here or elsewhere) that still had a handle: forgotten when their last one is released
        self.gone: set[str] = set()
        #: what consumer carriers counted for streams they no longer consume (telemetry reads it with theirs)
        self.left: dict[str, Counter[str]] = {"smartclient_consumed": Counter(), "smartclient_chunks": Counter()}
        self.telemetry: StreamTelemetry | None = None
        #: told of every recovery that ended (the Environment's recovery hooks: Environment.on_recovery)
        self.on_recovery: Callable[[RecoveryEvent], None] | None = None
        if telemetry is not None:  # (its Environment's: the stream wing adds its readings to it)
            from smartclient.stream.telemetry import StreamTelemetry

            self.telemetry = StreamTelemetry(self, telemetry)
        self.tracing: StreamTracing | None = None
        if (tracer := _otel.tracer(tracer_provider)) is not None:
            from smartclient.stream.tracing import StreamTracing

            self.tracing = StreamTracing(tracer, propagate)
            placement.tracing = self.tracing
            placement.connector.on_attempt = self.tracing.attempt
        self._around_chunk = self._chunk_hook()

    def _chunk_hook(self) -> Callable[[str, int, int], Any] | None:
        """What a consumer carrier runs each chunk's callbacks in (None when there is nothing to record)."""
        sizes = self.telemetry.chunk_size if self.telemetry is not None and self.telemetry.timed else None
        spans = self.tracing.chunk if self.tracing is not None else None
        if sizes is None and spans is None:
            return None

        def around(stream: str, count: int, first: int) -> Any:
            if sizes is not None:
                sizes(stream, count)
            return spans(stream, count, first) if spans is not None else contextlib.nullcontext()
        return around

    def carriers(self, role: Role) -> list[Any]:
        """rstream's carriers of ``role`` (a consumer carrier counts what it hands over, per stream)."""
        return [carrier for carrier, _ in self._carriers[role]]

    def carrier(self, role: Role, stream: str, name: str | None, flow: ConsumerFlow | None = None,
                apart: bool = False) -> Any:
        """A carrier with no publisher/subscriber on ``stream`` yet (made if needed); ``flow``: a consumer's;
        ``apart``: on connections apart from the other consumers' (see :class:`StreamPlacement`)."""
        for carrier, streams in self._carriers[role]:
            # (rstream keys a carrier's publishers and subscribers by id, unique over all its connections: a
            # carrier holds 56 streams, so that each finds an id free on a shared connection with 199 in use)
            if stream not in streams and len(streams) < carrier_streams(self.limits.max_streams_per_connection):
                streams.add(stream)
                _rstream.name_stream(carrier, stream, name, flow, apart)
                return carrier
        carrier = _rstream.new_carrier(role, self, self.settings, self.entry,
                                       f"{self.connection_name}-{role.value}", self.limits.max_streams_per_connection)
        streams = {stream}
        if role is Role.CONSUMER:
            carrier.smartclient_around_chunk = self._around_chunk
            # a chunk that ends after its consumer was released counts in what closed subscriptions left
            carrier.smartclient_streams, carrier.smartclient_left = streams, self.left
        _rstream.name_stream(carrier, stream, name, flow, apart)
        self._carriers[role].append((carrier, streams))
        return carrier

    def add(self, handle: Any) -> None:
        """Register a new handle: from now on, a loss is handed to it (see :meth:`lost`).

        :raises ConfigurationError: an open producer of this Environment already has its name on its stream
            (the broker deduplicates by name: two producers of one name would drop each other's messages).
        """
        if handle.role is Role.PRODUCER and handle.name is not None and any(
                h.role is Role.PRODUCER and h.stream == handle.stream and h.name == handle.name and not h.closed
                for h in self.handles):
            raise ConfigurationError(
                f"producer name {handle.name!r} is already in use on {handle.stream!r} by this Environment: "
                f"deduplication needs one producer per name and stream")
        self.handles.append(handle)

    # -- the StreamHost protocol ---------------------------------------------------------------------
    async def locator(self) -> Any:
        return await self.topologies.locator()

    async def place(self, pool: Any, stream: str, closed_handler: Any) -> Connection:
        return await self.placement.place(pool, stream, closed_handler)

    async def unused(self, conn: Connection) -> None:
        await self.placement.unused(conn)

    def recovering(self, role: Role, stream: str, active: bool, handle: Any = None) -> None:
        key = (role, stream)
        self.placement.recovering[key] += 1 if active else -1
        if not self.placement.recovering[key]:  # no key per stream ever recovered: streams come and go
            del self.placement.recovering[key]

    def recovered(self, event: RecoveryEvent) -> None:
        if self.on_recovery is not None:  # (its Environment's hooks, and its telemetry)
            self.on_recovery(event)

    def confirm_watch(self, stream: str) -> Callable[[float, list[tuple[int, float, int]]], None] | None:
        timer = self.telemetry.confirm_timer(stream) if self.telemetry is not None else None
        spans = self.tracing.frames(stream) if self.tracing is not None else None
        if timer is None or spans is None:
            return timer or spans

        def both(now: float, frames: list[tuple[int, float, int]]) -> None:
            timer(now, frames)
            spans(now, frames)
        return both

    def traced(self, handle: Any) -> None:
        """A producer just placed: with trace-context propagation on, its messages carry their span's."""
        if self.tracing is not None and self.tracing.propagate:
            self.tracing.stamp(handle)

    def traced_callback(self, stream: str, callback: Any) -> Any:
        """A consumer's callback, in a span per message when trace-context propagation is on."""
        return self.tracing.each(stream, callback) if self.tracing is not None else callback

    def drop_topology(self, stream: str) -> None:
        self.topologies.drop(stream=stream)

    async def topology(self, stream: str) -> StreamTopology:
        return await self.topologies.topology(stream)

    def placement_of(self, carrier: Any, stream: str) -> PlacementRecord | None:
        return self.placement.placement_of(carrier, stream)

    def lost(self, role: Role, carrier: Any, stream: str, reason: str) -> None:
        """rstream says the publisher or subscriber of ``stream`` on ``carrier`` is gone: hand it over."""
        for handle in self.handles:
            if handle.role is role and handle.control.carrier is carrier and handle.stream == stream:
                handle.control.lost(reason)
                return
        # nobody to hand it to (closed meanwhile): still clear rstream's state, or the next producer or
        # consumer of this stream on this carrier would get the dead connection
        log.debug("%s of %s lost (%s), but it is not open any more", role.value, stream, reason)
        forget = _rstream.forget_publisher if role is Role.PRODUCER else _rstream.forget_subscriber
        task = asyncio.ensure_future(forget(carrier, stream, dead_only=True))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def release(self, handle: Any) -> None:
        for other, streams in self._carriers[handle.role]:
            if other is handle.control.carrier:
                streams.discard(handle.stream)
                _rstream.unname_stream(other, handle.stream)
                if handle.role is Role.CONSUMER:
                    self._fold(other, handle.stream)
        self.placement.forget(handle.control.carrier, handle.stream)
        if handle in self.handles:
            if self.telemetry is None:
                self.handles.remove(handle)
            else:
                with self.telemetry.lock:  # a reading sees the handle's totals live or retired, never both or neither
                    self.handles.remove(handle)
                    self.telemetry.retire(handle)
        if handle.stream in self.gone and not self._in_use(handle.stream):
            # the last handle of a stream that is gone takes what its closed handles left with it (else a service
            # whose streams others create and delete would keep a little of every one it ever used)
            self.forget_stream(handle.stream)

    def forget_when_unused(self, stream: str) -> None:
        """:meth:`forget_stream` now if no handle is on ``stream``, else once its last one is released (one still
        closing, or opened meanwhile, would otherwise leave its totals behind): for a stream deleted here, or
        found deleted by a handle's recovery."""
        if self._in_use(stream):
            self.gone.add(stream)
        else:
            self.forget_stream(stream)

    def _in_use(self, stream: str) -> bool:
        return any(h.stream == stream for h in self.handles)

    async def stored_offset(self, stream: str, name: str) -> int | None:
        from smartclient.core.deadline import step

        with map_stream_errors(f"querying the offset of {name!r} on {stream!r}"):  # (it asks the writer: aside)
            return await self.aside(stream, "offset query", lambda client: step(
                "offset query", _rstream.query_offset(client, stream, name)))

    async def aside(self, stream: str, purpose: str, request: Callable[[Any], Awaitable[T]]) -> T:
        return await self.topologies.aside(stream, purpose, request)

    async def member_ready(self, stream: str, node: Address) -> None:
        """Wait until ``stream``'s member on ``node`` answers: StreamStats on a reading connection to that node
        (:class:`~smartclient.stream.member_reads.MemberReads`: never one a producer or consumer uses), which the
        broker answers only once that member can be read, as it does a Subscribe.

        A member that a restart or a leader change has just started answers only once it has initialised
        (22.5 s once in the 2-hour soak): a Subscribe to it held the broker's process of the connection,
        with no time limit, and with it every other consumer on that connection (no delivery, no answer, no
        MetadataUpdate).  Waiting here holds only this consumer (``bench/tail_stall/member_wait.py``).  The
        consumers recovering onto one member share one such read (however many wait and however often they try
        again), within each one's own attempt; a member read ready less than
        :data:`READY_FRESH` seconds ago is not asked again.  A broker that closes it instead (one without
        StreamStats, before 3.11) is not waited for."""
        from smartclient.core.deadline import step

        if not self._fresh(stream, node) and (stream, node) not in self._chosen:
            await step(f"waiting for the member on {node}", asyncio.shield(self._member_probe(stream, node)))

    async def ready_member(self, stream: str, candidates: Candidates) -> Address:
        """The member of ``candidates`` a recovering consumer of ``stream`` goes to: the first tier's members are
        asked as :meth:`member_ready` asks (all at once), the next tiers' only once :data:`READY_GRACE` has passed
        with none ready (a healthy recovery dials no more than before), and
        :func:`~smartclient.core.topology.ready_choice` decides.  A member read ready that went stale meanwhile
        is asked again; one whose read failed is not, within this call.

        :raises ConnectionFailed: no candidate could be read (each one's error is named)."""
        began = time.monotonic()
        # (the grace is waited once: the placement's second look, and the stream's other consumers, take the
        # fallback at once for a moment)
        grace = 0.0 if began - self._fell_back.get(stream, -READY_FRESH) < READY_FRESH else READY_GRACE
        probes: dict[Address, asyncio.Future[None]] = {}
        while True:
            waited = time.monotonic() - began
            for member in (member for tier in candidates.tiers[:None if waited >= grace else 1] for member in tier):
                probe = probes.get(member)
                if not self._fresh(stream, member) and (probe is None or _succeeded(probe)):
                    probes[member] = self._member_probe(stream, member)
            ready = {node for node in candidates.all if self._fresh(stream, node)}
            if (node := ready_choice(candidates, ready, waited, grace)) is not None:
                if candidates.tier_of(node):
                    _keep_fresh(self._fell_back, stream)
                # (read ready within READY_FRESH; member_ready, after the placement's dial, takes the choice for
                # READY_FRESH more rather than ask it once more.  Only member_ready: the choices do not keep a
                # member fresh for the next choices, or one chosen every second would never be read again)
                _keep_fresh(self._chosen, (stream, node))
                return node
            pending = [probe for probe in probes.values() if not probe.done()]
            if not pending and waited < grace:  # the first tier failed at once: the next tiers are asked now
                grace = 0.0
                continue
            if not pending:
                failed = "; ".join(f"{node}: {probe.exception()}" for node, probe in probes.items()
                                   if probe.done() and not probe.cancelled() and probe.exception() is not None)
                raise ConnectionFailed(f"no member of {stream!r} could be read ({failed or 'none answered'})")
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED,
                               timeout=grace - waited if waited < grace else None)

    def _member_probe(self, stream: str, node: Address) -> asyncio.Future[None]:
        """The one read of ``stream``'s member on ``node`` under way (started if none is)."""
        key = (stream, node)
        probe = self._probes.get(key)
        if probe is None:
            probe = self._probes[key] = asyncio.ensure_future(self._probe(stream, node))
            probe.add_done_callback(partial(self._probed, key))
        return probe

    def _fresh(self, stream: str, node: Address) -> bool:
        return time.monotonic() - self._ready_at.get((stream, node), -READY_FRESH) < READY_FRESH

    async def _probe(self, stream: str, node: Address) -> None:
        from smartclient._errors import FeatureNotSupported
        from smartclient.core.deadline import detach

        detach()  # its own bound (the default step's), not the first waiter's attempt
        topo = await self.topologies.topology(stream)
        with contextlib.suppress(FeatureNotSupported):  # (a broker before 3.11: nothing to wait for)
            await self.reads.read(stream, node, topo.member_candidates(node))
        _keep_fresh(self._ready_at, (stream, node))

    def _probed(self, key: tuple[str, Address], probe: asyncio.Future[None]) -> None:
        if self._probes.get(key) is probe:
            del self._probes[key]
        if not probe.cancelled():
            probe.exception()  # (its waiters were told, or have gone)

    async def committed_chunk_id(self, stream: str) -> int:
        """The leader's view (the authority), read on a connection of its own, and kept for half a
        ``stall_check``: the delivery watches of the consumers of one stream share it."""
        from smartclient.stream.stats import stream_stats_from

        read_at, value = self._committed.get(stream, (0.0, -1))
        fresh = self.recovery.stall_check / 2
        if time.monotonic() - read_at < fresh:
            return value
        topo = await self.topologies.topology(stream)
        stats = await stream_stats_from(self.placement.connector, topo.candidates(Role.PRODUCER), stream,
                                        f"{self.connection_name}-stats")
        entry = self._committed[stream] = (time.monotonic(), int(stats.get("committed_chunk_id", -1)))
        # a stale read is never used: each leaves when it goes stale (the 2-hour soak found the last reads of a
        # burst kept until the next read, which may never come)
        asyncio.get_running_loop().call_later(fresh, self._stale, stream, entry)
        return entry[1]

    def _stale(self, stream: str, entry: tuple[float, int]) -> None:
        if self._committed.get(stream) is entry:
            del self._committed[stream]

    def _fold(self, carrier: Any, stream: str) -> None:
        """What a consumer carrier counted for ``stream``, whose subscription on it ended, moves to ``left`` (per
        stream: the carrier's own tables hold only the streams it consumes now)."""
        lock = self.telemetry.lock if self.telemetry is not None else contextlib.nullcontext()
        with lock:  # a reading sees the counts on the carrier or left, never both or neither
            for what, totals in self.left.items():
                counted = getattr(carrier, what).pop(stream, 0)
                if counted:
                    totals[stream] += counted

    def forget_stream(self, stream: str) -> None:
        """``stream`` was deleted: nothing of it is kept, neither its cached committed chunk nor what its closed
        handles' counters left (its metric series end; a service that creates and deletes streams for weeks would
        otherwise report every stream it ever had)."""
        self._committed.pop(stream, None)
        self.gone.discard(stream)
        if self.telemetry is not None:
            with self.telemetry.lock:
                for totals in self.telemetry.retired.values():
                    totals.pop(stream, None)
                for carrier in self.carriers(Role.CONSUMER):  # what each consumer carrier handed over, per stream
                    carrier.smartclient_consumed.pop(stream, None)
                    carrier.smartclient_chunks.pop(stream, None)
        for totals in self.left.values():
            totals.pop(stream, None)

    # -- ending --------------------------------------------------------------------------------------
    async def end_handles_of(self, streams: set[str], reason: str) -> None:
        """Close the producers and consumers of ``streams`` quietly, before they are deleted: no recovery,
        and every message still pending fails with ``reason``."""
        for handle in [h for h in self.handles if h.stream in streams]:
            await handle.control.end(reason)

    async def close(self) -> None:
        """Close every handle, all at once (each is bounded), then the carriers."""
        for handle, result in zip(handles := list(self.handles),
                                  await asyncio.gather(*(h.close() for h in handles), return_exceptions=True),
                                  strict=True):
            if isinstance(result, SmartClientError):
                log.debug("closing %r: %s", handle, result)
            elif isinstance(result, BaseException):
                raise result
        for probe in list(self._probes.values()):  # (nobody waits for a member any more)
            probe.cancel()
        await self.reads.close()
        for carriers in self._carriers.values():
            for carrier, _ in carriers:
                await carrier.close()


def _succeeded(probe: asyncio.Future[None]) -> bool:
    return probe.done() and not probe.cancelled() and probe.exception() is None


def _keep_fresh(table: dict[Any, float], key: Any) -> None:
    """``table[key]`` = now, for :data:`READY_FRESH` seconds: each entry leaves when it goes stale (streams and
    members come and go over weeks; the 2-hour soak found entries kept until a next use that may never come)."""
    at = table[key] = time.monotonic()

    def stale() -> None:
        if table.get(key) == at:
            del table[key]
    asyncio.get_running_loop().call_later(READY_FRESH, stale)

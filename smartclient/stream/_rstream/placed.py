"""The seam to rstream, carrier side: rstream's ``Producer``/``Consumer`` (carriers) placed by smartclient.

rstream's carriers get every connection from ``self._pool.get(...)``, which :class:`PlacedClientPool` replaces:
the locator request gets the Environment's shared locator, and a stream request a connection the Environment's
placement chose (shared per node and role).  Publisher and subscription ids are taken per connection; one whose
deletion the broker has not confirmed stays out of use until it does.  Recovery is taken over too: rstream's
``maybe_restart_producer`` / ``maybe_restart_subscriber`` hand the loss to the smartclient handle."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from bisect import bisect_left
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from functools import partial
from itertools import islice, repeat
from typing import TYPE_CHECKING, Any

from rstream import Consumer as RConsumer
from rstream import OffsetType, schema
from rstream import Producer as RProducer
from rstream import exceptions as rx
from rstream.client import Addr, Client, ClientPool
from rstream.constants import SlasMechanism
from rstream.producer import _Publisher
from rstream.utils import MonotonicSeq, OnClosedErrorInfo

from smartclient.core.address import Address
from smartclient.core.deadline import step
from smartclient.core.delivery import ChunkHandler, MessageContext
from smartclient.core.flow import ConsumerFlow
from smartclient.core.topology import Role

if TYPE_CHECKING:
    from smartclient.options import ClientSettings
    from smartclient.stream.host import StreamHost

from smartclient.stream._rstream.columns import chunk_of
from smartclient.stream._rstream.frames import messages_of
from smartclient.stream._rstream.wire import HANDING, connection_of, few_at_a_time, forget_handlers, offset_spec

__all__ = [
    "MAX_ITEM_ALLOWED", "PlacedClientPool", "PlacedConsumer", "PlacedProducer", "busy", "close_publisher",
    "close_subscriber", "closed_forwarder", "declare_publisher", "forget_publisher", "forget_subscriber", "name_stream",
    "new_carrier", "on_callback_error", "position", "queued_chunks", "stop_delivery", "store_offset", "stored_sequence",
    "subscribe", "unname_stream",
]

log = logging.getLogger(__name__)


MAX_ITEM_ALLOWED = 200  # rstream.constants.MAX_ITEM_ALLOWED; the seam test checks it


class PlacedClientPool(ClientPool):
    """A ``ClientPool`` whose connections the Environment places.

    Every rstream Producer/Consumer (a *carrier*) of one Environment and role gets its connections from
    the Environment's shared connections for that role (see :mod:`smartclient.stream.placement`): many
    carriers share one connection per node, up to ``PoolLimits.max_streams_per_connection``.
    Publisher and subscriber ids are therefore taken per *connection* (:meth:`Connection.take_id`), where
    rstream would number them per carrier.
    """

    def __init__(self, host: StreamHost, role: Role, carrier: Any, settings: ClientSettings) -> None:
        super().__init__(
            "placed-by-smartclient", 1, vhost="/", username="-", password="-",
            frame_max=settings.frame_max, heartbeat=settings.heartbeat,
            load_balancer_mode=False, max_retries=1,
        )
        self.host = host
        self.role = role
        self.carrier = carrier
        self.names: dict[str, str | None] = {}  # stream -> producer/consumer name, for the placement table
        self.flows: dict[str, ConsumerFlow] = {}  # stream -> a consumer's flow (credit strategy), if not rstream's
        self.apart: set[str] = set()  # streams of a single active consumer: on connections only such ones share
        #: stream -> what a consumer does when its callback raises: (exception, context or chunk) -> go on?
        self.on_error: dict[str, Callable[[Exception, Any], bool]] = {}

    async def get(
        self,
        connection_name: str | None,
        addr: Addr | None = None,
        connection_closed_handler: Any = None,
        stream: str | None = None,
        sasl_configuration_mechanism: SlasMechanism | None = None,
        max_clients_by_connections: int = MAX_ITEM_ALLOWED,
        locator_request: bool = False,
    ) -> Client:
        if addr is None or locator_request or stream is None:
            locator: Client = await self.host.locator()
            return locator
        conn = await self.host.place(self, stream, connection_closed_handler)
        client: Client = conn.client
        return client

    async def close(self) -> None:
        self._clients.clear()  # the connections are the Environment's: it closes them


class _Stopped(Exception):
    """The callback closed its own consumer: nothing more of the chunk is handed over."""
_NOTHING = contextlib.nullcontext()  # around a chunk, when metrics and traces are off
_PLACED = Addr("placed-by-smartclient", 0)  # rstream wants an address; the Environment chooses the node


class _Placed:
    """What both placed carriers share: their connections come from the Environment's placement."""

    smartclient_host: StreamHost
    _pool: ClientPool  # a PlacedClientPool, set by new_carrier
    _clients: dict[str, Client]
    _connection_name: str
    _on_connection_closed: Any

    async def _get_or_create_client(self, stream: str) -> Client:
        return await self.smartclient_place(stream)

    async def smartclient_place(self, stream: str) -> Client:
        """rstream would first ask its locator where to go: the Environment's placement decides that (a consumer
        places before it takes the carrier's lock: a placement waiting for an election holds up no other stream)."""
        if stream not in self._clients:
            self._clients[stream] = await self._pool.get(
                self._connection_name, addr=_PLACED, connection_closed_handler=self._on_connection_closed,
                stream=stream)
        return self._clients[stream]


class PlacedProducer(_Placed, RProducer):
    """rstream's Producer, placed by smartclient, with publisher ids per connection and its recovery
    handed to the smartclient Producer of the stream."""

    async def _get_or_create_publisher(self, stream: str, publisher_name: str | None = None) -> _Publisher:
        # rstream's, with the id taken on the connection (rstream takes it per Producer, before it knows the
        # connection), the declaration bounded by the attempt's deadline, and a clean slate on any failure
        publisher = self._find_producer_by_stream(stream)
        if publisher is not None:
            return publisher
        client = await self._get_or_create_client(stream)
        conn = connection_of(client)
        publisher_id = conn.take_id(self._publishers) if conn is not None else _free_id_in(self._publishers)
        await client.inc_available_id()
        publisher = self._publishers[publisher_id] = _Publisher(
            id=publisher_id, stream=stream, reference=publisher_name, sequence=MonotonicSeq(), client=client)
        try:
            await step("declaring the publisher", client.declare_publisher(
                stream=stream, reference=publisher_name, publisher_id=publisher_id))
        except BaseException:
            await asyncio.shield(forget_publisher(self, stream, keep={publisher_id}))  # declared or not?
            raise
        client.add_handler(schema.MetadataUpdate, partial(_on_metadata, self, client, Role.PRODUCER),
                           name=str(publisher_id))
        return publisher

    async def maybe_restart_producer(self, reason: str, stream: str) -> None:
        self.smartclient_host.lost(Role.PRODUCER, self, stream, reason)


class PlacedConsumer(_Placed, RConsumer):
    """rstream's Consumer, placed by smartclient, with subscription ids per connection and its recovery
    handed to the smartclient Consumer of the stream."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.smartclient_consumed: Counter[str] = Counter()  # messages handed to callbacks, per stream (telemetry)
        self.smartclient_chunks: Counter[str] = Counter()  # chunks received, per stream
        # the streams it consumes, and where a chunk that ends after its consumer closed counts (the Environment's)
        self.smartclient_streams: set[str] = set()
        self.smartclient_left: dict[str, Counter[str]] = {}
        #: (stream, messages, first offset) -> a context the chunk's callbacks run in: its span, its size
        #: recorded (None: metrics and traces are off; one check per chunk)
        self.smartclient_around_chunk: Callable[[str, int, int], Any] | None = None
        self.smartclient_placed: Client | None = None  # its last placement, until its id is taken on it

    async def _get_or_create_client(self, stream: str) -> Client:
        # (rstream calls it under the carrier's lock: the subscription id is taken on what it returns next)
        self.smartclient_placed = await self.smartclient_place(stream)
        return self.smartclient_placed

    async def get_available_id(self) -> int:
        # called by rstream's _create_subscriber right after _get_or_create_client, under the carrier's lock
        # taken, not kept: held here, a lost connection's client (its socket and buffers) stayed until the next
        # placement of this carrier
        placed, self.smartclient_placed = self.smartclient_placed, None
        conn = connection_of(placed)
        # (no Connection: the connection ended and was let go; the subscribe on it fails, and must not take an id
        # this carrier uses elsewhere, as rstream's own counter would)
        return conn.take_id(self._subscribers) if conn is not None else _free_id_in(self._subscribers)

    async def maybe_restart_subscriber(self, reason: str, stream: str) -> None:
        self.smartclient_host.lost(Role.CONSUMER, self, stream, reason)

    async def _on_deliver(self, frame: schema.Deliver, subscriber: Any, filter_value: Any) -> None:
        # rstream's, the one delivery loop, with these differences:
        # - the chunk's credit goes where the stream's ConsumerFlow says (by default, as rstream does, when its
        #   processing starts), and always once, even if a callback raises;
        # - the messages are split out of the frame in one pass (frames.messages_of), and each message's context
        #   is built in C (a tuple); without a filter, the loop does nothing else per message;
        # - a ChunkHandler gets the whole chunk (messages split only if it asks for them);
        # - the position never moves back.  A replica whose log ends before the offset asked for attaches the
        #   reader at its own end (osiris_log:init_offset_reader0, "retry_with next"), so the first chunks can
        #   lie before that offset; rstream drops the messages before it in the first chunk only, then sets the
        #   position to that chunk's end and delivers the next ones again (the "tracked consumer got 1,897
        #   offsets again" of the nemesis, issue 18).  And it moves by the chunk's records, not its entries
        #   (rstream's), which differ for a sub-entry batch;
        # - a callback that raises is the consumer's on_error decision (skip: on with the next message or chunk;
        #   stop: nothing more is handed over, the position ends before it); rstream logged it, lost the rest of
        #   the chunk and went on with the next;
        # - its handing over is never cut: stop_queue_listener_task waits for it (wire.NamedClient), and a credit
        #   that cannot go out on a connection that is gone does not end it.
        # subscriber.decoder is not applied: smartclient subscribes without one (rstream's is the identity).
        client = subscriber.client
        sid = subscriber.subscription_id
        if frame.subscription_id != sid or sid in client.smartclient_stopping:
            return  # being stopped (a chunk in the callback is finished first), or its callback said stop
        pool: PlacedClientPool = self._pool  # type: ignore[assignment]
        flow: ConsumerFlow | None = pool.flows.get(subscriber.stream)
        at = flow.credit_at(frame.num_entries) if flow is not None else 0
        credited = at == 0
        if credited:
            await _credit(client, sid)
        first, count = frame.chunk_first_offset, frame.num_records
        floor = subscriber.offset if subscriber.offset_type is OffsetType.OFFSET else -1
        skip = min(floor - first, count) if floor > first else 0  # before the consumer's offset: not handed over
        floor_offset = first + skip  # the first offset handed over, if any (a filter resets skip)
        stream, callback = subscriber.stream, subscriber.callback
        post = filter_value.post_filler() if filter_value is not None else None
        failed = pool.on_error.get(stream)  # (exception, context or chunk) -> whether delivery goes on
        handing = client.smartclient_handing[sid] = asyncio.get_running_loop().create_future()
        token = HANDING.set((id(client), sid))  # a stop asked from within the callback does not wait for it
        stopping = client.smartclient_stopping
        handed = 0
        stop_at: int | None = None  # the offset where a callback that raised said stop
        around = self.smartclient_around_chunk
        try:
            with _NOTHING if around is None else around(stream, count, first):
                if type(callback) is ChunkHandler:
                    chunk = chunk_of(frame, stream, first + skip, first + count, skip, post)
                    if handed := len(chunk):
                        try:
                            maybe_coro = callback(chunk)
                            if maybe_coro is not None:
                                await maybe_coro
                        except Exception as exc:
                            if failed is None:
                                raise
                            if not failed(exc, chunk):
                                handed, stop_at = 0, chunk.first_offset
                else:
                    messages = messages_of(frame)
                    offsets: Sequence[int] = range(first, first + len(messages))
                    if post is not None:
                        kept = [(o, m) for o, m in zip(offsets, messages, strict=True) if o >= first + skip and post(m)]
                        offsets, messages = [o for o, _ in kept], [m for _, m in kept]
                        skip = 0
                    # the credit goes after the first message handed over at or past the chunk's `at`-th position
                    # (a share of the chunk, whatever a filter dropped): messages[:cut], the credit, the rest
                    cut = len(messages) if credited else min(max(bisect_left(offsets, first + at - 1), skip) + 1,
                                                             len(messages))
                    for lo, hi in ((skip, cut), (cut, len(messages))):
                        while lo < hi:  # a callback that raised and said skip: on from the next message
                            contexts = map(tuple.__new__, repeat(MessageContext), zip(
                                repeat(self), repeat(stream), repeat(sid), repeat(subscriber.reference),
                                islice(offsets, lo, hi), repeat(frame.timestamp)))
                            context = None
                            try:
                                for message, context in zip(islice(messages, lo, hi), contexts, strict=True):
                                    if sid in stopping:  # closed by the callback itself: nothing more
                                        raise _Stopped
                                    maybe_coro = callback(message, context)
                                    if maybe_coro is not None:
                                        await maybe_coro
                            except _Stopped:
                                assert context is not None
                                handed += offsets.index(context.offset) - lo
                                stop_at = context.offset
                                break
                            except Exception as exc:
                                if failed is None or context is None:
                                    raise
                                at_fault = offsets.index(context.offset)
                                handed += at_fault - lo
                                if not failed(exc, context):
                                    stop_at = context.offset
                                    break
                                handed, lo = handed + 1, at_fault + 1
                                continue
                            handed += hi - lo
                            break
                        if stop_at is not None:
                            break
                        if not credited:
                            credited = True
                            await _credit(client, sid)
        except Exception:  # (with no on_error: rstream logs it) the credit is never lost
            if not credited:
                await _credit(client, sid)
            raise
        finally:
            HANDING.reset(token)
            del client.smartclient_handing[sid]
            handing.set_result(None)
            left = self.smartclient_left if self.smartclient_left and stream not in self.smartclient_streams else None
            (self.smartclient_consumed if left is None else left["smartclient_consumed"])[stream] += handed
            (self.smartclient_chunks if left is None else left["smartclient_chunks"])[stream] += 1
        if stop_at is not None:  # nothing more is handed over; the position ends before that message
            stopping.add(sid)
            if stop_at > floor_offset or getattr(subscriber, "smartclient_moved", False):
                subscriber.offset = stop_at
                subscriber.smartclient_moved = True
            return
        end = first + count
        if subscriber.offset is None or end > subscriber.offset:
            subscriber.offset = end
            subscriber.smartclient_moved = True  # a chunk was handed over: see position()
        if not credited:  # every message was before the consumer's offset, or filtered out
            await _credit(client, sid)


async def _credit(client: Any, sid: int) -> None:
    """One more chunk for subscription ``sid``; nothing on a connection that is gone (recovery follows), so
    that a chunk's handing over is never cut by it."""
    try:
        await client.credit(sid, 1)
    except Exception as exc:
        if client.is_connection_alive():
            raise
        log.debug("no credit for subscription %d on a closed connection: %s", sid, exc)


def new_carrier(role: Role, host: StreamHost, settings: ClientSettings, entry: Address, name: str,
                limit: int) -> Any:
    """An rstream Producer (or Consumer) whose connections ``host`` places and whose losses it is told of."""
    # rstream's own pool never dials (the placed pool does, logging in through smartclient.credentials)
    kwargs: dict[str, Any] = dict(
        host=entry.host, port=entry.port, username=settings.credentials.username, password="", vhost=settings.vhost,
        ssl_context=settings.tls, frame_max=settings.frame_max, heartbeat=settings.heartbeat, connection_name=name)
    carrier: PlacedProducer | PlacedConsumer
    if role is Role.PRODUCER:
        carrier = PlacedProducer(**kwargs, max_publishers_by_connection=limit)
    else:
        carrier = PlacedConsumer(**kwargs, max_subscribers_by_connection=limit)
    carrier._pool = PlacedClientPool(host, role, carrier, settings)
    carrier.smartclient_host = host
    return carrier


async def _on_metadata(carrier: Any, client: Any, role: Role, frame: schema.MetadataUpdate) -> None:
    """A MetadataUpdate that reached ``client``: only the carrier's stream on that very connection is lost (a
    shared connection carries other carriers' streams, and this carrier may have the stream elsewhere)."""
    stream = frame.metadata_info.stream
    if carrier._clients.get(stream) is client:
        carrier.smartclient_host.lost(role, carrier, stream, "Metadata Update")


def name_stream(carrier: Any, stream: str, name: str | None, flow: ConsumerFlow | None = None,
                apart: bool = False) -> None:
    """Record the producer or consumer name of ``stream`` on ``carrier`` (for the placement table), a consumer's
    :class:`ConsumerFlow`, and whether it keeps to connections apart (a single active consumer's)."""
    unname_stream(carrier, stream)
    carrier._pool.names[stream] = name
    if apart:
        carrier._pool.apart.add(stream)
    if flow is not None:
        carrier._pool.flows[stream] = flow


def unname_stream(carrier: Any, stream: str) -> None:
    """Forget what :func:`name_stream` recorded (its handle is released: streams come and go over weeks)."""
    pool = carrier._pool
    pool.names.pop(stream, None)
    pool.flows.pop(stream, None)
    pool.apart.discard(stream)


def on_callback_error(carrier: Any, stream: str, decide: Callable[[Exception, Any], bool] | None) -> None:
    """What the delivery loop does when the callback of ``stream``'s consumer raises: ``decide(exception, context
    or chunk)`` says whether delivery goes on (None: forget it)."""
    if decide is None:
        carrier._pool.on_error.pop(stream, None)
    else:
        carrier._pool.on_error[stream] = decide


def closed_forwarder(carrier: Any, client: Any, handler: Any) -> Any:
    """rstream's connection-closed handler of ``carrier``, told only of its own streams on ``client``
    (a shared connection also carries other carriers' streams)."""

    def forward(info: OnClosedErrorInfo) -> Any:
        streams = [s for s in dict.fromkeys(info.streams) if carrier._clients.get(s) is client]
        return handler(OnClosedErrorInfo(info.reason, streams)) if streams else None

    return forward


async def _delete_on_broker(client: Any, kind: str, ident: int, default: float) -> bool:
    """DeletePublisher / Unsubscribe ``ident``; True once the broker no longer has it (or the connection is
    gone), False if the outcome is unknown (a timeout, a cancellation, another error)."""
    if not client.is_connection_alive():
        return True
    request = client.delete_publisher(ident) if kind == "publisher" else client.unsubscribe(ident)
    try:
        await step(f"deleting the {kind} {ident}", request, default=default)
    except (rx.PublisherDoesNotExist, rx.SubscriptionIDDoesNotExist):
        return True
    except Exception as exc:
        log.debug("deleting %s %s: %s", kind, ident, exc)
        return not client.is_connection_alive()
    return True


def _retire(client: Any, kind: str, ident: int) -> None:
    """Keep ``ident`` taken on its connection until the broker confirms it dropped it, in the background:
    an id whose fate is unknown must not be handed to the next publisher or subscription there."""

    async def retire() -> None:
        for _ in range(3):
            if await _delete_on_broker(client, kind, ident, default=5.0):
                _free_id(client, ident)
                return
        log.warning("the broker never confirmed dropping %s %s: its id stays out of use on that connection",
                    kind, ident)

    task = asyncio.ensure_future(retire())
    _retiring.add(task)
    task.add_done_callback(_retiring.discard)


_retiring: set[asyncio.Future[None]] = set()


async def close_publisher(carrier: RProducer, stream: str) -> None:
    """Delete the publisher of ``stream`` on the broker (within the current deadline), then forget it; an id
    whose deletion is not confirmed stays out of use until it is."""
    unknown = set()
    for pid, publisher in [(i, p) for i, p in carrier._publishers.items() if p.stream == stream]:
        if not await _delete_on_broker(publisher.client, "publisher", pid, default=5.0):
            unknown.add(pid)
    await forget_publisher(carrier, stream, keep=unknown)


async def stop_delivery(carrier: RConsumer, stream: str) -> None:
    """Hand nothing more to the callback of ``stream``'s subscription: once the message (or chunk) it is in has
    been handled, its delivery stops (at once when asked from within that callback)."""
    for sid, subscriber in [(i, s) for i, s in carrier._subscribers.items() if s.stream == stream]:
        await subscriber.client.stop_queue_listener_task(subscriber_id=sid)


async def close_subscriber(carrier: RConsumer, stream: str) -> None:
    """Unsubscribe the subscription of ``stream`` on the broker (within the current deadline), then forget
    it; an id whose unsubscription is not confirmed stays out of use until it is."""
    unknown = set()
    for sid, subscriber in [(i, s) for i, s in carrier._subscribers.items() if s.stream == stream]:
        await subscriber.client.stop_queue_listener_task(subscriber_id=sid)
        if not await _delete_on_broker(subscriber.client, "subscription", sid, default=5.0):
            unknown.add(sid)
    await forget_subscriber(carrier, stream, keep=unknown)


async def forget_publisher(carrier: RProducer, stream: str, dead_only: bool = False,
                           keep: set[int] | frozenset[int] = frozenset()) -> None:
    """Drop rstream's (lost) publisher on ``stream`` and its client entry, without talking to the broker
    (which has already dropped it, or is gone).  ``dead_only``: only if its connection is closed (a loss
    reported after its producer closed must not touch a newer producer of the same stream)."""
    async with carrier._lock:
        for pid, publisher in list(carrier._publishers.items()):
            if publisher.stream == stream and not (dead_only and publisher.client.is_connection_alive()):
                for frame in (schema.PublishConfirm, schema.PublishError, schema.MetadataUpdate):
                    publisher.client._handlers.get(frame, {}).pop(str(pid), None)
                del carrier._publishers[pid]
                if pid in keep:
                    _retire(publisher.client, "publisher", pid)
                else:
                    _free_id(publisher.client, pid)
        await _drop_client(carrier, stream, dead_only)


async def forget_subscriber(carrier: RConsumer, stream: str, dead_only: bool = False,
                            keep: set[int] | frozenset[int] = frozenset()) -> Any:
    """Drop rstream's (lost) subscriber on ``stream``: stop its delivery task (frames still queued are
    discarded: the consumer resumes after the last message it handed over), its handlers and its client
    entry.  Returns the rstream subscriber, or None."""

    def mine() -> list[tuple[int, Any]]:
        return [(sid, s) for sid, s in carrier._subscribers.items()
                if s.stream == stream and not (dead_only and s.client.is_connection_alive())]

    for sid, subscriber in mine():  # (before the lock: a callback finishing its chunk may store an offset)
        await subscriber.client.stop_queue_listener_task(subscriber_id=sid)
    found = None
    async with carrier._lock:
        for sid, subscriber in mine():
            found = subscriber
            client = subscriber.client
            await client.stop_queue_listener_task(subscriber_id=sid)  # (stopped already, or put off)
            forget_handlers(client, sid)  # (and the answers to its activations being worked out)
            client._frames.pop(sid, None)
            del carrier._subscribers[sid]
            if sid in keep:
                _retire(client, "subscription", sid)
            elif (deferred := getattr(client, "smartclient_deferred", {}).get(sid)) is not None:
                deferred.add_done_callback(lambda _, c=client, i=sid: _free_id(c, i))  # free once its task stops
            else:
                _free_id(client, sid)
        await _drop_client(carrier, stream, dead_only)
    return found


def _free_id_in(taken: Collection[int]) -> int:
    """The lowest id not in ``taken``: for a client whose Connection is gone (it ended), so no live id clashes."""
    return next(i for i in itertools.count() if i not in taken)


def _free_id(client: Any, ident: int) -> None:
    conn = connection_of(client)
    if conn is not None:
        conn.give_back(ident)


async def _drop_client(carrier: RProducer | RConsumer, stream: str, dead_only: bool = False) -> None:
    client: Any = carrier._clients.get(stream)
    if client is None or (dead_only and client.is_connection_alive()):
        return
    del carrier._clients[stream]
    await client.remove_stream(stream)
    await client.free_available_id()
    conn = connection_of(client)
    if conn is None:
        return
    if all(other is not client for other in carrier._clients.values()):
        conn.forwards.pop(id(carrier), None)  # this carrier has nothing left on it
    if conn.alive() and await client.get_stream_count() == 0:
        host: StreamHost = carrier.smartclient_host  # type: ignore[union-attr]
        await host.unused(conn)


# -- producers and consumers -------------------------------------------------------------------------
async def declare_publisher(carrier: Any, stream: str, name: str | None) -> tuple[Any, int]:
    """Place and declare the publisher of ``stream`` on ``carrier``; its client and publisher id."""
    publisher = await carrier._get_or_create_publisher(stream, publisher_name=name)
    return publisher.client, publisher.id


async def stored_sequence(client: Any, stream: str, name: str) -> int:
    return int(await step("reading the stored publishing id", client.query_publisher_sequence(stream, name)))


async def subscribe(carrier: Any, stream: str, deliver: Any, offset: Any,
                    ready: Callable[[Address], Awaitable[None]] | None = None, **how: Any) -> tuple[int, Any]:
    """Subscribe, within the attempt's time (placement included); the subscription id and rstream's
    subscriber (whose position is the offset after the last chunk).  On any failure, nothing is left.
    ``ready(node)``: awaited once placed, before the Subscribe goes out on the (shared) connection to ``node``."""
    flow: ConsumerFlow | None = carrier._pool.flows.get(stream)
    if flow is not None:
        how["initial_credit"] = flow.initial_credit
    try:
        conn = connection_of(await carrier.smartclient_place(stream))
        if ready is not None and conn is not None:
            await ready(conn.node)
        sid = await step("subscribing", few_at_a_time(conn, carrier.subscribe(
            stream, deliver, offset_specification=offset_spec(offset), **how)))
    except BaseException:
        await asyncio.shield(_abandon_subscription(carrier, stream))
        raise
    subscriber = carrier._subscribers[sid]
    client = subscriber.client  # rstream's handler reacts to its streams on any connection: bind this one
    client._handlers[schema.MetadataUpdate][str(sid)] = partial(_on_metadata, carrier, client, Role.CONSUMER)
    return sid, subscriber


async def _abandon_subscription(carrier: Any, stream: str) -> None:
    sids = {i for i, s in carrier._subscribers.items() if s.stream == stream}
    await forget_subscriber(carrier, stream, keep=sids)


def position(subscriber: Any) -> int | None:
    """The offset after the last chunk handed to the callback, or None before the first.  rstream's subscriber
    starts at the subscription's offset, so its offset alone cannot tell whether a chunk came; comparing it with
    its value when ``subscribe()`` returned missed a first chunk the broker sent right after its answer (issue 18)."""
    return int(subscriber.offset) if getattr(subscriber, "smartclient_moved", False) else None


def busy(subscriber: Any) -> bool:
    """Whether a chunk of ``subscriber`` is being handed to its callback now."""
    return subscriber.subscription_id in getattr(subscriber.client, "smartclient_handing", ())


def queued_chunks(subscriber: Any) -> int:
    """Chunks received for ``subscriber`` and waiting for its callback (the one being processed excluded)."""
    queue = subscriber.client._frames.get(subscriber.subscription_id)
    return queue.qsize() if queue is not None else 0


async def store_offset(client: Any, stream: str, name: str, value: int) -> None:
    await client.store_offset(stream=stream, reference=name, offset=value)

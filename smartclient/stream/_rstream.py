"""The seam between rstream and smartclient: rstream's ``ClientPool``, placed by the Environment.

rstream's ``Producer`` and ``Consumer`` get every connection from
``self._pool.get(...)``: without an address for the locator (metadata)
connection, and with the advertised address of the node rstream chose for a
stream.  :class:`PlacedClientPool` replaces that pool: the locator request
gets the Environment's one shared locator connection, and a stream request
gets a connection placed by smartclient's candidates and node check, whatever
address rstream chose.  ``tests/unit/test_rstream_seam.py`` fails loudly if
rstream moves this seam; the version range is pinned in ``pyproject.toml``.

Recovery is taken over too.  rstream reacts to a lost connection or a MetadataUpdate with
``maybe_restart_producer`` / ``maybe_restart_subscriber``: it drops its bookkeeping, then waits 2-9 s
(producers) or does nothing (consumers, whose recovery is off by default), and never resends
unconfirmed messages.  :class:`PlacedProducer` and :class:`PlacedConsumer` replace those two methods
with a hand-over to the smartclient handle, which recovers under its :class:`RecoveryPolicy`, with
:func:`forget_publisher` / :func:`forget_subscriber` clearing rstream's state first.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rstream import Consumer as RConsumer
from rstream import Producer as RProducer
from rstream import schema
from rstream.client import Addr, Client, ClientPool
from rstream.constants import SlasMechanism
from rstream.producer import _Publisher
from rstream.utils import MonotonicSeq, OnClosedErrorInfo

from smartclient.core.deadline import step
from smartclient.core.topology import Role
from smartclient.stream.tls import NamedClient

if TYPE_CHECKING:
    from smartclient.stream.connector import Connection
    from smartclient.stream.environment import Environment

__all__ = ["LocatorClient", "PlacedClientPool", "PlacedConsumer", "PlacedProducer", "close_publisher",
           "close_subscriber", "closed_forwarder", "forget_publisher", "forget_subscriber"]

log = logging.getLogger(__name__)

MAX_ITEM_ALLOWED = 200  # rstream.constants.MAX_ITEM_ALLOWED; the seam test checks it


class LocatorClient(NamedClient):
    """The Environment's shared metadata connection.  rstream closes its locator after each lookup;
    this one stays open until the Environment closes it with :meth:`shutdown`."""

    async def close(self) -> None:
        return None

    async def shutdown(self) -> None:
        await super().close()


class PlacedClientPool(ClientPool):
    """A ``ClientPool`` whose connections the Environment places.

    Every rstream Producer/Consumer (a *carrier*) of one Environment and role gets its connections from
    the Environment's one list of shared connections for that role (see ``Environment._place``): many
    carriers share one connection per node, up to ``PoolLimits.max_streams_per_connection``.
    Publisher and subscriber ids are therefore taken per *connection* (:meth:`Connection.take_id`), where
    rstream would number them per carrier.
    """

    def __init__(self, env: Environment, role: Role, carrier: Any) -> None:
        super().__init__(
            "placed-by-smartclient", 1, vhost="/", username="-", password="-",
            frame_max=env.settings.frame_max, heartbeat=env.settings.heartbeat,
            load_balancer_mode=False, max_retries=1,
        )
        self.env = env
        self.role = role
        self.carrier = carrier
        self.names: dict[str, str | None] = {}  # stream -> producer/consumer name, for the placement table
        self.last: Connection | None = None  # the connection the last placement returned (for its id)

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
            return await self.env._locator_client()
        conn = await self.env._place(self, stream, connection_closed_handler)
        self.last = conn
        return conn.client

    async def close(self) -> None:
        self._clients.clear()  # the connections are the Environment's: it closes them


_PLACED = Addr("placed-by-smartclient", 0)  # rstream wants an address; the Environment chooses the node


def _conn_of(client: Any) -> Connection | None:
    conn: Connection | None = getattr(client, "smartclient_conn", None)
    return conn


class _Placed:
    """What both placed carriers share: their connections come from the Environment's placement."""

    smartclient_env: Environment
    _pool: ClientPool  # a PlacedClientPool, set by the Environment
    _clients: dict[str, Client]
    _connection_name: str
    _on_connection_closed: Any

    async def _get_or_create_client(self, stream: str) -> Client:
        # rstream would first ask its locator where to go: the Environment's placement decides that
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
        conn = _conn_of(client)
        publisher_id = conn.take_id(self._publishers) if conn is not None else self._get_next_available_id()
        await client.inc_available_id()
        publisher = self._publishers[publisher_id] = _Publisher(
            id=publisher_id, stream=stream, reference=publisher_name, sequence=MonotonicSeq(), client=client)
        try:
            await step("declaring the publisher", client.declare_publisher(
                stream=stream, reference=publisher_name, publisher_id=publisher_id))
        except BaseException:
            await forget_publisher(self, stream)
            raise
        client.add_handler(schema.MetadataUpdate, self._on_metadata_update, name=str(publisher_id))
        return publisher

    async def _on_metadata_update(self, frame: schema.MetadataUpdate) -> None:
        stream = frame.metadata_info.stream
        if stream in self._clients:  # a shared connection also carries other carriers' streams
            self.smartclient_env._lost(Role.PRODUCER, self, stream, "Metadata Update")

    async def maybe_restart_producer(self, reason: str, stream: str) -> None:
        self.smartclient_env._lost(Role.PRODUCER, self, stream, reason)


class PlacedConsumer(_Placed, RConsumer):
    """rstream's Consumer, placed by smartclient, with subscription ids per connection and its recovery
    handed to the smartclient Consumer of the stream."""

    async def get_available_id(self) -> int:
        # called by rstream's _create_subscriber right after _get_or_create_client, under the carrier's lock
        pool = self._pool
        conn = pool.last if isinstance(pool, PlacedClientPool) else None
        if conn is None:
            return await super().get_available_id()
        return conn.take_id(self._subscribers)

    async def maybe_restart_subscriber(self, reason: str, stream: str) -> None:
        self.smartclient_env._lost(Role.CONSUMER, self, stream, reason)


def closed_forwarder(carrier: Any, client: Any, handler: Any) -> Any:
    """rstream's connection-closed handler of ``carrier``, told only of its own streams on ``client``
    (a shared connection also carries other carriers' streams)."""

    def forward(info: OnClosedErrorInfo) -> Any:
        streams = [s for s in dict.fromkeys(info.streams) if carrier._clients.get(s) is client]
        return handler(OnClosedErrorInfo(info.reason, streams)) if streams else None

    return forward


async def close_publisher(carrier: RProducer, stream: str) -> None:
    """Delete the publisher of ``stream`` on the broker (within the current deadline), then forget it."""
    for publisher in [p for p in carrier._publishers.values() if p.stream == stream]:
        if publisher.client.is_connection_alive():
            try:
                await step("deleting the publisher", publisher.client.delete_publisher(publisher.id), default=5.0)
            except Exception as exc:  # gone already (stream deleted, connection closing): nothing to undo
                log.debug("deleting publisher %s of %s: %s", publisher.id, stream, exc)
    await forget_publisher(carrier, stream)


async def close_subscriber(carrier: RConsumer, subscription_id: int | None, stream: str) -> None:
    """Unsubscribe on the broker (within the current deadline), then forget the subscriber."""
    subscriber = carrier._subscribers.get(subscription_id) if subscription_id is not None else None
    if subscription_id is not None and subscriber is not None and subscriber.client.is_connection_alive():
        await subscriber.client.stop_queue_listener_task(subscriber_id=subscription_id)
        try:
            await step("unsubscribing", subscriber.client.unsubscribe(subscription_id), default=5.0)
        except Exception as exc:
            log.debug("unsubscribing %s from %s: %s", subscription_id, stream, exc)
    await forget_subscriber(carrier, stream)


async def forget_publisher(carrier: RProducer, stream: str, dead_only: bool = False) -> None:
    """Drop rstream's (lost) publisher on ``stream`` and its client entry, without talking to the broker
    (which has already dropped it, or is gone).  ``dead_only``: only if its connection is closed (a loss
    reported after its producer closed must not touch a newer producer of the same stream)."""
    async with carrier._lock:
        for pid, publisher in list(carrier._publishers.items()):
            if publisher.stream == stream and not (dead_only and publisher.client.is_connection_alive()):
                for frame in (schema.PublishConfirm, schema.PublishError, schema.MetadataUpdate):
                    publisher.client._handlers.get(frame, {}).pop(str(pid), None)
                del carrier._publishers[pid]
                _free_id(publisher.client, pid)
        await _drop_client(carrier, stream, dead_only)


async def forget_subscriber(carrier: RConsumer, stream: str, dead_only: bool = False) -> Any:
    """Drop rstream's (lost) subscriber on ``stream``: stop its delivery task (frames still queued are
    discarded: the consumer resumes after the last message it handed over), its handlers and its client
    entry.  Returns the rstream subscriber, or None."""
    found = None
    async with carrier._lock:
        for sid, subscriber in list(carrier._subscribers.items()):
            if subscriber.stream == stream and not (dead_only and subscriber.client.is_connection_alive()):
                found = subscriber
                client = subscriber.client
                await client.stop_queue_listener_task(subscriber_id=sid)
                for frame in (schema.Deliver, schema.MetadataUpdate, schema.ConsumerUpdateResponse):
                    client._handlers.get(frame, {}).pop(str(sid), None)
                client._frames.pop(sid, None)
                del carrier._subscribers[sid]
                _free_id(client, sid)
        await _drop_client(carrier, stream, dead_only)
    return found


def _free_id(client: Any, ident: int) -> None:
    conn = _conn_of(client)
    if conn is not None:
        conn.ids.discard(ident)


async def _drop_client(carrier: RProducer | RConsumer, stream: str, dead_only: bool = False) -> None:
    client: Any = carrier._clients.get(stream)
    if client is None or (dead_only and client.is_connection_alive()):
        return
    del carrier._clients[stream]
    await client.remove_stream(stream)
    await client.free_available_id()
    conn = _conn_of(client)
    if conn is None:
        return
    if all(other is not client for other in carrier._clients.values()):
        conn.forwards.pop(id(carrier), None)  # this carrier has nothing left on it
    if conn.alive() and await client.get_stream_count() == 0:
        env: Environment = carrier.smartclient_env  # type: ignore[union-attr]
        await env._unused(conn)

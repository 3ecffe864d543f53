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

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from rstream import Consumer as RConsumer
from rstream import Producer as RProducer
from rstream import schema
from rstream.client import Addr, Client, ClientPool
from rstream.constants import SlasMechanism

from .tls import NamedClient
from .topology import Role

if TYPE_CHECKING:
    from .connector import Connection
    from .environment import Environment

__all__ = ["LocatorClient", "PlacedClientPool", "PlacedConsumer", "PlacedProducer", "forget_publisher",
           "forget_subscriber"]

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
    """A ``ClientPool`` whose connections the Environment places (one per rstream Producer/Consumer)."""

    def __init__(self, env: Environment, role: Role) -> None:
        super().__init__(
            "placed-by-smartclient", 1, vhost="/", username="-", password="-",
            frame_max=env.settings.frame_max, heartbeat=env.settings.heartbeat,
            load_balancer_mode=False, max_retries=1,
        )
        self.env = env
        self.role = role
        self.placed: list[Connection] = []
        self.names: dict[str, str | None] = {}  # stream -> producer/consumer name, for the placement table

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
        return conn.client

    async def close(self) -> None:
        for conn in self.placed:
            await self.env.connector.close_connection(conn)
        self.placed.clear()
        self._clients.clear()


class PlacedProducer(RProducer):
    """rstream's Producer, whose recovery is handed to the smartclient Producer of the stream."""

    smartclient_env: Environment

    async def maybe_restart_producer(self, reason: str, stream: str) -> None:
        self.smartclient_env._lost(Role.PRODUCER, self, stream, reason)


class PlacedConsumer(RConsumer):
    """rstream's Consumer, whose recovery is handed to the smartclient Consumer of the stream."""

    smartclient_env: Environment

    async def maybe_restart_subscriber(self, reason: str, stream: str) -> None:
        self.smartclient_env._lost(Role.CONSUMER, self, stream, reason)


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
                del carrier._subscribers[sid]
        await _drop_client(carrier, stream, dead_only)
    return found


async def _drop_client(carrier: RProducer | RConsumer, stream: str, dead_only: bool = False) -> None:
    client: Any = carrier._clients.get(stream)
    if client is None or (dead_only and client.is_connection_alive()):
        return
    del carrier._clients[stream]
    try:
        await client.remove_stream(stream)
        await client.free_available_id()
        if client.is_connection_alive() and await client.get_stream_count() == 0:
            task = asyncio.ensure_future(client.close())  # in the background: close() sleeps 0.2 s
            _closing.add(task)
            task.add_done_callback(_closing.discard)
    except Exception as exc:  # a broken connection: nothing left to tidy
        log.debug("dropping %s from its connection: %s", stream, exc)


_closing: set[asyncio.Future[None]] = set()

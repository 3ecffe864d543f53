"""What the seam holds in rstream, counted (for :mod:`smartclient.stream.accounting`), and raw writes until one is
confirmed (the test bed's probe of when a stream takes writes again)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["carrier_clients", "carrier_tables", "client_tables", "write_until_confirmed"]

# (a consumer carrier's counts per stream are judged by those of streams it no longer consumes: accounting.py)
_CARRIER_TABLES = ("_clients", "_publishers", "_subscribers", "_waiting_for_confirm", "_buffered_messages", "names",
                   "flows", "on_error")
_CLIENT_TABLES = ("_frames", "_tasks", "_waiters", "_streams", "extra_waiters", "smartclient_handing",
                  "smartclient_deferred", "smartclient_updates")


def _size(value: Any) -> int:
    try:
        return len(value)
    except TypeError:
        return 0


def carrier_tables(carrier: Any) -> Counter[str]:
    """The sizes of an rstream Producer's or Consumer's tables (by stream, id or name), and ours on it."""
    return Counter({f"carrier {name.strip('_')}": _size(getattr(carrier, name, ())) for name in _CARRIER_TABLES})


def carrier_clients(carrier: Any) -> list[Any]:
    clients = getattr(carrier, "_clients", {})
    return list(clients.values()) if isinstance(clients, dict) else []


def client_tables(client: Any) -> Counter[str]:
    """The sizes of an rstream client's tables: frame handlers, delivery queues, tasks, waiters, streams."""
    counts: Counter[str] = Counter()
    handlers = getattr(client, "_handlers", None)
    if isinstance(handlers, dict):
        counts["client handlers"] = sum(_size(v) for v in handlers.values())
    for name in _CLIENT_TABLES:
        counts[f"client {name.strip('_').replace('smartclient_', '')}"] = _size(getattr(client, name, ()))
    return counts


async def write_until_confirmed(client: Any, stream: str, next_id: Callable[[], int], body: Callable[[int], bytes],
                                every: float) -> int:
    """Declare a publisher (id 1) on ``client`` and publish one AMQP 1.0 message every ``every`` seconds (ids from
    ``next_id``, bodies from ``body``) until one is confirmed; return its id (the caller bounds the wait)."""
    from rstream import AMQPMessage, schema

    confirmed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    sent: set[int] = set()

    def on_confirm(frame: Any) -> None:
        got = sent.intersection(frame.publishing_ids)
        if got and not confirmed.done():
            confirmed.set_result(min(got))

    client.add_handler(schema.PublishConfirm, on_confirm, name="probe")
    await client.declare_publisher(stream, None, 1)
    while not confirmed.done():
        ident = next_id()
        sent.add(ident)
        data = bytes(AMQPMessage(body=body(ident)))
        await client.publish([schema.Message(publishing_id=ident, filter_value=None, data=data)], 1)
        await asyncio.wait([confirmed], timeout=every)
    return confirmed.result()

"""A stream connection that hears nothing is ended: the silence watch of :class:`~.wire.NamedClient`."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from smartclient.keepalive import silence_limit

__all__ = ["watch_silence"]

log = logging.getLogger(__name__)


async def watch_silence(client: Any, dead_after: float, heartbeat: float = 0) -> None:
    """End ``client``'s connection once it heard nothing (rstream's ``_last_heartbeat`` is the time of the last
    frame received) for :func:`~smartclient.keepalive.silence_limit` of its ``heartbeat`` and ``dead_after`` (half
    a second less, looked at every half second): the peer, or a load balancer's link to it, went silent without a
    reset or a FIN.  Its reader then ends, and the connection's streams recover
    elsewhere.  A loop that was itself held (a blocking callback) is not the peer's silence: a late wake-up starts
    the count again."""
    limit = silence_limit(heartbeat, dead_after)
    step = min(0.5, limit / 4)
    while client.is_connection_alive():
        asked = time.monotonic()
        await asyncio.sleep(step)
        now = time.monotonic()
        if now - asked > step + limit / 4:  # the loop was held: what arrived meanwhile is not read yet
            client._last_heartbeat = max(client._last_heartbeat, now)
            continue
        if getattr(client, "smartclient_busy_until", 0.0) > now:
            client._last_heartbeat = max(client._last_heartbeat, now)  # at work on a long request: see long_request
            continue
        silent = now - client._last_heartbeat
        if silent > limit - step:  # looked at every step: found within limit
            client.smartclient_silent_for = silent
            log.warning("%s:%s (%s): heard nothing for %.1f s (dead_after %g s): ending the connection",
                        client.host, client.port, client._client_properties.get("connection_name"), silent,
                        dead_after)
            if (writer := getattr(client._conn, "_writer", None)) is not None:
                writer.transport.abort()  # the reader ends: the streams on it recover
            return

"""The silence watch: a stream connection that heard nothing for dead_after is ended; a held loop is no silence."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from smartclient.stream._rstream.silence import watch_silence


class Transport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class Client:
    host, port = "lb", 5552

    def __init__(self, last: float) -> None:
        self._last_heartbeat = last
        self._client_properties = {"connection_name": "smartclient-1"}
        self.transport = Transport()
        self._conn: Any = type("Conn", (), {"_writer": type("W", (), {"transport": self.transport})()})()
        self.smartclient_silent_for: float | None = None

    def is_connection_alive(self) -> bool:
        return not self.transport.aborted


async def test_a_connection_that_hears_nothing_is_ended_within_the_limit() -> None:
    client = Client(time.monotonic())
    started = time.monotonic()
    await asyncio.wait_for(watch_silence(client, 0.4), 5)
    assert client.transport.aborted and 0.3 <= time.monotonic() - started <= 1.5
    assert client.smartclient_silent_for is not None and client.smartclient_silent_for > 0.3


async def test_a_connection_that_hears_something_is_kept() -> None:
    client = Client(time.monotonic())
    watch = asyncio.ensure_future(watch_silence(client, 0.4))
    for _ in range(10):  # a frame every 0.1 s for 1 s
        await asyncio.sleep(0.1)
        client._last_heartbeat = time.monotonic()
    assert not client.transport.aborted
    client.transport.aborted = True  # (closed)
    await asyncio.wait_for(watch, 5)


async def test_a_held_loop_is_not_the_peers_silence() -> None:
    client = Client(time.monotonic())
    watch = asyncio.ensure_future(watch_silence(client, 0.4))
    await asyncio.sleep(0.05)
    time.sleep(0.6)  # a callback holds the loop past the limit: what arrived meanwhile is not read yet
    await asyncio.sleep(0.15)
    assert not client.transport.aborted
    await asyncio.wait_for(watch, 5)  # then, hearing nothing more, it is ended
    assert client.transport.aborted

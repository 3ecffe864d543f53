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


async def test_a_connection_ended_under_a_client_without_a_closed_handler_logs_no_traceback(caplog: Any) -> None:
    """rstream logs "Connection Closed Error" with a traceback for a client with no closed handler (the test bed's
    probes had none: partitions filled the bench's output with them); every client new_client makes has one."""
    from smartclient.stream._rstream import new_client

    async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = new_client(None, host="127.0.0.1", port=port, tls=None, frame_max=1048576, heartbeat=0, name="probe",
                        on_closed=None, max_ids=200, server_hostname=None)
    try:
        await client.start()
        deadline = time.monotonic() + 5
        while not client.smartclient_reader_ended and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert client.smartclient_reader_ended, "the reader did not see the end"
        assert "Connection Closed Error" not in caplog.text
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_a_connection_at_work_on_a_long_request_is_not_silent_until_its_deadline() -> None:
    """The broker creating a super stream's partitions sends nothing, heartbeats included (500 partitions: 14 s):
    the watch stands aside until the request's own deadline, then counts afresh."""
    client = Client(time.monotonic())
    client.smartclient_busy_until = time.monotonic() + 0.8  # type: ignore[attr-defined]
    started = time.monotonic()
    await asyncio.wait_for(watch_silence(client, 0.4), 5)
    assert client.transport.aborted and time.monotonic() - started >= 0.8 + 0.15


async def test_a_long_request_waits_its_own_timeout_and_marks_the_connection_busy_meanwhile() -> None:
    from rstream import schema

    from smartclient.stream._rstream.requests import long_request, super_stream_timeout

    seen: dict[str, Any] = {}

    class Answer:
        def check_response_code(self, raise_exception: bool) -> None:
            seen["checked"] = raise_exception

    class Locator:
        smartclient_busy_until = 0.0

        def wait_frame(self, answer: Any, corr_id: int, timeout: float) -> Any:
            seen["timeout"], seen["busy"] = timeout, self.smartclient_busy_until - time.monotonic()

            async def answered() -> Answer:
                return Answer()
            return answered()

        async def send_frame(self, frame: Any) -> None:
            seen["frame"] = frame

    locator = Locator()
    frame = schema.DeleteSuperStream(7, super_stream="s")
    await long_request(locator, frame, schema.DeleteSuperStreamResponse, super_stream_timeout(500))
    assert seen["timeout"] == super_stream_timeout(500) == 110.0 and seen["busy"] > 100
    assert seen["frame"] is frame and seen["checked"] is True and locator.smartclient_busy_until == 0.0

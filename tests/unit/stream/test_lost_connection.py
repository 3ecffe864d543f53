"""A stream connection the peer closes is let go at once: its reader ends, its heartbeat stops with it, its read
area (1 MiB) is handed back without waiting for the garbage collector, and nothing holds the client, or (over
TLS) its SSL buffers, until the next heartbeat (60 s)."""

from __future__ import annotations

import asyncio
import gc
import weakref

from smartclient.stream._rstream.wire import NamedClient


def test_a_connection_the_peer_closes_stops_its_heartbeat_and_is_freed() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        accepted = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set()
            writer.close()  # the broker (or a load balancer) closes the connection

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            closed: list[object] = []  # (as the Environment's: rstream logs a traceback without one)
            client = NamedClient(host="127.0.0.1", port=port, frame_max=1 << 20, heartbeat=60,
                                 connection_closed_handler=closed.append)
            await client.start()
            client._start_heartbeat()  # as rstream's handshake does once it is tuned
            heartbeat = client._tasks["heartbeat_sender"]
            listener = client._tasks["listener"]
            await asyncio.wait_for(accepted.wait(), 5)
            await asyncio.wait_for(asyncio.wait({listener}), 5)  # the reader saw the close
            await asyncio.sleep(0)  # (the cancelled heartbeat runs its cancellation)
            gone = weakref.ref(client)
            alive, stopped = client.is_connection_alive(), heartbeat.cancelled()
            area = client._conn._reader._area  # type: ignore[union-attr]
            assert area.closed, "the lost connection's read area waits for the garbage collector"
            del client, listener, heartbeat
            gc.collect()
            return stopped, alive, gone() is None

    stopped, alive, freed = asyncio.run(scenario())
    assert stopped, "the heartbeat of a lost connection still runs (it held the connection for up to 60 s)"
    assert not alive
    assert freed, "something still holds the lost connection's client"


def test_a_request_made_after_the_reader_stopped_fails_at_once() -> None:
    """A TLS alert right after the handshake (a refused client certificate) can stop the reader before the login's
    first request is registered: that request failed only at its 10 s bound (CI, 2026-12-02)."""
    async def scenario() -> BaseException | None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        async with server:
            client = NamedClient(host="127.0.0.1", port=server.sockets[0].getsockname()[1], frame_max=1 << 20,
                                 heartbeat=60, connection_closed_handler=lambda info: None)
            await client.start()
            await asyncio.wait_for(asyncio.wait({client._tasks["listener"]}), 5)  # the reader is gone ...
            assert client.smartclient_reader_ended
            try:
                await asyncio.wait_for(client.peer_properties(), 1.0)  # ... before the first request
            except (ConnectionError, OSError) as exc:
                return exc
            return None

    error = asyncio.run(scenario())
    assert isinstance(error, ConnectionResetError) and "closed the connection before answering" in str(error)

"""The stream connection's reader (issue 32): the socket read into one fixed area outside malloc, over a real
loopback socket: every frame whole and in order whatever its size and however the bytes arrive, reading paused
while the area is full and resumed as frames are taken, and a peer that goes away ends the reader as rstream
expects."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
from rstream.connection import ConnectionClosed

from smartclient.stream._rstream.frames import read_frame_raw
from smartclient.stream.socket_reader import _LOW, READ_AREA, FrameReader, open_frames

SIZES = [0, 1, 9, 1000, READ_AREA - _LOW - 4, READ_AREA - _LOW - 3, READ_AREA, 3 * READ_AREA, 17, 200_000, 5]


def framed(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


def payloads_of(sizes: list[int], seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for size in sizes]


async def served(send: Callable[[asyncio.StreamWriter], Awaitable[None]],
                 scenario: Callable[[FrameReader], Awaitable[None]]) -> None:
    async def handle(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await send(writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await open_frames("127.0.0.1", port)
    try:
        assert isinstance(reader, FrameReader)
        await asyncio.wait_for(scenario(reader), 30)
    finally:
        writer.transport.abort()
        server.close()
        await server.wait_closed()


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_frame_comes_whole_and_in_order_whatever_its_size_and_however_its_bytes_arrive(seed: int) -> None:
    payloads = payloads_of(SIZES * 3, seed)
    data = framed(payloads)

    async def send(writer: asyncio.StreamWriter) -> None:
        rng, pos = random.Random(seed), 0
        while pos < len(data):  # pieces of every size, some splitting a size prefix
            step = rng.choice([1, 3, 4, 5, 700, 65_536, 300_000])
            writer.write(data[pos:pos + step])
            pos += step
            await writer.drain()

    async def scenario(reader: FrameReader) -> None:
        assert [await read_frame_raw(reader) for _ in payloads] == payloads
        with pytest.raises(ConnectionClosed):  # then the peer closed
            await read_frame_raw(reader)
        assert reader.at_eof()

    asyncio.run(served(send, scenario))


def test_a_reader_that_does_not_read_pauses_the_socket_and_gets_everything_once_it_reads() -> None:
    payloads = payloads_of([100_000] * 40 + [2 * READ_AREA] + [100] * 1000, 7)

    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(framed(payloads))
        await writer.drain()

    async def scenario(reader: FrameReader) -> None:
        await until(lambda: reader._paused)  # the area full of frames not read: reading stopped
        assert reader._tail - reader._head > READ_AREA - _LOW
        got = []
        for _ in payloads:
            got.append(await read_frame_raw(reader))
        assert got == payloads

    asyncio.run(served(send, scenario))


def test_a_peer_gone_in_the_middle_of_a_frame_ends_the_reader_after_the_whole_ones() -> None:
    whole = payloads_of([10, 300_000, 3 * READ_AREA], 9)

    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(framed(whole) + struct.pack(">I", 50) + b"torn")
        await writer.drain()

    async def scenario(reader: FrameReader) -> None:
        assert [await read_frame_raw(reader) for _ in whole] == whole
        assert not reader._area.closed
        with pytest.raises(ConnectionClosed):
            await read_frame_raw(reader)
        assert reader._area.closed  # handed back once nothing more comes, not at the next garbage collection

    asyncio.run(served(send, scenario))


def test_a_released_reader_reads_nothing_more_and_drops_what_still_comes() -> None:
    late = framed([b"after the release"]) * 1000
    sent = asyncio.Event()

    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(framed([b"first"]))
        await writer.drain()
        await asyncio.wait_for(released.wait(), 10)
        writer.write(late)
        await writer.drain()
        sent.set()
        await asyncio.wait_for(finished.wait(), 30)  # held open: the reader ends only because it was released

    released, finished = asyncio.Event(), asyncio.Event()
    errors: list[dict[str, object]] = []

    async def scenario(reader: FrameReader) -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
        assert await read_frame_raw(reader) == b"first"
        transport = reader._transport
        reader.release()
        reader.release()  # idempotent
        assert reader._area.closed
        taken = [0]
        get_buffer = reader.get_buffer

        def counted(hint: int) -> memoryview:
            taken[0] += 1
            return get_buffer(hint)
        reader.get_buffer = counted  # type: ignore[method-assign]
        released.set()
        await asyncio.wait_for(sent.wait(), 10)
        assert reader._transport is None  # (asyncio's TLS layer keeps the protocol: no cycle back to it)
        await until(lambda: taken[0] > 0 or transport is None or transport.is_closing())
        assert transport is not None and not transport.is_closing()  # read, and thrown away
        with pytest.raises(ConnectionClosed):
            await read_frame_raw(reader)
        assert errors == []
        finished.set()  # (the server's handler ends: Python 3.12+ waits for it when the server closes)

    asyncio.run(served(send, scenario))


def test_a_peer_that_resets_the_connection_gets_the_area_back_too() -> None:
    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(framed([b"last"]))
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close: an RST
        writer.transport.abort()

    async def scenario(reader: FrameReader) -> None:
        assert await read_frame_raw(reader) == b"last"
        with pytest.raises((ConnectionClosed, ConnectionResetError)):  # (an OSError: rstream's reader takes both)
            await read_frame_raw(reader)
        assert reader._area.closed  # the reset's error keeps the failed read's frames: their locals cleared

    asyncio.run(served(send, scenario))


def test_a_frame_larger_than_the_area_cut_short_ends_the_reader() -> None:
    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(struct.pack(">I", 4 * READ_AREA) + bytes(READ_AREA))
        await writer.drain()

    async def scenario(reader: FrameReader) -> None:
        with pytest.raises(ConnectionClosed):
            await read_frame_raw(reader)

    asyncio.run(served(send, scenario))


def test_asyncios_byte_reads_are_refused_the_reader_hands_out_whole_frames() -> None:
    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(framed([b"abc"]))
        await writer.drain()

    async def scenario(reader: FrameReader) -> None:
        for call in (reader.read(3), reader.readexactly(3), reader.readline(), reader.readuntil(b"c")):
            with pytest.raises(TypeError, match="use frame"):
                await call
        assert await read_frame_raw(reader) == b"abc"

    asyncio.run(served(send, scenario))


def test_a_size_no_stream_frame_has_drops_the_connection_and_takes_no_memory_for_it() -> None:
    """An AMQP listener dialled by mistake answers ``AMQP\\x00\\x00\\x09\\x01``: read as a size, 1.1 GB."""
    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(b"AMQP\x00\x00\x09\x01")
        await writer.drain()

    async def scenario(reader: FrameReader) -> None:
        with pytest.raises(ConnectionClosed):
            await read_frame_raw(reader)
        assert reader._big is None

    asyncio.run(served(send, scenario))

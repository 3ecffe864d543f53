"""The machine's limits, for bench/publish.py and bench/consume.py: a stream client that does nothing but frames.

* :func:`raw_publish`: one connection writes one pre-encoded Publish frame of 1000 100-byte messages in a loop
  (at most ``window`` frames unconfirmed) and counts confirms by reading each PublishConfirm frame's count,
  never its ids.  It uses a few hundredths of a core: the broker sets its rate.
* :func:`raw_read`: one connection subscribes from the first offset and counts the records of each Deliver
  frame from its header, granting a credit per chunk, without decoding a message.

Both open their connection with rstream's handshake (through smartclient's seam), then stop its reader and
heartbeat and own the socket.  Not library code: only these benches use it.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

from smartclient.stream._rstream.frames import read_frame_raw
from smartclient.testing.streams import raw_stream_client
from smartclient.testing.testbed import TestBed

_SIZE = struct.Struct(">I")
_PUBLISH_CONFIRM, _DELIVER = 0x0003, 0x0008


async def _own_socket(client: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    await client.stop_task("listener")
    await client.stop_task("heartbeat_sender")
    return client._conn._reader, client._conn._writer


def publish_frame(publisher_id: int, body: bytes, count: int = 1000) -> bytes:
    """One Publish frame (version 1) of ``count`` copies of ``body`` with ids 1..count."""
    entries = b"".join(struct.pack(">QI", i, len(body)) + body for i in range(1, count + 1))
    payload = struct.pack(">HHBI", 0x0002, 1, publisher_id, count) + entries
    return _SIZE.pack(len(payload)) + payload


async def raw_publish(bed: TestBed, host: str, port: int, stream: str, messages: int, body: bytes,
                      window: int = 20) -> float:
    """Messages per second, from the first frame written to the last confirm read."""
    per_frame = 1000
    frame = publish_frame(1, body, per_frame)
    async with raw_stream_client(bed, host, port, "bench-raw-publisher") as client:
        await client.declare_publisher(stream=stream, reference=None, publisher_id=1)
        reader, writer = await _own_socket(client)
        frames = messages // per_frame
        room = asyncio.Semaphore(window)
        confirmed = 0

        async def read_confirms() -> None:
            nonlocal confirmed
            while confirmed < frames * per_frame:
                raw = await read_frame_raw(reader)
                if (raw[0] << 8 | raw[1]) == _PUBLISH_CONFIRM:
                    before = confirmed
                    confirmed += _SIZE.unpack_from(raw, 5)[0]
                    for _ in range(confirmed // per_frame - before // per_frame):
                        room.release()

        started = time.perf_counter()
        reading = asyncio.ensure_future(read_confirms())
        for _ in range(frames):
            await room.acquire()
            writer.write(frame)
            await writer.drain()
        await reading
        return frames * per_frame / (time.perf_counter() - started)


async def raw_read(bed: TestBed, host: str, port: int, stream: str, messages: int, credit: int = 10) -> float:
    """Records per second from a subscription at the first offset, from the first chunk to the one that
    completes ``messages``."""
    async with raw_stream_client(bed, host, port, "bench-raw-reader") as client:
        await client.subscribe(stream, subscription_id=1, initial_credit=credit)  # from the first offset
        reader, writer = await _own_socket(client)
        one_credit = struct.pack(">IHHBH", 7, 0x0009, 1, 1, 1)
        count = 0
        started = 0.0
        while count < messages:
            raw = await read_frame_raw(reader)
            if (raw[0] << 8 | raw[1]) == _DELIVER:
                if not started:
                    started = time.perf_counter()
                count += _SIZE.unpack_from(raw, 9)[0]
                writer.write(one_credit)
        return count / (time.perf_counter() - started)

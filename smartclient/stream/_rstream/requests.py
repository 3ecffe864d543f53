"""The stream commands rstream does not know, sent by smartclient itself on rstream's connections: on a live
connection whose reader hands the answer back (:func:`extra_request`), or with the reader stopped
(:func:`raw_request`); what a connection's broker says it speaks; and a super stream's creation and deletion, which
keep the broker at work for seconds (:func:`long_request`)."""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from collections.abc import Callable
from typing import Any

from rstream import exceptions as rx
from rstream import schema

from smartclient._errors import ConnectionFailed
from smartclient.core.deadline import step
from smartclient.stream._rstream.wire import EXTRA_RESPONSES, _NamedConnection

__all__ = ["broker_version", "command_versions", "create_super_stream", "delete_super_stream", "extra_request",
           "long_request", "raw_request", "super_stream_timeout"]


async def command_versions(locator: Any) -> dict[int, tuple[int, int]]:
    """The broker's stream commands, ``{key: (min_version, max_version)}`` (ExchangeCommandVersions)."""
    ours = [schema.FrameHandlerInfo(2, 1, 2)]  # what we speak is not what matters here
    response = await locator.sync_request(
        schema.ExchangeCommandVersionRequest(locator._corr_id_seq.next(), command_versions=ours),
        resp_schema=schema.ExchangeCommandVersionResponse, raise_exception=False,
    )
    return {c.key_command: (c.min_version, c.max_version) for c in response.command_versions}


async def extra_request(client: Any, encode: Callable[[int], bytes], response_key: int) -> bytes:
    """Send a request rstream does not know on ``client``, a live connection that stays usable, and return
    its response (size prefix stripped), within the attempt's time.  ``encode(correlation_id)`` builds the
    frame.  Only for commands the broker announced (ExchangeCommandVersions): it closes a connection
    that sends one it does not know."""
    conn = client._conn
    if not isinstance(conn, _NamedConnection) or response_key not in EXTRA_RESPONSES:
        raise ConnectionFailed(f"this connection cannot carry the command {response_key & 0x7FFF:#06x}")
    corr = int(client._corr_id_seq.next())
    waiter: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    conn.extra_waiters[(response_key, corr)] = waiter
    try:
        await conn._write_frame_raw(encode(corr))
        return await step(f"command {response_key & 0x7FFF:#06x}", asyncio.shield(waiter))
    finally:
        conn.extra_waiters.pop((response_key, corr), None)


async def raw_request(client: Any, frame: bytes, response_key: int, refused: Callable[[], BaseException]) -> bytes:
    """Send ``frame`` on ``client`` and return the frame answering it (size prefix stripped), for a command
    rstream does not know (its reader would stop on the answer).  The client's reader, heartbeat and silence watch
    stop: close it afterwards.  ``refused()`` is raised if the broker closes instead of answering."""
    await client.stop_task("listener")
    await client.stop_task("heartbeat_sender")
    if "silence_watch" in client._tasks:  # nothing is read now: the wait below has its own bound
        await client.stop_task("silence_watch")
    conn = client._conn
    conn._writer.write(frame)
    await conn._writer.drain()
    for _ in range(16):  # skip heartbeats or other frames that were already on their way
        raw = bytes(await conn._read_frame_raw())
        (key,) = struct.unpack_from(">H", raw, 0)
        if key == response_key:
            return raw
        if key in (0x0016, 0x0016 | 0x8000):  # Close: the broker does not know the command
            break
    raise refused()


def broker_version(client: Any) -> tuple[int, ...]:
    """The RabbitMQ version an opened connection's broker gave in its peer properties (``()`` if it gave none
    that reads as one)."""
    text = str((client.server_properties or {}).get("version", ""))
    parts = []
    for part in text.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


#: the seconds a super stream's creation or deletion may take, per partition, on top of rstream's 10 s: the broker
#: creates (or deletes) every partition's replicas in the connection's own process and sends nothing meanwhile, not
#: even a heartbeat (500 partitions took 14 s on the test bed's three nodes, beyond rstream's 10 s)
SUPER_STREAM_SECONDS_PER_PARTITION = 0.2


def super_stream_timeout(partitions: int) -> float:
    """How long creating or deleting a super stream of ``partitions`` may take before it is given up."""
    return 10.0 + SUPER_STREAM_SECONDS_PER_PARTITION * partitions


async def long_request(client: Any, frame: Any, answer: Any, timeout: float) -> None:
    """Send ``frame`` and wait up to ``timeout`` for its ``answer``, the silence watch standing aside meanwhile: a
    broker at work on it sends nothing, heartbeats included.  A connection dropped meanwhile is found by the
    timeout instead."""
    client.smartclient_busy_until = time.monotonic() + timeout
    try:
        waiter = client.wait_frame(answer, frame.corr_id, timeout=timeout)
        await client.send_frame(frame)
        (await waiter).check_response_code(raise_exception=True)
    finally:
        client.smartclient_busy_until = 0.0


async def create_super_stream(locator: Any, super_stream: str, names: list[str], keys: list[str],
                              arguments: dict[str, str]) -> bool:
    """Create it; False if it exists already."""
    frame = schema.CreateSuperStream(locator._corr_id_seq.next(), super_stream=super_stream, partitions=names,
                                     binding_keys=keys,
                                     arguments=[schema.Property(k, str(v)) for k, v in arguments.items()])
    try:
        await long_request(locator, frame, schema.CreateSuperStreamResponse, super_stream_timeout(len(names)))
    except rx.StreamAlreadyExists:
        return False
    return True


async def delete_super_stream(locator: Any, super_stream: str, partitions: int) -> None:
    """Delete it (and its ``partitions`` partitions)."""
    frame = schema.DeleteSuperStream(locator._corr_id_seq.next(), super_stream=super_stream)
    await long_request(locator, frame, schema.DeleteSuperStreamResponse, super_stream_timeout(partitions))

"""The StreamStats command (RabbitMQ 3.11+), which rstream does not implement.

rstream decodes every frame through its ``Key`` enum, so a StreamStats response would stop its
reader.  smartclient therefore opens a short connection of its own through the connector (so the
resolver, allow-list and node check still apply), lets rstream do the handshake, stops rstream's
reader and heartbeat on that connection, exchanges the one request/response itself, and closes it.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from smartclient._errors import ConnectionFailed, FeatureNotSupported, StreamNotFound

if TYPE_CHECKING:
    from smartclient.core.topology import Candidates
    from smartclient.stream.connector import StreamConnector

__all__ = ["STREAM_STATS_KEY", "STREAM_STATS_RESPONSE", "decode_stream_stats", "encode_stream_stats",
           "query_stream_stats", "request_stream_stats", "stream_stats_from"]

STREAM_STATS_KEY = 0x001C  # (the seam's EXTRA_RESPONSES holds its answer: tests/unit/test_stream_stats_kept.py)
STREAM_STATS_RESPONSE = STREAM_STATS_KEY | 0x8000
_OK, _NO_STREAM = 1, 2


def encode_stream_stats(correlation_id: int, stream: str) -> bytes:
    name = stream.encode()
    body = struct.pack(">HHIh", STREAM_STATS_KEY, 1, correlation_id, len(name)) + name
    return struct.pack(">I", len(body)) + body


def decode_stream_stats(frame: bytes, stream: str) -> dict[str, int]:
    """Decode a StreamStats response (without its 4-byte size prefix)."""
    key, _version, _corr, code = struct.unpack_from(">HHIH", frame, 0)
    if key != STREAM_STATS_RESPONSE:
        raise ConnectionFailed(f"expected a StreamStats response, got frame key {key:#06x}")
    if code == _NO_STREAM:
        raise StreamNotFound(f"stream {stream!r} does not exist")
    if code != _OK:
        raise ConnectionFailed(f"StreamStats on {stream!r} answered code {code}")
    (count,) = struct.unpack_from(">i", frame, 10)
    pos, stats = 14, {}
    for _ in range(count):
        (size,) = struct.unpack_from(">h", frame, pos)
        name = frame[pos + 2 : pos + 2 + size].decode()
        (value,) = struct.unpack_from(">q", frame, pos + 2 + size)
        stats[name] = value
        pos += 2 + size + 8
    return stats


async def query_stream_stats(client: Any, stream: str, in_place: bool = False) -> dict[str, int]:
    """Run StreamStats on ``client``, an authenticated rstream client smartclient owns; the client is
    unusable afterwards (its reader is stopped): close it.  ``in_place`` (for a broker known to answer it,
    3.11+): as a request its reader hands back, and the client stays usable."""
    from smartclient.stream import _rstream

    def refused() -> FeatureNotSupported:
        return FeatureNotSupported("the broker does not answer StreamStats: it needs RabbitMQ 3.11 or later")

    if in_place:
        raw = await request_stream_stats(client, stream)
    else:
        raw = await _rstream.raw_request(client, encode_stream_stats(1, stream), STREAM_STATS_RESPONSE, refused)
    return decode_stream_stats(raw, stream)


async def request_stream_stats(client: Any, stream: str) -> bytes:
    """StreamStats sent in place on ``client`` (a broker known to answer it, 3.11+): its answer, undecoded (the
    caller tells no answer from an answer that is an error)."""
    from smartclient.stream import _rstream

    return await _rstream.extra_request(client, lambda corr: encode_stream_stats(corr, stream), STREAM_STATS_RESPONSE)


async def stream_stats_from(connector: StreamConnector, candidates: Candidates, stream: str,
                            name: str) -> dict[str, int]:
    """StreamStats of ``stream`` read on a connection of its own to a node of ``candidates`` (a member answers
    with its own view: the leader's is the authority), closed afterwards.  On a broker that answers it in place
    (3.11+), a connection taken from the parking lot stays usable and is put back once it answered, its idle
    time going on.  (A recovering consumer's member reads go through
    :class:`~smartclient.stream.member_reads.MemberReads` instead.)"""
    from smartclient.core.deadline import step
    from smartclient.stream._rstream import broker_version, map_stream_errors

    conn = await connector.acquire(candidates, name)
    in_place = broker_version(conn.client) >= (3, 11)  # (an older one would close it: asked the old way)
    # one borrowed from the parking lot goes back with its idle time going on (the lag sampler reads every few
    # seconds: parked anew each time, it would never close)
    park = in_place and conn.sessions == 0 and conn.idle_since is not None
    since = conn.idle_since
    answered = False
    try:
        with map_stream_errors(f"reading the statistics of {stream!r}"):
            stats = await step("stream statistics", query_stream_stats(conn.client, stream, in_place=in_place))
        answered = True
        return stats
    finally:
        if park and answered and conn.alive():
            await connector.park(conn, since)
        else:  # (its reader is stopped: no Close exchange, whose wait would add to a recovery's)
            await connector.close_connection(conn, handshake=False)

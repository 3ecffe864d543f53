"""ResolveOffsetSpec (RabbitMQ 4.3+): turn ``next``, ``last`` or a timestamp into the concrete offset it
means now, before a consumer subscribes.

A consumer that subscribed with ``next`` and is recovered before its first message would otherwise
subscribe again with ``next``, and skip what was published while it was away.  Subscribing at the
resolved offset instead makes the starting point a fact, not a moving target: the first subscription
and every later one start from the same offset.  rstream does not know the command; it is sent on the
Environment's live metadata connection through the seam (:func:`~smartclient.stream._rstream.extra_request`).
"""

from __future__ import annotations

import struct
from typing import Any

from smartclient._errors import ConnectionFailed, StreamNotFound, TopologyError
from smartclient.core.filters import StreamFilter
from smartclient.core.offsets import OffsetSpec

__all__ = ["RESOLVABLE", "decode_resolved_offset", "encode_resolve_offset_spec", "resolve_offset_spec"]

KEY = 0x001F
RESPONSE = KEY | 0x8000
#: the kinds worth resolving: where they point moves as the stream grows ("first" and offsets do not)
RESOLVABLE = frozenset({"last", "next", "timestamp", "interval"})
_TYPES = {"first": 1, "last": 2, "next": 3, "offset": 4, "timestamp": 5, "interval": 5}
_OK, _NO_STREAM, _NOT_AVAILABLE, _NO_OFFSET = 1, 2, 6, 19


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def encode_resolve_offset_spec(correlation_id: int, stream: str, spec: OffsetSpec,
                               stream_filter: StreamFilter | None = None, now: float | None = None) -> bytes:
    """The request frame, size prefix included.  A filter is passed as the subscription passes it
    (``filter.N``, ``match-unfiltered``), so that the offset is where that filtered read starts."""
    kind = _TYPES[spec.kind]
    body = struct.pack(">HHI", KEY, 1, correlation_id) + _string(stream) + struct.pack(">H", kind)
    if spec.kind == "offset":
        body += struct.pack(">Q", int(spec.value))  # type: ignore[arg-type]
    elif kind == 5:
        body += struct.pack(">q", spec.timestamp_ms(now))
    properties: list[tuple[str, str]] = []
    if stream_filter is not None:
        properties = [(f"filter.{i}", value) for i, value in enumerate(stream_filter.values)]
        properties.append(("match-unfiltered", "true" if stream_filter.match_unfiltered else "false"))
    body += struct.pack(">i", len(properties)) + b"".join(_string(k) + _string(v) for k, v in properties)
    return struct.pack(">I", len(body)) + body


def decode_resolved_offset(frame: bytes, stream: str) -> int | None:
    """The resolved offset from a response (without its size prefix); None when the broker has no offset
    for the spec (an empty stream, a timestamp after the last chunk)."""
    key, _version, _corr, code = struct.unpack_from(">HHIH", frame, 0)
    if key != RESPONSE:
        raise ConnectionFailed(f"expected a ResolveOffsetSpec response, got frame key {key:#06x}")
    if code == _NO_STREAM:
        raise StreamNotFound(f"resolving an offset on {stream!r}: the stream does not exist")
    if code == _NOT_AVAILABLE:
        raise TopologyError(f"resolving an offset on {stream!r}: the stream has no member available yet")
    if code == _NO_OFFSET:
        return None
    if code != _OK:
        raise ConnectionFailed(f"ResolveOffsetSpec on {stream!r} answered code {code}")
    _type, offset = struct.unpack_from(">HQ", frame, 10)
    return int(offset)


async def resolve_offset_spec(client: Any, stream: str, spec: OffsetSpec,
                              stream_filter: StreamFilter | None = None) -> int | None:
    """Resolve ``spec`` on ``client`` (a live connection whose broker announced the command)."""
    from smartclient.stream import _rstream

    raw = await _rstream.extra_request(
        client, lambda corr: encode_resolve_offset_spec(corr, stream, spec, stream_filter), RESPONSE)
    return decode_resolved_offset(raw, stream)

"""ResolveOffsetSpec frames (RabbitMQ 4.3+): encoded as PROTOCOL.adoc says, answers decoded. No broker."""

from __future__ import annotations

import struct

import pytest

from smartclient import ConnectionFailed, OffsetSpec, StreamFilter, StreamNotFound, TopologyError
from smartclient.stream.resolve_offset import decode_resolved_offset, encode_resolve_offset_spec


def _fields(frame: bytes) -> tuple[int, int, int, str, int, bytes]:
    (size,) = struct.unpack_from(">I", frame, 0)
    assert size == len(frame) - 4
    key, version, corr, name_len = struct.unpack_from(">HHIh", frame, 4)
    name = frame[14:14 + name_len].decode()
    (kind,) = struct.unpack_from(">H", frame, 14 + name_len)
    return key, version, corr, name, kind, frame[16 + name_len:]


def test_next_has_no_offset_value_and_no_properties() -> None:
    key, version, corr, name, kind, rest = _fields(encode_resolve_offset_spec(7, "orders", OffsetSpec.next()))
    assert (key, version, corr, name, kind) == (0x001F, 1, 7, "orders", 3)
    assert rest == struct.pack(">i", 0)


def test_timestamp_and_interval_carry_milliseconds() -> None:
    *_, kind, rest = _fields(encode_resolve_offset_spec(1, "s", OffsetSpec("timestamp", 1_700_000_000_000)))
    assert kind == 5 and struct.unpack_from(">q", rest, 0)[0] == 1_700_000_000_000
    *_, kind, rest = _fields(encode_resolve_offset_spec(1, "s", OffsetSpec.interval("1h"), now=10_000.0))
    assert kind == 5 and struct.unpack_from(">q", rest, 0)[0] == (10_000 - 3600) * 1000


def test_a_filter_is_passed_as_the_subscription_passes_it() -> None:
    *_, rest = _fields(encode_resolve_offset_spec(1, "s", OffsetSpec.last(), StreamFilter(["eu", "us"])))
    (count,) = struct.unpack_from(">i", rest, 0)
    pairs, pos = [], 4
    for _ in range(count * 2):
        (n,) = struct.unpack_from(">h", rest, pos)
        pairs.append(rest[pos + 2:pos + 2 + n].decode())
        pos += 2 + n
    assert pairs == ["filter.0", "eu", "filter.1", "us", "match-unfiltered", "false"]


def _query_offset_response(code: int, offset: int = 0) -> bytes:
    return struct.pack(">HHIHHQ", 0x801F, 1, 3, code, 4, offset)


def test_answers_decode_to_an_offset_none_or_a_typed_error() -> None:
    assert decode_resolved_offset(_query_offset_response(1, 42), "s") == 42
    assert decode_resolved_offset(_query_offset_response(19), "s") is None  # no offset: the spec is kept
    with pytest.raises(StreamNotFound, match="'s'"):
        decode_resolved_offset(_query_offset_response(2), "s")
    with pytest.raises(TopologyError):
        decode_resolved_offset(_query_offset_response(6), "s")
    with pytest.raises(ConnectionFailed, match="code 16"):
        decode_resolved_offset(_query_offset_response(16), "s")

"""The Publish frames a producer writes, packed here: the frame header, each entry's header and, by default,
each body's AMQP 1.0 data section header (:mod:`smartclient.core.amqp_data`), with one ``struct`` call per
entry, when a frame is written (:class:`~smartclient.stream.publishing.PublishBuffer` keeps bodies as they came).

With ``encoding="amqp"`` (the default) an entry is ``>QIIB`` (publishing id, size, the data section's descriptor
and vbin8 code, the body's length) then the body, or ``>QIII`` for a body of 256 bytes or more: 5 or 8 bytes
more than with ``encoding="raw"`` (``>QI``, then the body).  A body that is an AMQP 1.0 message already
(rstream's ``AMQPMessage``, which carries application properties) is kept as :class:`Encoded` and written as it
encodes itself, in either encoding.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any

from smartclient._errors import ConfigurationError
from smartclient.core.amqp_data import DATA8, DATA32, SHORT

__all__ = ["ENTRY", "ENTRY_V2", "FRAME_OVERHEAD", "HEADER", "PID", "PUBLISH_KEY", "SUB_ENTRY_COMPRESSIONS", "Encoded",
           "Records", "as_part", "entries", "entry_size", "entry_sizes", "filtered_entry", "sub_entry"]

PUBLISH_KEY = 0x0002
HEADER = struct.Struct(">IHHBI")  # size, key, version, publisher id, message count
ENTRY = struct.Struct(">QI")  # publishing id, message size
ENTRY_V2 = struct.Struct(">Qh")  # publishing id, filter value size (-1: none)
PID = struct.Struct(">Q")  # a sub-entry's publishing id: the entry that follows says its own size
FRAME_OVERHEAD = HEADER.size  # 13 bytes
_SUB_ENTRY = struct.Struct(">BHII")  # 0x80 | compression << 4, records, uncompressed size, size
_SIZE = struct.Struct(">I")
# an entry (publishing id, size) or a record (size) and the data section's header: descriptor and code, length
_ENTRY8, _ENTRY32 = struct.Struct(">QIIB"), struct.Struct(">QIII")
_SIZE8, _SIZE32 = struct.Struct(">IIB"), struct.Struct(">III")
_GROW8, _GROW32 = _SIZE8.size - _SIZE.size, _SIZE32.size - _SIZE.size  # 5, 8: what the section adds to a message
SUB_ENTRY_COMPRESSIONS = {"none": 0, "gzip": 1}  # the stream protocol's codes (rstream decodes both)
_BUFFERS = (bytes, bytearray, memoryview)


class Encoded(bytes):
    """A message that is an AMQP 1.0 message already (rstream's ``AMQPMessage``, encoded): written as it is."""

    __slots__ = ()


@dataclass(frozen=True)
class Records:
    """A sub-entry's ``count`` records encoded already, as :func:`sub_entry` encodes a list of bodies (each with its
    size, and with ``amqp`` its data section's header): what a column of bodies becomes without a Python object
    per message (``smartclient.spark.records``)."""

    data: bytes | memoryview
    count: int
    amqp: bool

    def __len__(self) -> int:
        return self.count


def as_part(body: Any) -> bytes:
    """``body`` as the publish path keeps it: ``bytes`` (``bytearray`` and ``memoryview`` copied), or
    :class:`Encoded` for an ``AMQPMessage``; anything else is converted with ``bytes()``, as a body."""
    if type(body) is bytes or type(body) is Encoded:
        return body
    if isinstance(body, _BUFFERS):
        return bytes(body)
    from smartclient.stream._rstream import is_amqp_message  # rstream is loaded: a producer exists

    return Encoded(bytes(body)) if is_amqp_message(body) else bytes(body)


def entry_size(part: bytes, amqp: bool) -> int:
    """What a version 1 entry of ``part`` adds to a frame: its header, its data section's, and ``part``."""
    size = len(part)
    if not amqp or type(part) is Encoded:
        return size + ENTRY.size
    return size + (_ENTRY8.size if size < SHORT else _ENTRY32.size)


def entry_sizes(parts: Sequence[bytes], amqp: bool) -> Iterable[int]:
    """:func:`entry_size` of each of ``parts`` (bodies, none :class:`Encoded`), in C where they all take the
    same header."""
    lens = list(map(len, parts))
    if not amqp:
        return map(ENTRY.size.__add__, lens)
    if max(lens) < SHORT:
        return map(_ENTRY8.size.__add__, lens)
    if min(lens) >= SHORT:
        return map(_ENTRY32.size.__add__, lens)
    return [size + (_ENTRY8.size if size < SHORT else _ENTRY32.size) for size in lens]


def entries(ids: Sequence[int], parts: Sequence[bytes], amqp: bool, encoded: bool) -> Iterable[bytes]:
    """The version 1 entries of a frame, headers and parts in turn, for ``b"".join``: one ``struct`` call per
    entry, all in C unless the batch mixes short and long bodies, or holds an :class:`Encoded` one (``encoded``)."""
    lens = list(map(len, parts))
    heads: Iterable[bytes]
    if not amqp:
        heads = map(ENTRY.pack, ids, lens)
    elif encoded:
        heads = list(map(_entry_head, ids, parts, lens))
    elif max(lens) < SHORT:
        heads = map(_ENTRY8.pack, ids, map(_GROW8.__add__, lens), repeat(DATA8), lens)
    elif min(lens) >= SHORT:
        heads = map(_ENTRY32.pack, ids, map(_GROW32.__add__, lens), repeat(DATA32), lens)
    else:
        heads = list(map(_entry_head, ids, parts, lens))
    return chain.from_iterable(zip(heads, parts, strict=True))


def _entry_head(pid: int, part: bytes, size: int) -> bytes:
    if type(part) is Encoded:
        return ENTRY.pack(pid, size)
    if size < SHORT:
        return _ENTRY8.pack(pid, size + _GROW8, DATA8, size)
    return _ENTRY32.pack(pid, size + _GROW32, DATA32, size)


def _record_heads(parts: list[bytes], amqp: bool) -> Iterable[bytes]:
    """The size (and data section) header of each of a sub-entry's records: as :func:`entries`, without ids."""
    lens = list(map(len, parts))
    if not amqp:
        return map(_SIZE.pack, lens)
    if Encoded not in set(map(type, parts)):
        if max(lens) < SHORT:
            return map(_SIZE8.pack, map(_GROW8.__add__, lens), repeat(DATA8), lens)
        if min(lens) >= SHORT:
            return map(_SIZE32.pack, map(_GROW32.__add__, lens), repeat(DATA32), lens)
    return map(_size_head, parts, repeat(amqp))


def _size_head(part: bytes, amqp: bool) -> bytes:
    """A message's size, and its data section's header if it gets one."""
    size = len(part)
    if not amqp or type(part) is Encoded:
        return _SIZE.pack(size)
    if size < SHORT:
        return _SIZE8.pack(size + _GROW8, DATA8, size)
    return _SIZE32.pack(size + _GROW32, DATA32, size)


def filtered_entry(publishing_id: int, value: str | None, part: bytes, amqp: bool) -> bytes:
    """A version 2 entry (with a filter value), packed whole: kept as it is until its frame is written."""
    encoded = value.encode() if value is not None else b""
    return (ENTRY_V2.pack(publishing_id, len(encoded) if value is not None else -1) + encoded
            + _size_head(part, amqp) + part)


def sub_entry(bodies: list[Any] | Records, compression: str = "none", encoding: str = "amqp") -> bytes:
    """One sub-entry of ``bodies`` (as :func:`as_part` keeps them, or :class:`Records` encoded already): the
    records, each with its size (and, with ``encoding="amqp"``, its data section's header), compressed as a whole
    with ``compression`` ("none" or "gzip"), behind the sub-entry header.

    :raises ConfigurationError: no bodies, more than 65,535, an unknown compression, or records encoded for the
        other encoding."""
    count = bodies.count if isinstance(bodies, Records) else len(bodies)
    if not 0 < count <= 0xFFFF:
        raise ConfigurationError(f"a sub-entry holds 1 to 65535 messages, not {count}")
    if compression not in SUB_ENTRY_COMPRESSIONS:
        raise ConfigurationError(f"sub-entry compression {compression!r}: use one of {sorted(SUB_ENTRY_COMPRESSIONS)}")
    records: bytes | memoryview
    if isinstance(bodies, Records):
        if bodies.amqp != (encoding == "amqp"):
            raise ConfigurationError(f"records encoded {'with' if bodies.amqp else 'without'} AMQP data sections "
                                     f"for a producer whose encoding is {encoding!r}")
        records = memoryview(bodies.data).cast("B")  # its bytes, whatever the view's items
    else:
        parts = list(map(as_part, bodies))
        records = b"".join(chain.from_iterable(zip(_record_heads(parts, encoding == "amqp"), parts, strict=True)))
    packed = gzip.compress(records, compresslevel=1, mtime=0) if compression == "gzip" else records
    code = SUB_ENTRY_COMPRESSIONS[compression]
    return _SUB_ENTRY.pack(0x80 | code << 4, count, len(records), len(packed)) + packed

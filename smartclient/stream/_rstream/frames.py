"""The seam to rstream, frame side: the socket read in large pieces, and the frames of the hot paths decoded
with one ``struct`` call each.

rstream reads its socket 256 bytes at a time and decodes every frame field by field through a ``BytesIO``: a
PublishConfirm one publishing id at a time (a third of the publish path's time), a Deliver chunk by copying its
data out and then each message again (issue 21).  Here:

* :func:`read_frame_raw` reads a frame out of a :class:`~smartclient.stream.socket_reader.FrameReader` (the
  socket read into one fixed area that holds several frames);
* :func:`decode_hot` turns PublishConfirm, PublishError and Deliver (version 1) frames into rstream's own frame
  classes (its handlers are dispatched on the class), with the publishing ids as one ``array``, and a Deliver's
  data left in the frame it came in (no copy); any other frame, or one these do not expect, is left to rstream;
* :func:`messages_of` splits a Deliver chunk into its message bodies, over the frame it came in, a message that
  is exactly one AMQP 1.0 data section (what smartclient's producers write by default) as the body inside it;
  :func:`stored_of` splits it into the messages as stored (what an AMQP 1.0 decoder reads).

What a frame must hold is checked as rstream checks it (the data length, the chunk type, the CRC): a frame that
fails a check is handed to rstream's decoder, which raises as it always did.
"""

from __future__ import annotations

import asyncio
import struct
import sys
from array import array
from typing import Any

from rstream import schema
from rstream.connection import ConnectionClosed

from smartclient.core.amqp_data import DATA8, DATA32, strip_data
from smartclient.stream.socket_reader import FrameReader

try:  # zlib-ng's CRC-32 (SIMD: about 15x zlib's on a 110 KB chunk here); the [stream] extra brings it
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - installed without the extra's optional speed-up
    from zlib import crc32

__all__ = ["decode_hot", "messages_of", "read_frame_raw", "stored_of"]


_SIZE = struct.Struct(">I")
_MESSAGE_HEAD = struct.Struct(">IIB")  # a message's size, then its first 5 bytes: a data section's header (vbin8)
#: the first 9 bytes of each message that is exactly one data section with a body under 256 bytes -> its length
_DATA8_HEADS = {_MESSAGE_HEAD.pack(n + 5, DATA8, n): n for n in range(256)}
_ID_HEAD = struct.Struct(">HHBI")  # key, version, publisher id, count (PublishConfirm, PublishError)
_ERROR_ENTRY = struct.Struct(">QH")  # a PublishError's publishing id and code
# key, version, subscription id, then the Osiris chunk header: magic, chunk type, entries, records, timestamp,
# epoch, first offset, CRC, data length, trailer length, reserved
_DELIVER = struct.Struct(">HHBbbHIqQQIIII")
DELIVER_DATA = _DELIVER.size  # 53: where a Deliver frame's chunk data begins
_CONFIRM, _ERROR, _DELIVER_KEY = 0x0003, 0x0004, 0x0008
_SWAP = sys.byteorder == "little"
_new = object.__new__


async def read_frame_raw(reader: asyncio.StreamReader) -> bytes:
    """The next frame on ``reader``, without its size prefix.

    :raises ConnectionClosed: (rstream's) the peer closed the connection, as rstream's reader expects."""
    try:
        if isinstance(reader, FrameReader):
            return await reader.frame()
        head = await reader.readexactly(4)
        return await reader.readexactly(_SIZE.unpack(head)[0])
    except asyncio.IncompleteReadError:
        raise ConnectionClosed from None


def decode_hot(raw: bytes) -> Any:
    """rstream's frame for ``raw`` if it is one decoded here, else None (a frame too short for its header
    included: rstream's decoder raises for it)."""
    key = raw[0] << 8 | raw[1]
    try:
        if key == _DELIVER_KEY:
            return _deliver(raw)
        if key == _CONFIRM:
            return _confirm(raw)
        if key == _ERROR:
            return _error(raw)
    except struct.error:
        return None
    return None


def _confirm(raw: bytes) -> Any:
    _, version, publisher_id, count = _ID_HEAD.unpack_from(raw)
    if version != 1 or len(raw) != _ID_HEAD.size + 8 * count:
        return None
    ids = array("Q")
    ids.frombytes(raw[_ID_HEAD.size:])
    if _SWAP:
        ids.byteswap()
    frame = _new(schema.PublishConfirm)
    frame.publisher_id = publisher_id
    frame.publishing_ids = ids  # type: ignore[assignment]  # iterated, never changed: an array is one
    return frame


def _error(raw: bytes) -> Any:
    _, version, publisher_id, count = _ID_HEAD.unpack_from(raw)
    if version != 1 or len(raw) != _ID_HEAD.size + 10 * count:
        return None
    frame = _new(schema.PublishError)
    frame.publisher_id = publisher_id
    frame.errors = [schema.PublishingError(pid, code) for pid, code in _ERROR_ENTRY.iter_unpack(raw[_ID_HEAD.size:])]
    return frame


def _deliver(raw: bytes) -> Any:
    (_, version, subscription_id, magic, chunk_type, entries, records, timestamp, epoch, first, crc, length,
     trailer, reserved) = _DELIVER.unpack_from(raw)
    data = memoryview(raw)[DELIVER_DATA:]
    if version != 1 or chunk_type != 0 or len(data) != length or crc32(data) != crc:
        return None  # rstream's decoder raises what it always raised ("Invalid frame", "Invalid checksum")
    frame = _new(schema.Deliver)
    frame.__dict__.update(
        subscription_id=subscription_id, magic_version=magic, chunk_type=chunk_type, num_entries=entries,
        num_records=records, timestamp=timestamp, epoch=epoch, chunk_first_offset=first, chunk_crc=crc,
        data_length=length, trailer_length=trailer, _reserved=reserved, data=data, smartclient_raw=raw)
    return frame


def messages_of(frame: Any) -> list[bytes]:
    """The message bodies of a Deliver chunk, in order (a sub-entry batch's records uncompressed, as rstream
    does), each its own ``bytes``: a message that is exactly one AMQP 1.0 data section as the body in it, any
    other (raw bytes, an AMQP 1.0 message with properties or annotations) whole."""
    raw = frame.__dict__.get("smartclient_raw")
    if raw is None:  # decoded by rstream
        return [strip_data(bytes(m)) for m in frame.get_messages()]
    out: list[bytes] = []
    append = out.append
    short_body, unpack_head, unpack = _DATA8_HEADS.get, _MESSAGE_HEAD.unpack_from, _SIZE.unpack_from
    data32 = DATA32
    pos, end = DELIVER_DATA, len(raw)  # the data ends the frame (checked when it was decoded)
    while pos < end:
        # the common case in one dict look-up: the 9 bytes a message of exactly one data section under 256 bytes
        # starts with (its size, the section's header, the body's length) name the body's length
        n = short_body(raw[pos:pos + 9])
        if n is not None:
            pos += 9
            after = pos + n
            append(raw[pos:after])
            pos = after
            continue
        try:
            size, head, _ = unpack_head(raw, pos)
        except struct.error:  # under 9 bytes left: the frame's last message, shorter than 5 bytes
            size, head = unpack(raw, pos)[0], 0
        if size > 0x7FFFFFFF:  # a sub-entry batch: its type byte, then records, sizes and (compressed) data
            records, used = schema.SubEntryChunk.read(raw, raw[pos], pos + 1)
            out.extend(strip_data(bytes(r)) for r in records)
            pos += 1 + used
            continue
        after = pos + 4 + size
        if head == data32 and size >= 8 and unpack(raw, pos + 8)[0] + 8 == size:  # one data section, vbin32
            append(raw[pos + 12:after])
        else:  # raw bytes, or an AMQP 1.0 message with more than one data section: whole
            append(raw[pos + 4:after])
        pos = after
    return out


def stored_of(frame: Any) -> list[bytes]:
    """The messages of a Deliver chunk as stored (a data section included), in order, each its own ``bytes``."""
    raw = frame.__dict__.get("smartclient_raw")
    if raw is None:  # decoded by rstream
        return [bytes(m) for m in frame.get_messages()]
    out: list[bytes] = []
    append = out.append
    unpack = _SIZE.unpack_from
    pos, end = DELIVER_DATA, len(raw)
    while pos < end:
        size = unpack(raw, pos)[0]
        if size > 0x7FFFFFFF:
            records, used = schema.SubEntryChunk.read(raw, raw[pos], pos + 1)
            out.extend(bytes(r) for r in records)
            pos += 1 + used
            continue
        after = pos + 4 + size
        append(raw[pos + 4:after])
        pos = after
    return out

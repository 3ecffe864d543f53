"""The seam to rstream, column side: a Deliver chunk as an Arrow ``RecordBatch`` over the frame it came in.

Columns (:func:`smartclient._pyarrow.schema`): ``offset``, ``timestamp`` (the chunk's) and ``body``.  The body
column is a ``binary_view``: 16 bytes per message (its length, then its first 12 bytes inline when it is that
short, else its first 4 bytes, a buffer index and an offset), into one data buffer that is the frame itself.
Not one body is copied, and no Python object is made per message; the column keeps the frame alive.

A body is what :func:`~smartclient.stream._rstream.frames.messages_of` hands over: a message that is exactly one
AMQP 1.0 data section as the bytes inside it, any other message whole.  Where the messages start:

* messages of one size (what most producers write): one strided look at every size, no loop;
* else a Python loop over the sizes alone (about 0.1 µs a message), still with no body copied;
* a chunk with sub-entry batches (their records compressed, or packed in a batch) copies its bodies once into
  a column, as does a frame rstream decoded.

Then whether each message is one data section, and where its body starts, is decided for all at once (numpy).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

from smartclient._pyarrow import PROPERTY_NAMES, arrow, decoded_schema, schema
from smartclient.core.amqp_data import DATA8, DATA32
from smartclient.core.delivery import Chunk
from smartclient.stream._rstream.frames import DELIVER_DATA, messages_of, stored_of
from smartclient.stream._rstream.messages import body_of, decode_amqp_message

__all__ = ["chunk_batch", "chunk_of", "decoded_batch"]

_SIZE = struct.Struct(">I")
_INLINE = 12  # a binary_view value this long or shorter is held in its view


def chunk_of(frame: Any, stream: str, start: int, end: int, skip: int, post: Any) -> Chunk:
    """The chunk a ChunkHandler gets: the messages from ``start``, split when it asks for them (the bodies at
    once with a filter, which reads each one), split as stored only if it decodes them, and as columns only if
    it asks for them (:meth:`Chunk.to_arrow`)."""
    first = start - skip
    if post is None:
        return Chunk(stream, range(start, end), frame.timestamp,
                     (lambda: messages_of(frame)[skip:]) if skip else partial(messages_of, frame),
                     decode_amqp_message,
                     (lambda: stored_of(frame)[skip:]) if skip else partial(stored_of, frame),
                     partial(_columns, frame, first, slice(skip, None) if skip else None))
    bodies = messages_of(frame)[skip:]
    kept = [index for index, message in enumerate(bodies) if post(message)]

    def stored() -> list[bytes]:
        every = stored_of(frame)[skip:]
        return [every[index] for index in kept]

    def columns(decoded: Chunk | None) -> Any:  # (the kept indexes shifted only if columns are asked for)
        return _columns(frame, first, [skip + index for index in kept], decoded)

    return Chunk(stream, [start + index for index in kept], frame.timestamp, [bodies[index] for index in kept],
                 decode_amqp_message, stored, columns)


def _columns(frame: Any, first: int, keep: slice | Sequence[int] | None, decoded: Chunk | None) -> Any:
    """What :meth:`Chunk.to_arrow` calls: the frame's columns, or ``decoded`` 's messages decoded."""
    return chunk_batch(frame, first, keep) if decoded is None else decoded_batch(decoded)


def decoded_batch(chunk: Chunk) -> Any:
    """``chunk`` 's messages decoded as AMQP 1.0 messages (:meth:`Chunk.messages`), as columns: ``offset``,
    ``timestamp``, ``body`` (the data sections' bytes, or the value's text), ``properties`` (a struct of the
    properties section's fields) and ``application_properties`` (a map of text to text: a number or a boolean as
    its text, bytes as UTF-8 text).

    :raises MessageDecodeError: a message is not an AMQP 1.0 message; it names its offset."""
    pa, np = arrow()
    messages = chunk.messages()
    bodies, properties, applications = [], [], []
    for message in messages:
        bodies.append(body_of(message))
        given = message.properties
        properties.append(None if given is None else {
            name: _property(name, getattr(given, name, None)) for name in PROPERTY_NAMES})
        table = message.application_properties
        applications.append(None if table is None else [(_text(k), _text(v)) for k, v in table.items()])
    fields = decoded_schema()
    offsets = np.asarray(list(chunk.offsets), dtype=np.int64)
    return pa.RecordBatch.from_arrays([
        pa.array(offsets), pa.array(np.full(len(offsets), chunk.timestamp, dtype=np.int64),
                                    fields.field("timestamp").type),
        pa.array(bodies, pa.binary_view()), pa.array(properties, fields.field("properties").type),
        pa.array(applications, fields.field("application_properties").type)], schema=fields)


_TIMES = ("absolute_expiry_time", "creation_time")


def _property(name: str, value: Any) -> Any:
    if value is None or name in _TIMES or name == "group_sequence":
        return value
    if name == "user_id":
        return bytes(value)
    return _text(value)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return str(value).lower() if isinstance(value, bool) else str(value)


def chunk_batch(frame: Any, first: int, keep: slice | Sequence[int] | None = None) -> Any:
    """The messages of Deliver ``frame`` as a ``RecordBatch``, offsets from ``first`` (the chunk's first
    offset); ``keep``: only those messages (a slice, or the indexes a filter kept)."""
    pa, np = arrow()
    raw = frame.__dict__.get("smartclient_raw")
    count = frame.num_records
    views = None
    if raw is not None and frame.num_entries == count:  # simple entries only: each message where it lies
        views = _fixed_views(raw, count, np)
        if views is None:
            starts = _message_starts(raw, count, np)
            if starts is not None:
                views = _views(raw, starts, np)
    offsets = np.arange(first, first + count, dtype=np.int64)
    if views is None:  # sub-entries, or a frame rstream decoded: the bodies copied once
        bodies = messages_of(frame)
        offsets = np.arange(first, first + len(bodies), dtype=np.int64)
        if keep is not None:
            bodies = bodies[keep] if isinstance(keep, slice) else [bodies[index] for index in keep]
            offsets = offsets[keep if isinstance(keep, slice) else np.asarray(keep, dtype=np.int64)]
        body = pa.array(bodies, pa.binary_view())
    else:
        if keep is not None:
            index = keep if isinstance(keep, slice) else np.asarray(keep, dtype=np.int64)
            views, offsets = views[index], offsets[index]
        body = pa.Array.from_buffers(pa.binary_view(), len(views), [None, pa.py_buffer(views), pa.py_buffer(raw)])
    fields = schema()
    count = len(offsets)  # (the timestamp column made from its buffer: pa.array's conversion costs 8 us a chunk)
    timestamps = pa.Array.from_buffers(fields.field("timestamp").type, count,
                                       [None, pa.py_buffer(np.full(count, frame.timestamp, dtype=np.int64))])
    return pa.RecordBatch.from_arrays([pa.array(offsets), timestamps, body], schema=fields)


def _fixed_views(raw: bytes, count: int, np: Any) -> Any:
    """The views of ``count`` messages of one size, each one data section of the same kind or none, all
    checked by strided looks (no loop, no gather); None if they are not.  Big-endian fields are compared as the
    native integers their bytes make (the constant swapped once, not every field)."""
    end = len(raw)
    if count == 0 or end - DELIVER_DATA < 4:
        return None
    size = _SIZE.unpack_from(raw, DELIVER_DATA)[0]
    stride = size + 4
    if stride * count != end - DELIVER_DATA:
        return None
    at = DELIVER_DATA + 4  # the first message
    if not bool((np.ndarray((count,), "=u4", raw, DELIVER_DATA, (stride,)) == _native(size)).all()):
        return None
    header = 0
    if size >= 8:
        descriptors = np.ndarray((count,), "=u4", raw, at, (stride,))
        if bool((descriptors == _NATIVE_DATA8).all()) and bool((np.ndarray((count,), "u1", raw, at + 4, (stride,))
                                                               == size - 5).all()):
            header = 5
        elif bool((descriptors == _NATIVE_DATA32).all()) and bool(
                (np.ndarray((count,), "=u4", raw, at + 4, (stride,)) == _native(size - 8)).all()):
            header = 8
        elif bool(((descriptors == _NATIVE_DATA8) | (descriptors == _NATIVE_DATA32)).any()):
            return None  # some are, some are not: the general way decides each
    elif size >= 5:
        return None  # a short message may be a data section: the general way decides
    length = size - header
    views = np.empty((count, 4), dtype="<i4")
    views[:, 0] = length
    if length > _INLINE:  # its first 4 bytes, buffer 0 (the frame), where it starts in it
        views[:, 1] = np.ndarray((count,), "<i4", raw, at + header, (stride,))
        views[:, 2] = 0
        views[:, 3] = np.arange(at + header, at + header + stride * count, stride, dtype=np.int32)
    else:  # the value itself, zero-padded
        views[:, 1:] = 0
        if length:
            views.view(np.uint8)[:, 4:4 + length] = np.ndarray((count, length), "u1", raw, at + header, (stride, 1))
    return views


def _native(value: int) -> int:
    """The native unsigned 32-bit integer whose bytes are ``value`` big-endian."""
    return int.from_bytes(_SIZE.pack(value), sys.byteorder)


_NATIVE_DATA8, _NATIVE_DATA32 = _native(DATA8), _native(DATA32)


def _message_starts(raw: bytes, count: int, np: Any) -> Any:
    """Where each of ``count`` messages' 4-byte size lies in ``raw`` (numpy int64), or None if the sizes do not
    add up to the frame (rstream's decoder then judges it)."""
    end = len(raw)
    if count == 0:
        return np.empty(0, dtype=np.int64)
    first = _SIZE.unpack_from(raw, DELIVER_DATA)[0] if end - DELIVER_DATA >= 4 else -1
    stride = first + 4
    if first >= 0 and stride * count == end - DELIVER_DATA:  # perhaps all of one size: every size at once
        sizes = np.ndarray((count,), ">u4", raw, DELIVER_DATA, (stride,))
        if bool((sizes == first).all()):
            return DELIVER_DATA + stride * np.arange(count, dtype=np.int64)
    positions: list[int] = []
    append, unpack = positions.append, _SIZE.unpack_from
    pos = DELIVER_DATA
    try:
        for _ in range(count):
            append(pos)
            pos += 4 + unpack(raw, pos)[0]
    except struct.error:
        return None
    if pos != end:
        return None
    return np.array(positions, dtype=np.int64)


def _views(raw: bytes, starts: Any, np: Any) -> Any:
    """The body column's views: each message's body (inside its data section, if it is exactly one) as a view
    into ``raw``."""
    u8 = np.frombuffer(raw, np.uint8)
    last = len(raw) - 1
    count = len(starts)
    sizes = _gather(u8, starts, 4, last, np).astype(np.int64)
    sizes = (sizes[:, 0] << 24) | (sizes[:, 1] << 16) | (sizes[:, 2] << 8) | sizes[:, 3]
    head = _gather(u8, starts + 4, 8, last, np).astype(np.int64)
    descriptor = (head[:, 0] << 24) | (head[:, 1] << 16) | (head[:, 2] << 8) | head[:, 3]
    long_length = (head[:, 4] << 24) | (head[:, 5] << 16) | (head[:, 6] << 8) | head[:, 7]
    data8 = (descriptor == DATA8) & (sizes >= 5) & (head[:, 4] == sizes - 5)
    data32 = (descriptor == DATA32) & (sizes >= 8) & (long_length == sizes - 8)
    header = np.where(data8, 5, np.where(data32, 8, 0))
    begin = starts + 4 + header
    length = sizes - header
    views = np.zeros((count, 4), dtype="<i4")
    views[:, 0] = length
    inline = _gather(u8, begin, _INLINE, last, np)
    inline[np.arange(_INLINE) >= length[:, None]] = 0  # (a short value is zero-padded)
    views.view(np.uint8)[:, 4:16] = inline  # the value itself (12 bytes or fewer), or its first 4 bytes
    long_values = length > _INLINE
    views[long_values, 2] = 0  # its buffer: the frame
    views[long_values, 3] = begin[long_values]
    return views


def _gather(u8: Any, at: Any, width: int, last: int, np: Any) -> Any:
    """``width`` bytes from each of ``at`` (those past the end read as the last byte: masked by the caller)."""
    return u8[np.minimum(at[:, None] + np.arange(width), last)]

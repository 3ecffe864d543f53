"""A column of bodies as sub-entries, with no Python object per row: how the Spark writers publish.

A Spark task gets its rows as Arrow record batches.  Turning each body into a ``bytes``, sizing it, grouping it and
packing its record head one at a time cost the writers more than Spark's own hand-off of the rows (issue 56's
``bench/spark_sink.py``).  Here the same work is done on the column:

* :func:`closed_ends` groups the rows by the rule of ``sink.closed_groups`` (at most ``most`` rows, and no more
  bytes than ``limit`` unless the group is one row), one step per group rather than per row;
* :func:`encode` writes every row's record (its size and, for ``amqp``, its data section's header, then the body)
  into one buffer, with numpy and Arrow's compute kernels; a group's records are one slice of it
  (:class:`~smartclient.stream.publish_frames.Records`), sent as :func:`~smartclient.stream.publish_frames.sub_entry`
  would have encoded the list of the same bodies, byte for byte.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from typing import Any

from smartclient._errors import ConfigurationError
from smartclient._pyarrow import arrow
from smartclient.core.amqp_data import DATA8, DATA32, SHORT

__all__ = ["binary_column", "closed_ends", "concat_columns", "encode", "lengths"]

_DATA8, _DATA32 = struct.pack(">I", DATA8), struct.pack(">I", DATA32)


def binary_column(column: Any, name: str) -> Any:
    """``column`` (binary, string or their large kinds) as a ``large_binary`` Arrow array, one chunk.

    :raises ConfigurationError: a null body, or a column that is not of bytes or text."""
    pa, _ = arrow()
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        raise ConfigurationError(f"a row has a null body column {name!r}")
    kind = column.type
    if not any(check(kind) for check in (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_string,
                                         pa.types.is_large_string, pa.types.is_fixed_size_binary,
                                         pa.types.is_binary_view, pa.types.is_string_view)):
        raise ConfigurationError(f"the body column {name!r} is {kind}: it must hold bytes or text")
    return column.cast(pa.large_binary())


def concat_columns(first: Any, second: Any) -> Any:
    """Two :func:`binary_column` arrays as one."""
    pa, _ = arrow()
    return pa.concat_arrays([first, second])


def lengths(column: Any) -> Any:
    """Each body's size (numpy int64) of a :func:`binary_column`."""
    _, np = arrow()
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64)[column.offset:column.offset + len(column) + 1]
    return np.diff(offsets)


def closed_ends(sizes: Any, most: int, limit: int) -> list[int]:
    """Where the closed groups of rows of ``sizes`` end (exclusive), as ``sink.closed_groups(sizes, most)`` with
    ``limit`` bytes: a group closes at ``most`` rows, or before the row that would take it over ``limit``; the rows
    after the last end are a group still open."""
    count = len(sizes)
    if not count:
        return []
    low, high = int(sizes.min()), int(sizes.max())
    if low == high:  # one size: every group alike
        step = max(1, min(most, limit // high)) if high else most
        last = count if step == most else count - 1  # a group closed by size needs the row after it
        return list(range(step, last + 1, step))
    _, np = arrow()
    running = np.cumsum(sizes).tolist()
    ends: list[int] = []
    start = 0
    while start < count:
        base = running[start - 1] if start else 0
        fits = bisect_right(running, base + limit, start)  # rows start..fits-1 stay within the limit
        end = min(max(fits, start + 1), start + most)
        if end - start < most and end == count:
            break  # open: neither full nor followed by a row that would not fit
        ends.append(end)
        start = end
    return ends


def encode(column: Any, amqp: bool) -> tuple[memoryview, list[int]]:
    """Every row's record of a :func:`binary_column`, in one buffer, and where each starts (with the end last):
    rows ``a`` to ``b`` are ``buffer[starts[a]:starts[b]]``."""
    import pyarrow.compute as pc

    pa, np = arrow()
    count = len(column)
    sizes = lengths(column)
    if not count:
        return memoryview(b""), [0]
    heads, head_sizes = _heads(sizes, amqp, np)
    if isinstance(head_sizes, int) and int(sizes.min()) == int(sizes.max()):  # fixed-size records: two copies
        size = int(sizes[0])
        offsets = np.frombuffer(column.buffers()[1], dtype=np.int64)
        first = int(offsets[column.offset])
        data = column.buffers()[2]
        bodies = np.frombuffer(data, dtype=np.uint8)[first:first + count * size] if size else None
        out = np.empty((count, head_sizes + size), dtype=np.uint8)
        out[:, :head_sizes] = heads
        if bodies is not None:
            out[:, head_sizes:] = bodies.reshape(count, size)
        return memoryview(out.reshape(-1)), list(range(0, (count + 1) * (head_sizes + size), head_sizes + size))
    if isinstance(head_sizes, int):
        flat, head_offsets = heads.reshape(-1), np.arange(0, (count + 1) * head_sizes, head_sizes, dtype=np.int64)
    else:  # 8-bit and 32-bit sections mixed: each row's head is a prefix of its 12-byte slot
        flat = heads[np.arange(heads.shape[1]) < head_sizes[:, None]]
        head_offsets = np.concatenate(([0], np.cumsum(head_sizes))).astype(np.int64)
    head_column = pa.Array.from_buffers(pa.large_binary(), count, [None, pa.py_buffer(head_offsets),
                                                                   pa.py_buffer(flat)])
    joined = pc.binary_join_element_wise(head_column, column, pa.scalar(b"", pa.large_binary()))
    starts = np.frombuffer(joined.buffers()[1], dtype=np.int64)[joined.offset:joined.offset + count + 1]
    return memoryview(joined.buffers()[2]), starts.tolist()


def _heads(sizes: Any, amqp: bool, np: Any) -> tuple[Any, Any]:
    """Each row's record head (a ``(rows, width)`` uint8 array) and its size: one int, or one per row (numpy) when
    8-bit and 32-bit data sections are mixed."""
    count = len(sizes)
    if not amqp:
        heads = np.empty((count, 4), dtype=np.uint8)
        heads[:, :] = sizes.astype(">u4").view(np.uint8).reshape(count, 4)
        return heads, 4
    short = sizes < SHORT
    if short.all():
        heads = np.empty((count, 9), dtype=np.uint8)
        heads[:, 0:4] = (sizes + 5).astype(">u4").view(np.uint8).reshape(count, 4)
        heads[:, 4:8] = np.frombuffer(_DATA8, dtype=np.uint8)
        heads[:, 8] = sizes.astype(np.uint8)
        return heads, 9
    heads = np.empty((count, 12), dtype=np.uint8)
    heads[:, 0:4] = (sizes + 8).astype(">u4").view(np.uint8).reshape(count, 4)
    heads[:, 4:8] = np.frombuffer(_DATA32, dtype=np.uint8)
    heads[:, 8:12] = sizes.astype(">u4").view(np.uint8).reshape(count, 4)
    if not short.any():
        return heads, 12
    heads[short, 0:4] = (sizes[short] + 5).astype(">u4").view(np.uint8).reshape(-1, 4)
    heads[short, 4:8] = np.frombuffer(_DATA8, dtype=np.uint8)
    heads[short, 8] = sizes[short].astype(np.uint8)
    return heads, np.where(short, 9, 12)

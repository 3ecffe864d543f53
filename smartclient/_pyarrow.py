"""The one seam between smartclient and pyarrow (with numpy, which its columns are built with).

Only this module imports pyarrow and numpy, and only when columns are first asked for: ``import smartclient``
imports neither, and the library works without them (the ``[arrow]`` extra).  :func:`arrow` hands both over,
or raises :class:`~smartclient.ConfigurationError` naming the extra to install.

What smartclient relies on: ``pa.binary_view()`` and ``pa.Array.from_buffers`` for a view type (a column whose
values are offsets and lengths into a buffer it does not own: the body column over the frame a chunk came in,
with no copy), which work from pyarrow 19 (apache/arrow#44701); ``pa.py_buffer`` (zero copy over ``bytes``),
``RecordBatch.from_arrays``, ``take``, ``slice`` and ``Table.from_batches``.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from smartclient._errors import ConfigurationError

__all__ = ["MIN_PYARROW", "PROPERTY_NAMES", "arrow", "decoded_schema", "schema"]

MIN_PYARROW = (19, 0)
_INSTALL = "pip install 'smartclient[arrow]'"


@functools.cache
def arrow() -> tuple[ModuleType, ModuleType]:
    """``(pyarrow, numpy)``.

    :raises ConfigurationError: either is missing, or pyarrow is older than :data:`MIN_PYARROW`."""
    try:
        import numpy
        import pyarrow
    except ImportError as exc:
        raise ConfigurationError(f"Arrow reads need pyarrow and numpy ({exc.name} is missing): {_INSTALL}") from exc
    version = tuple(int(part) for part in pyarrow.__version__.split(".")[:2] if part.isdigit())
    if version < MIN_PYARROW:
        raise ConfigurationError(f"Arrow reads need pyarrow {'.'.join(map(str, MIN_PYARROW))} or later (binary_view "
                                 f"columns over a buffer), not {pyarrow.__version__}: {_INSTALL}")
    return pyarrow, numpy


@functools.cache
def schema() -> Any:
    """The columns of a chunk read as Arrow: ``offset`` (int64), ``timestamp`` (the chunk's, ms, UTC) and
    ``body`` (``binary_view``)."""
    pa, _ = arrow()
    return pa.schema([pa.field("offset", pa.int64(), nullable=False),
                      pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
                      pa.field("body", pa.binary_view(), nullable=False)])


#: the fields of an AMQP 1.0 message's properties section, in order
PROPERTY_NAMES = ("message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
                  "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
                  "reply_to_group_id")


@functools.cache
def decoded_schema() -> Any:
    """The columns of a chunk decoded as AMQP 1.0 messages: :func:`schema` 's, then ``properties`` (a struct of
    :data:`PROPERTY_NAMES`: text, ``user_id`` bytes, the two times ms UTC, ``group_sequence`` int64) and
    ``application_properties`` (a map of text to text)."""
    pa, _ = arrow()
    types = {name: pa.string() for name in PROPERTY_NAMES}
    types.update(user_id=pa.binary(), group_sequence=pa.int64(), absolute_expiry_time=pa.timestamp("ms", tz="UTC"),
                 creation_time=pa.timestamp("ms", tz="UTC"))
    return pa.schema([*schema(), pa.field("properties", pa.struct([(name, types[name]) for name in PROPERTY_NAMES])),
                      pa.field("application_properties", pa.map_(pa.string(), pa.string()))])

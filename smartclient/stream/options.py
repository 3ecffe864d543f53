"""What each argument of the Environment's stream calls takes, by name: the table the face and the stream wing
check what they are given by, before anything else (so before any I/O).

An argument means the same in every method that takes it (``stream``, ``partitions``...); a method whose argument
differs has an entry of its own (``"stored_offset.name"``: a name is needed there).  The kinds of value are
:mod:`smartclient.core.validation`'s.  A producer's and a consumer's options are not here: each is a value that
checks itself (:class:`~smartclient.options.ProducerOptions`, :class:`~smartclient.options.ConsumerOptions`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from smartclient.core.address import Address
from smartclient.core.batching import BatchingPolicy
from smartclient.core.offsets import OffsetSpec
from smartclient.core.recovery import RecoveryPolicy
from smartclient.core.settings import ConnectionOptions, PoolLimits, Telemetry
from smartclient.core.stream_arguments import StreamArguments, validate_stream_name
from smartclient.core.topology import PlacementPolicy, Role
from smartclient.core.validation import Check, choice, flag, function, text, texts, whole
from smartclient.options import CLIENT_OPTIONS, entry_points, settings

__all__ = ["ENVIRONMENT_OPTIONS"]


def _stream(name: str, value: Any) -> None:
    validate_stream_name(value, name)


def _optional_stream(name: str, value: Any) -> None:
    if value is not None:
        validate_stream_name(value, name)


def _offset(name: str, value: Any) -> None:
    OffsetSpec.parse(value)


def _arguments(name: str, value: Any) -> None:
    StreamArguments.coerce(value)


ENVIRONMENT_OPTIONS: dict[str, Check | None] = {
    **CLIENT_OPTIONS,
    # Environment(...)
    "__init__.entry_points": partial(entry_points, optional=False),
    "placement": settings(PlacementPolicy, optional=False),
    "pool": settings(PoolLimits, optional=False),
    "connection": settings(ConnectionOptions, optional=False),
    "telemetry": settings(Telemetry, optional=False),
    "__init__.batching": settings(BatchingPolicy, optional=False),
    "recovery": settings(RecoveryPolicy, optional=False),
    # streams, producers and consumers
    "stream": _stream,
    "invalidate.stream": _optional_stream,
    "consumer.super_stream": _optional_stream,
    "super_stream": _stream,
    "role": settings(Role, optional=False),
    "stored_offset.name": text,
    "key": partial(function, takes="message -> routing key"),
    "routing": partial(choice, choices=("hash", "key")),
    "routing_key": partial(text, empty=True),
    "arguments": _arguments,
    "exists_ok": flag,
    "missing_ok": flag,
    "partitions": partial(whole, low=1, optional=True),
    "binding_keys": partial(texts, optional=True),
    "invalidate.node": settings(Address),
    "stream_stats.node": settings(Address),
    # Arrow reads: their arguments are checked by the range reader itself (smartclient.stream.columnar), before
    # any I/O; "start" is not the client's flag there
    "read_arrow.start": None,
    "iter_arrow.start": None,
}

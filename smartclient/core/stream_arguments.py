"""``StreamArguments``: a stream's declaration arguments, validated before anything reaches the broker.

The broker silently ignores arguments it does not know (``x-max-length``, which streams do not have,
or ``x-initial-cluster-size`` sent as is over the stream protocol, whose keys have no ``x-`` prefix).
So smartclient refuses unknown keys and out-of-range values client-side.  It accepts each known
argument under its field name, its stream-protocol key or its ``x-`` key, and renders the right keys
for each protocol: ``{"x-initial-cluster-size": 2}`` does create a stream of two members.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from smartclient._errors import ConfigurationError
from smartclient.core.validation import choice, instance, text, whole

__all__ = ["LEADER_LOCATORS", "StreamArguments", "parse_duration", "validate_stream_name"]

MAX_SEGMENT_SIZE = 3_000_000_000  # 3 GB, the broker's ceiling
LEADER_LOCATORS = ("client-local", "balanced", "least-leaders")
_DURATION = re.compile(r"^(\d+)([YMDhms])$")
_UNIT_SECONDS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}
#: StreamArguments field -> stream-protocol key (the AMQP 0.9.1 key is "x-" + this)
_KEYS = {
    "max_length_bytes": "max-length-bytes",
    "max_age": "max-age",
    "max_segment_size_bytes": "stream-max-segment-size-bytes",
    "filter_size_bytes": "stream-filter-size-bytes",
    "initial_cluster_size": "initial-cluster-size",
    "leader_locator": "queue-leader-locator",
}


def parse_duration(text: str, what: str = "duration") -> int:
    """``"7D"`` -> seconds.  Units as in ``x-max-age``: Y, M, D, h, m, s (one number, one unit)."""
    if not isinstance(text, str):
        raise ConfigurationError(f"{what} {text!r} must be a string like '7D' or '12h'")
    match = _DURATION.match(text.strip())
    if not match:
        raise ConfigurationError(f"{what} {text!r} is not a number followed by one of Y M D h m s (e.g. '7D', '12h')")
    value, unit = int(match.group(1)), match.group(2)
    if value <= 0:
        raise ConfigurationError(f"{what} {text!r} must be positive")
    return value * _UNIT_SECONDS[unit]


def validate_stream_name(name: str, option: str = "stream") -> str:
    """``name``, if it can name a stream (``option`` is what the caller calls it, for the message).

    :raises ConfigurationError: not a str, empty, or longer than 255 bytes."""
    text(option, name, note="a stream's name")
    if len(name.encode()) > 255:
        raise ConfigurationError(f"stream name {name[:40]!r}... is longer than 255 bytes")
    return name


def _positive_int(name: str, value: Any, low: int = 1, high: int | None = None) -> None:
    whole(f"StreamArguments.{name}", value, low=low, high=high)


@dataclass(frozen=True)
class StreamArguments:
    """Declaration arguments of a stream; every one optional, every one checked on construction.

    :param max_length_bytes: retention by size (bytes).
    :param max_age: retention by age: ``"7D"``, ``"12h"`` (units Y M D h m s).
    :param max_segment_size_bytes: segment file size, at most 3 GB.
    :param filter_size_bytes: Bloom filter size for filtering, 16 to 255.
    :param initial_cluster_size: members at creation (leader included).
    :param leader_locator: ``client-local``, ``balanced`` or ``least-leaders``.
    :raises ConfigurationError: a value out of range, before anything is sent.
    """

    max_length_bytes: int | None = None
    max_age: str | None = None
    max_segment_size_bytes: int | None = None
    filter_size_bytes: int | None = None
    initial_cluster_size: int | None = None
    leader_locator: str | None = None

    def __post_init__(self) -> None:
        if self.max_length_bytes is not None:
            _positive_int("max_length_bytes", self.max_length_bytes)
        if self.max_age is not None:
            parse_duration(self.max_age, "max_age")
        if self.max_segment_size_bytes is not None:
            _positive_int("max_segment_size_bytes", self.max_segment_size_bytes, 1, MAX_SEGMENT_SIZE)
        if self.filter_size_bytes is not None:
            _positive_int("filter_size_bytes", self.filter_size_bytes, 16, 255)
        if self.initial_cluster_size is not None:
            _positive_int("initial_cluster_size", self.initial_cluster_size)
        if self.leader_locator is not None:
            choice("StreamArguments.leader_locator", self.leader_locator, LEADER_LOCATORS)

    @classmethod
    def coerce(cls, value: StreamArguments | Mapping[str, Any] | None) -> StreamArguments:
        """Accept a StreamArguments, or a mapping keyed by field name, stream-protocol key or ``x-`` key.

        :raises ConfigurationError: a key that is none of these (the broker would ignore it), or a value
            out of range.
        """
        if value is None:
            return cls()
        if isinstance(value, StreamArguments):
            return value
        if not isinstance(value, Mapping):
            instance("arguments", value, cls, what="a StreamArguments or a mapping of stream arguments")
        by_key = {k: k for k in _KEYS}
        by_key.update({v: k for k, v in _KEYS.items()})
        by_key.update({f"x-{v}": k for k, v in _KEYS.items()})
        kwargs: dict[str, Any] = {}
        for key, item in value.items():
            field_name = by_key.get(key)
            if field_name is None:
                raise ConfigurationError(
                    f"unknown stream argument {key!r}: the broker would ignore it; use one of {sorted(_KEYS)}"
                )
            kwargs[field_name] = item
        return cls(**kwargs)

    def _items(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    def to_stream_protocol(self) -> dict[str, str]:
        """Keys and values as the stream protocol's Create command takes them (no ``x-`` prefix)."""
        return {_KEYS[name]: str(value) for name, value in self._items()}

    def to_amqp(self) -> dict[str, Any]:
        """``x-`` arguments for an AMQP 0.9.1 ``queue.declare`` with ``x-queue-type: stream``."""
        return {"x-queue-type": "stream", **{f"x-{_KEYS[name]}": value for name, value in self._items()}}

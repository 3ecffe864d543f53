"""``OffsetSpec``: where a consumer starts: first, last, next, an offset, a timestamp or an interval."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from smartclient._errors import ConfigurationError
from smartclient.core.stream_arguments import parse_duration
from smartclient.core.validation import choice, number, refuse, text, whole

__all__ = ["OffsetSpec", "OffsetTracking"]

_KINDS = ("first", "last", "next", "offset", "timestamp", "interval")


@dataclass(frozen=True)
class OffsetSpec:
    """One starting point.  Build it with the class methods, or :meth:`parse` a friendly value:

    ``"first"``, ``"last"``, ``"next"``, an ``int`` offset, a ``datetime`` (aware, or naive UTC) or
    an interval string such as ``"1h"`` (now minus one hour; units Y M D h m s).  An interval is
    resolved to a timestamp when the consumer subscribes, not when the spec is made.
    """

    kind: str
    value: int | str | None = None

    def __post_init__(self) -> None:
        choice("OffsetSpec.kind", self.kind, _KINDS)
        if self.kind in ("first", "last", "next") and self.value is not None:
            refuse("OffsetSpec.value", f"None for {self.kind!r}", self.value)
        if self.kind == "offset":
            whole("OffsetSpec.value", self.value, low=0, note="an absolute offset")
        if self.kind == "timestamp":
            whole("OffsetSpec.value", self.value, low=0, note="a timestamp, in milliseconds")
        if self.kind == "interval":
            text("OffsetSpec.value", self.value, note="an interval, such as '1h'")
            parse_duration(str(self.value), "offset interval")

    @classmethod
    def first(cls) -> OffsetSpec:
        return cls("first")

    @classmethod
    def last(cls) -> OffsetSpec:
        return cls("last")

    @classmethod
    def next(cls) -> OffsetSpec:
        return cls("next")

    @classmethod
    def at(cls, offset: int) -> OffsetSpec:
        return cls("offset", offset)

    @classmethod
    def timestamp(cls, when: dt.datetime) -> OffsetSpec:
        if not isinstance(when, dt.datetime):
            raise ConfigurationError(f"a timestamp offset needs a datetime, not {when!r}")
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        return cls("timestamp", int(when.timestamp() * 1000))

    @classmethod
    def interval(cls, text: str) -> OffsetSpec:
        return cls("interval", text)

    @classmethod
    def parse(cls, value: Any) -> OffsetSpec:
        if isinstance(value, OffsetSpec):
            return value
        if isinstance(value, bool):
            raise ConfigurationError(f"offset {value!r} is a bool, not an offset")
        if isinstance(value, int):
            whole("offset", value, low=0, note="an absolute offset")
            return cls.at(value)
        if isinstance(value, dt.datetime):
            return cls.timestamp(value)
        if isinstance(value, str):
            if value in ("first", "last", "next"):
                return cls(value)
            return cls.interval(value)
        raise ConfigurationError(
            f"offset {value!r} must be 'first', 'last', 'next', an int, a datetime or an interval like '1h'"
        )

    @property
    def start(self) -> int | None:
        """The offset a subscription at this spec starts from, when that is known without asking the broker."""
        return int(self.value or 0) if self.kind == "offset" else 0 if self.kind == "first" else None

    def timestamp_ms(self, now: float | None = None) -> int | None:
        """The timestamp this spec starts from, in ms (for an interval, counted back from ``now``)."""
        if self.kind == "timestamp":
            return int(self.value)  # type: ignore[arg-type]
        if self.kind == "interval":
            current = time.time() if now is None else now
            return int((current - parse_duration(str(self.value))) * 1000)
        return None

    def to_amqp(self) -> Any:
        """The ``x-stream-offset`` consumer argument for AMQP 0.9.1 (timestamps in seconds there)."""
        if self.kind in ("first", "last", "next"):
            return self.kind
        if self.kind == "offset":
            return self.value
        if self.kind == "interval":
            return self.value
        return dt.datetime.fromtimestamp(int(self.value) / 1000, tz=dt.timezone.utc)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind} {self.value}"


@dataclass(frozen=True)
class OffsetTracking:
    """Store a named consumer's offset on the server automatically: after every ``every`` messages,
    and ``interval`` seconds after the last store if more arrived since; and once more on close.

    :param every: messages between stores (None: not by count).
    :param interval: seconds between stores while messages arrive (None: not by time).
    """

    every: int | None = 1000
    interval: float | None = 5.0

    def __post_init__(self) -> None:
        if self.every is None and self.interval is None:
            raise ConfigurationError("OffsetTracking needs every= or interval= (or both)")
        whole("OffsetTracking.every", self.every, low=1, optional=True, note="messages")
        number("OffsetTracking.interval", self.interval, above=0, optional=True, note="seconds")

"""What a consumer hands the application: a message with its :class:`MessageContext`, or a whole :class:`Chunk`.

Pure values, no I/O.  The stream wing's seam builds them from each Deliver frame: a per-message consumer gets
``callback(body, context)`` for each message; a chunk consumer (``on_chunk=``) gets one :class:`Chunk` per
frame, whose bodies are split out of the frame only when asked for, and decoded as AMQP 1.0 messages only
when :meth:`Chunk.messages` is called.  A body is the message as it was sent: a message that is exactly one
AMQP 1.0 data section (what smartclient's producers write by default) is handed over as the bytes inside it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from smartclient._errors import ConfigurationError, MessageDecodeError

__all__ = ["Chunk", "ChunkHandler", "MessageContext"]


class MessageContext(NamedTuple):
    """Where a message handed to a consumer's callback comes from (the fields of rstream's ``MessageContext``)."""

    consumer: Any  #: the rstream consumer that carried it (smartclient's own; use your Consumer handle)
    stream: str
    subscriber_id: int
    subscriber_name: str | None
    offset: int
    timestamp: int  #: the chunk's timestamp, in milliseconds since the epoch


class Chunk:
    """The messages of one chunk of a stream, as a chunk consumer's ``on_chunk`` gets them.

    :attr offsets: the offsets of the messages handed over, in order (a ``range`` unless a filter dropped some;
        a first chunk may begin before the consumer's offset: those messages are not in it).
    :attr bodies: the message bodies (``bytes``), split out of the frame the first time they are asked for: the
        body a producer sent, whether it went as an AMQP 1.0 data section (the default) or raw.
    :attr stored: the messages as stored (an AMQP 1.0 message whole, its data section header included): what
        :meth:`messages` decodes, and what an application that decodes AMQP 1.0 itself reads.
    :attr timestamp: the chunk's timestamp, in milliseconds since the epoch.

    ``len(chunk)`` counts the messages without splitting them; iterating gives ``(offset, body)`` pairs;
    :meth:`to_arrow` gives them as columns, over the frame they came in.
    """

    __slots__ = ("_bodies", "_columns", "_decode", "_split", "_split_stored", "_stored", "offsets", "stream",
                 "timestamp")

    def __init__(self, stream: str, offsets: Sequence[int], timestamp: int,
                 bodies: list[bytes] | Callable[[], list[bytes]], decode: Callable[[bytes], Any],
                 stored: list[bytes] | Callable[[], list[bytes]] | None = None,
                 columns: Callable[[Chunk | None], Any] | None = None) -> None:
        self.stream = stream
        self.offsets = offsets
        self.timestamp = timestamp
        self._bodies = bodies if isinstance(bodies, list) else None
        self._split = None if isinstance(bodies, list) else bodies
        # None and None: the messages as stored are the bodies
        self._stored = stored if isinstance(stored, list) else None
        self._split_stored = None if isinstance(stored, list) else stored
        self._decode = decode
        self._columns = columns

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def bodies(self) -> list[bytes]:
        if self._bodies is None:
            assert self._split is not None
            self._bodies, self._split = self._split(), None
        return self._bodies

    @property
    def stored(self) -> list[bytes]:
        if self._stored is None:
            if self._split_stored is None:
                return self.bodies
            self._stored, self._split_stored = self._split_stored(), None
        return self._stored

    @property
    def first_offset(self) -> int:
        return self.offsets[0]

    @property
    def last_offset(self) -> int:
        return self.offsets[-1]

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return zip(self.offsets, self.bodies, strict=True)

    def messages(self) -> list[Any]:
        """The messages decoded as AMQP 1.0 messages (rstream's ``AMQPMessage``: body, application properties...),
        from the messages as stored (:attr:`stored`).

        :raises MessageDecodeError: a message is not an AMQP 1.0 message (a producer wrote it with
            ``encoding="raw"``); ``offset`` and ``stream`` name it, the decoder's own error is the cause."""
        decode, out = self._decode, []
        try:
            for message in self.stored:
                out.append(decode(message))
        except MessageDecodeError as exc:
            offset = self.offsets[len(out)]
            raise MessageDecodeError(f"offset {offset} of stream {self.stream!r}: {exc}", self.stream,
                                     offset) from exc.__cause__
        return out

    def to_arrow(self, decode: bool = False) -> Any:
        """The messages as a ``pyarrow.RecordBatch``: ``offset`` (int64), ``timestamp`` (the chunk's, ms, UTC) and
        ``body`` (``binary_view``: each value a view into the frame the chunk came in; no body is copied, except
        from a sub-entry batch).  Needs the ``[arrow]`` extra (pyarrow 19+ and numpy).

        ``decode=True``: each message decoded as an AMQP 1.0 message (as :meth:`messages`), and two more columns:
        ``properties`` (a struct of the properties section's fields) and ``application_properties`` (a map of
        text to text); ``body`` is the message's body (copied).

        :raises ConfigurationError: pyarrow or numpy is not installed, or too old; or this chunk was not read
            from a stream (made by hand: it has no frame).
        :raises MessageDecodeError: (``decode``) a message is not an AMQP 1.0 message; it names its offset."""
        if self._columns is None:
            raise ConfigurationError(f"{self!r} was not read from a stream: it has no columns")
        return self._columns(self if decode else None)

    def repeated(self, last: int) -> int:
        """How many of its messages are at or before offset ``last`` (nothing is split to count them)."""
        return bisect_right(self.offsets, last)

    def after(self, offset: int) -> Chunk:
        """The part of this chunk after ``offset`` (this very chunk if none of it is at or before it)."""
        keep = self.repeated(offset)
        if not keep:
            return self
        stored: list[bytes] | Callable[[], list[bytes]] | None = None
        if self._stored is not None or self._split_stored is not None:  # split as late as the rest of it
            stored = self._stored[keep:] if self._stored is not None else (lambda: self.stored[keep:])
        columns = self._columns

        def columns_after(decoded: Chunk | None) -> Any:  # (decoded: the part after, decoded on its own)
            assert columns is not None
            return columns(decoded) if decoded is not None else columns(None).slice(keep)

        return Chunk(self.stream, self.offsets[keep:], self.timestamp, self.bodies[keep:], self._decode, stored,
                     None if columns is None else columns_after)

    def head(self, count: int) -> Chunk:
        """The chunk's first ``count`` messages (this very chunk if that is all of them); split, decoded and
        made columns as late as the rest of it."""
        if count >= len(self):
            return self
        bodies: list[bytes] | Callable[[], list[bytes]] = (
            self._bodies[:count] if self._bodies is not None else (lambda: self.bodies[:count]))
        stored: list[bytes] | Callable[[], list[bytes]] | None = None
        if self._stored is not None or self._split_stored is not None:
            stored = self._stored[:count] if self._stored is not None else (lambda: self.stored[:count])
        columns = self._columns

        def columns_of_head(decoded: Chunk | None) -> Any:  # (decoded: the head, decoded on its own)
            assert columns is not None
            return columns(decoded) if decoded is not None else columns(None).slice(0, count)

        return Chunk(self.stream, self.offsets[:count], self.timestamp, bodies, self._decode, stored,
                     None if columns is None else columns_of_head)

    def __repr__(self) -> str:
        span = f"{self.offsets[0]}..{self.offsets[-1]}" if self.offsets else "empty"
        return f"<Chunk {self.stream!r} offsets {span}, {len(self)} message(s)>"


class ChunkHandler:
    """A chunk consumer's ``on_chunk``, marked so that the delivery loop hands it whole chunks."""

    __slots__ = ("function",)

    def __init__(self, function: Callable[[Chunk], Any]) -> None:
        self.function = function

    def __call__(self, chunk: Chunk) -> Any:
        return self.function(chunk)

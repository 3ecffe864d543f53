"""What a consumer hands the application: a message with its :class:`MessageContext`, or a whole :class:`Chunk`.

Pure values, no I/O.  The stream wing's seam builds them from each Deliver frame: a per-message consumer gets
``callback(body, context)`` for each message; a chunk consumer (``on_chunk=``) gets one :class:`Chunk` per
frame, whose bodies are split out of the frame only when asked for, and decoded as AMQP 1.0 messages only
when :meth:`Chunk.messages` is called.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

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
    :attr bodies: the message bodies (``bytes``), split out of the frame the first time they are asked for.
    :attr timestamp: the chunk's timestamp, in milliseconds since the epoch.

    ``len(chunk)`` counts the messages without splitting them; iterating gives ``(offset, body)`` pairs.
    """

    __slots__ = ("_bodies", "_decode", "_split", "offsets", "stream", "timestamp")

    def __init__(self, stream: str, offsets: Sequence[int], timestamp: int,
                 bodies: list[bytes] | Callable[[], list[bytes]], decode: Callable[[bytes], Any]) -> None:
        self.stream = stream
        self.offsets = offsets
        self.timestamp = timestamp
        self._bodies = bodies if isinstance(bodies, list) else None
        self._split = None if isinstance(bodies, list) else bodies
        self._decode = decode

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def bodies(self) -> list[bytes]:
        if self._bodies is None:
            assert self._split is not None
            self._bodies, self._split = self._split(), None
        return self._bodies

    @property
    def first_offset(self) -> int:
        return self.offsets[0]

    @property
    def last_offset(self) -> int:
        return self.offsets[-1]

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return zip(self.offsets, self.bodies, strict=True)

    def messages(self) -> list[Any]:
        """The bodies decoded as AMQP 1.0 messages (body, application properties...), as rstream decodes them.
        :raises Exception: whatever the decoder raises for a body that is not an AMQP 1.0 message."""
        return [self._decode(body) for body in self.bodies]

    def repeated(self, last: int) -> int:
        """How many of its messages are at or before offset ``last`` (nothing is split to count them)."""
        return bisect_right(self.offsets, last)

    def after(self, offset: int) -> Chunk:
        """The part of this chunk after ``offset`` (this very chunk if none of it is at or before it)."""
        keep = self.repeated(offset)
        if not keep:
            return self
        return Chunk(self.stream, self.offsets[keep:], self.timestamp, self.bodies[keep:], self._decode)

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

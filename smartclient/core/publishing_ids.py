"""``PublishingIds``: the publishing ids of one producer.  Pure: no I/O.

A *named* producer deduplicates: the broker stores a publishing id only if it is above the highest one it
stored for that name on the stream, and confirms (and drops) any other.  So ids must increase: a given id not
above the highest this producer has sent is refused before the broker can confirm-and-drop it.  Ids the
producer assigns itself follow the highest of the stored one and the ones it sent, starting at 1 (the protocol
answers 0 both for "nothing stored" and for a stored 0).  An unnamed producer takes no ids from the caller.

Ids of messages that were not queued (``EnqueueTimeout``) are given back, so that sending them again with the
same ids works.
"""

from __future__ import annotations

from smartclient._errors import ConfigurationError, PublishingIdNotIncreasing

__all__ = ["PublishingIds"]


class PublishingIds:
    def __init__(self, stream: str, name: str | None) -> None:
        self.stream = stream
        self.name = name
        self.stored = 0  # the highest id the broker had stored for the name when the producer started
        self.highest: int | None = None  # the highest id this producer has sent

    def take(self, publishing_id: int | None = None, count: int = 1) -> int:
        """The id of the next message (the first of ``count``): ``publishing_id`` if given and valid.

        :raises ConfigurationError: an id given to an unnamed producer, or not a non-negative int.
        :raises PublishingIdNotIncreasing: a given id not above the highest one sent.
        """
        if publishing_id is None:  # the common case first: the next id after the stored and the sent ones
            highest = self.highest
            first = (highest if highest is not None and highest > self.stored else self.stored) + 1
            self.highest = first + count - 1
            return first
        if self.name is None:
            raise ConfigurationError(
                f"publishing id {publishing_id} given to an unnamed producer on {self.stream!r}: "
                f"deduplication needs a producer name"
            )
        if isinstance(publishing_id, bool) or not isinstance(publishing_id, int) or publishing_id < 0:
            raise ConfigurationError(f"publishing id {publishing_id!r} must be a non-negative int")
        if self.highest is not None and publishing_id <= self.highest:
            raise PublishingIdNotIncreasing(
                f"publishing id {publishing_id} of producer {self.name!r} on {self.stream!r} is not greater "
                f"than {self.highest}, the highest it sent: the broker would confirm it and drop it"
            )
        self.highest = publishing_id + count - 1
        return publishing_id

    def give_back(self, first: int) -> None:
        """Ids from ``first`` on were not queued: the next :meth:`take` may use them again."""
        if self.highest is not None and first <= self.highest:
            self.highest = first - 1 if first - 1 > self.stored or self.name is None else None

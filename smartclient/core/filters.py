"""``StreamFilter``: which messages a consumer wants, by the filter values producers attach.

The broker keeps a Bloom filter per chunk and sends only the chunks that may hold a wanted value;
a chunk can still hold other messages, so the client applies ``post_filter`` to each message too
(without one, whole chunks are delivered).  Needs RabbitMQ 3.13+ (Publish v2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from smartclient.core.validation import flag, function, texts

__all__ = ["StreamFilter"]


@dataclass(frozen=True)
class StreamFilter:
    """:param values: filter values wanted (at least one).
    :param post_filter: client-side check of each message of a delivered chunk (the Bloom filter only
        selects chunks); receives the message as the consumer's callback would.
    :param match_unfiltered: also deliver messages published without a filter value.
    """

    values: Sequence[str]
    post_filter: Callable[[Any], bool] | None = field(default=None, compare=False)
    match_unfiltered: bool = False

    def __post_init__(self) -> None:
        texts("StreamFilter.values", self.values, note="the filter values wanted")
        function("StreamFilter.post_filter", self.post_filter, takes="message -> bool")
        flag("StreamFilter.match_unfiltered", self.match_unfiltered)

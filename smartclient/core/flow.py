"""``ConsumerFlow``: how a consumer grants credit, and so how many chunks can wait in its memory.

A stream consumer receives chunks on credit: the broker sends at most ``initial_credit`` chunks ahead, and
one more each time the client grants one.  Chunks received and not yet processed wait in memory, so the
credit bounds it: at most ``initial_credit`` chunks wait, plus the one being processed.

When the credit goes is the strategy (the Java stream client's flow strategies):

- ``credit_after=0`` (the default, rstream's): a chunk is credited as soon as its processing starts, so the
  next chunk travels while this one is processed;
- ``credit_after=0.5``: once half of the chunk's entries were handed to the callback;
- ``credit_after=1``: once all of them were, so a slow callback holds the broker back by a whole chunk.

Pure: :meth:`ConsumerFlow.credit_at` decides, per chunk, after which entry the credit goes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from smartclient.core.validation import number, whole

__all__ = ["ConsumerFlow"]


@dataclass(frozen=True)
class ConsumerFlow:
    """How a consumer grants credit (see the module).

    :param initial_credit: chunks the broker may send ahead; also the most chunks waiting in memory.
    :param credit_after: share (0 to 1) of a chunk's entries handed to the callback before the next chunk is
        credited; 0 credits it when processing starts.
    """

    initial_credit: int = 10
    credit_after: float = 0.0

    def __post_init__(self) -> None:
        whole("ConsumerFlow.initial_credit", self.initial_credit, low=1, high=1000)
        number("ConsumerFlow.credit_after", self.credit_after, low=0, high=1, note="a share of the chunk")

    def credit_at(self, entries: int) -> int:
        """The number of entries of a chunk of ``entries`` to process before its credit goes (0: at once)."""
        if self.credit_after <= 0 or entries <= 0:
            return 0
        return max(1, math.ceil(entries * self.credit_after))

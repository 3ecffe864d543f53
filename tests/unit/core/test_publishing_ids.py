"""PublishingIds: the core decides every publishing id of a producer. No broker."""

from __future__ import annotations

import pytest

from smartclient import ConfigurationError, PublishingIdNotIncreasing
from smartclient.core.publishing_ids import PublishingIds


def test_assigned_ids_follow_the_stored_one_and_given_ids_must_increase() -> None:
    ids = PublishingIds("s", "p")
    ids.stored = 5
    assert ids.take() == 6 and ids.take(count=3) == 7 and ids.highest == 9
    assert ids.take(20) == 20 and ids.take() == 21
    with pytest.raises(PublishingIdNotIncreasing, match="not greater than 21"):
        ids.take(21)


def test_ids_of_messages_not_queued_can_be_used_again() -> None:
    ids = PublishingIds("s", "p")
    ids.stored = 5
    first = ids.take(count=10)  # 6..15, of which 6..8 were queued (EnqueueTimeout.queued == 3)
    ids.give_back(first + 3)
    assert ids.take(9) == 9  # the same id again: no PublishingIdNotIncreasing
    ids.give_back(9)
    assert ids.take() == 9
    fresh = PublishingIds("s", "p")
    fresh.stored = 5
    fresh.give_back(fresh.take())
    assert fresh.highest is None and fresh.take(6) == 6  # back to nothing sent


def test_an_unnamed_producer_takes_no_ids_and_bad_ids_are_refused() -> None:
    unnamed = PublishingIds("s", None)
    assert unnamed.take() == 1 and unnamed.take() == 2
    with pytest.raises(ConfigurationError, match="unnamed producer"):
        unnamed.take(7)
    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigurationError, match="non-negative int"):
            PublishingIds("s", "p").take(bad)  # type: ignore[arg-type]

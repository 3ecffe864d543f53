"""ConsumerFlow: when a consumer grants credit. No broker."""

from __future__ import annotations

import pytest

from smartclient import ConfigurationError, ConsumerFlow


def test_the_default_credits_a_chunk_when_its_processing_starts() -> None:
    assert ConsumerFlow().credit_at(100) == 0 and ConsumerFlow().initial_credit == 10


def test_a_share_credits_after_that_many_entries_and_never_before_the_first() -> None:
    half = ConsumerFlow(credit_after=0.5)
    assert [half.credit_at(n) for n in (1, 2, 3, 100)] == [1, 1, 2, 50]
    assert ConsumerFlow(credit_after=1.0).credit_at(7) == 7
    assert ConsumerFlow(credit_after=0.01).credit_at(10) == 1
    assert half.credit_at(0) == 0  # an empty chunk: credited at once


@pytest.mark.parametrize("kwargs", [{"initial_credit": 0}, {"initial_credit": True}, {"initial_credit": 1.5},
                                    {"credit_after": -0.1}, {"credit_after": 1.5}])
def test_bad_flows_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match=next(iter(kwargs))):
        ConsumerFlow(**kwargs)  # type: ignore[arg-type]

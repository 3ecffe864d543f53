"""``RetryPolicy``: how hard a placement tries, as one small frozen value.

Unlike the Java client, every loop is capped twice: by attempts and by total
time.  A load balancer that keeps returning the same nodes is detected after
``sticky_window`` consecutive wrong landings that reach no node not seen
before, long before either cap.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from smartclient._errors import ConfigurationError
from smartclient.core.validation import number, whole

__all__ = ["Backoff", "RetryPolicy"]


@dataclass(frozen=True)
class Backoff:
    """The one back-off rule of every retry loop: ``initial * factor ** (n - 1)`` seconds before the
    (n+1)-th try, at most ``max``, spread by up to ``jitter`` (a fraction) either way so that many clients
    that failed together do not come back in lock step."""

    initial: float = 0.05
    factor: float = 2.0
    max: float = 1.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.initial < 0 or self.max < self.initial or self.factor < 1 or not 0 <= self.jitter < 1:
            raise ConfigurationError(
                f"a back-off needs 0 <= initial <= max, factor >= 1 and 0 <= jitter < 1, not {self!r}")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after ``failures`` failures in a row (none after none)."""
        if failures <= 0:
            return 0.0
        base = min(self.max, self.initial * self.factor ** (failures - 1))
        if not self.jitter:
            return base
        return base * (1 + (rng or random).uniform(-self.jitter, self.jitter))


@dataclass(frozen=True)
class RetryPolicy:
    """Caps and back-off of one placement.

    :param max_attempts: connections opened for one placement, at most.
    :param max_time: seconds one placement may take, at most.
    :param sticky_window: consecutive wrong landings, with no new node among them, after which the
        load balancer is taken to be sticky (``NodeUnreachable``).  With a random LB and one acceptable
        node out of three, 20 misses in a row happen with probability (2/3)**20, about 3 in 10,000.
    :param backoff_initial: first delay after a failed connection, in seconds (wrong landings do not wait:
        a round-robin LB gives the next node to the very next connection).
    :param backoff_max: longest delay.
    :param hedge_after: a stream connection still opening after this many seconds gets a second one dialled
        beside it, and the first to open wins (0: never).  A load balancer holds a connection it sent to a
        node that has just died while it retries that node (HAProxy: 3 s); the second goes to another node.
    """

    max_attempts: int = 40
    max_time: float = 15.0
    sticky_window: int = 20
    backoff_initial: float = 0.05
    backoff_max: float = 1.0
    backoff_factor: float = 2.0
    hedge_after: float = 1.0

    def __post_init__(self) -> None:
        whole("RetryPolicy.max_attempts", self.max_attempts, low=1)
        number("RetryPolicy.max_time", self.max_time, above=0, note="seconds")
        whole("RetryPolicy.sticky_window", self.sticky_window, low=2)
        number("RetryPolicy.backoff_initial", self.backoff_initial, low=0, note="seconds")
        number("RetryPolicy.backoff_max", self.backoff_max, low=0, note="seconds")
        number("RetryPolicy.backoff_factor", self.backoff_factor, low=1)
        number("RetryPolicy.hedge_after", self.hedge_after, low=0, note="seconds; 0: never")
        if self.backoff_max < self.backoff_initial:
            raise ConfigurationError(
                "RetryPolicy back-off needs 0 <= backoff_initial <= backoff_max and backoff_factor >= 1"
            )

    @property
    def backoff_rule(self) -> Backoff:
        return Backoff(self.backoff_initial, self.backoff_factor, self.backoff_max)

    def backoff(self, consecutive_failures: int) -> float:
        """Delay before the next attempt after ``consecutive_failures`` failed connections in a row."""
        return self.backoff_rule.delay(consecutive_failures)

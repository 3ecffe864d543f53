"""``RetryPolicy``: how hard a placement tries, as one small frozen value; and ``Backoff``, the one rule of
every wait in the library (retry loops and polls alike).

Unlike the Java client, every loop is capped twice: by attempts and by total time.  A load balancer that
keeps returning the same nodes is detected after ``sticky_window`` consecutive wrong landings that reach no
node not seen before, long before either cap.

Every wait is a :class:`Backoff`: a retry loop's grows (``factor`` above 1, often with ``jitter``), a poll's
is steady (:meth:`Backoff.steady`).  Each is a named constant beside the loop that waits on it, with its
reason, or a value here when more than one wing uses it (:data:`WATCH_POLL`).  The shells only sleep what
the rule says (``time.sleep`` in the sync ones, ``await asyncio.sleep`` in the async ones), never a number
of their own.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, replace

from smartclient._errors import ConfigurationError
from smartclient.core.validation import backoff, number, whole

__all__ = ["HANG_MEMORY", "HEDGES", "QUICK_HEDGE", "WATCH_POLL", "Backoff", "RetryPolicy"]


#: seconds after a dial to an address went unanswered for ``hedge_after`` during which the dials to that address
#: are hedged after ``hedge_after * QUICK_HEDGE`` instead (see :meth:`RetryPolicy.hedge_wait`)
HANG_MEMORY = 5.0
QUICK_HEDGE = 0.2
#: dials beside a first one still opening: the first after ``hedge_after``, then one more after each quick wait
#: (``hedge_after * QUICK_HEDGE``) while none has opened.  Through a round-robin LB that still sends a third of its
#: connections to a node that has just died (and holds each for seconds, until its checks mark the node down: about
#: 2 s), one hedge also went there in about one dial in nine, and every recovering handle of that process waited for
#: it.  With three, about one in 81: a fleet of 20 makes about a hundred such dials in those seconds, and a round of
#: four still had one process wait 3.8 s for its locator (the first dial and its three hedges all held).  With
#: seven, one in 6,561, for at most 1.1 s of dials a tenth of a second apart (issue 57)
HEDGES = 7

@dataclass(frozen=True)
class Backoff:
    """The one back-off rule of every retry loop and poll: ``initial * factor ** (n - 1)`` seconds before the
    (n+1)-th try, at most ``max``, spread by up to ``jitter`` (a fraction) either way so that many clients
    that failed together do not come back in lock step."""

    initial: float = 0.05
    factor: float = 2.0
    max: float = 1.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        for name, value in (("initial", self.initial), ("factor", self.factor), ("max", self.max),
                            ("jitter", self.jitter)):
            number(f"Backoff.{name}", value)
        if self.initial < 0 or self.max < self.initial or self.factor < 1 or not 0 <= self.jitter < 1:
            raise ConfigurationError(
                f"a back-off needs 0 <= initial <= max, factor >= 1 and 0 <= jitter < 1, not {self!r}")

    @classmethod
    def steady(cls, seconds: float) -> Backoff:
        """A poll at one pace: ``seconds`` before every look again."""
        return cls(seconds, 1.0, seconds)

    def scaled(self, by: float) -> Backoff:
        """This rule in units of ``by`` seconds (for a rule written in periods of a setting)."""
        number("Backoff.scaled(by)", by, low=0)
        return replace(self, initial=self.initial * by, max=self.max * by)

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after ``failures`` failures in a row (none after none)."""
        if failures <= 0:
            return 0.0
        try:
            base = min(self.max, self.initial * self.factor ** (failures - 1))
        except OverflowError:  # a loop that ran long: the power passed the largest float long after max
            base = self.max if self.initial else 0.0
        if not self.jitter:
            return base
        return base * (1 + (rng or random).uniform(-self.jitter, self.jitter))

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The waits of a loop, one per ``next()``: after one failure (or look), two, and so on, endlessly."""
        failures = 0
        while True:
            failures += 1
            yield self.delay(failures, rng)


WATCH_POLL = Backoff.steady(0.25)
"""In periods: a watch that acts after a period of quiet (a producer's confirms, a consumer's deliveries, a
time-based offset store) looks four times per period, so it acts at most a quarter of a period late, for
four cheap looks at counters it keeps anyway.  ``WATCH_POLL.scaled(period)`` is the wait in seconds."""


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
    :param backoff_factor: each delay is this times the previous one, up to ``backoff_max``.
    :param backoff_jitter: each delay is spread by up to this fraction either way (0: none; 0.5, the default), so
        that many clients whose connections failed together do not dial again in lock step: 20 processes that
        lost a node at once sent half the Metadata requests in their peak second with 0.5 than with 0
        (``bench/scale.py --fleet``, issue 57).
    :param hedge_after: a stream connection still opening after this many seconds gets a second one dialled
        beside it, and the first to open wins (0: never); another after each further fifth of it while none has
        opened, up to :data:`HEDGES` (7).  A load balancer holds a connection it sent to a
        node that has just died while it retries that node (HAProxy: 3 s), and one it sent to a node that is
        stopping gracefully opens only when that node closes it (seconds); the second goes to another node.
    """

    max_attempts: int = 40
    max_time: float = 15.0
    sticky_window: int = 20
    backoff_initial: float = 0.05
    backoff_max: float = 1.0
    backoff_factor: float = 2.0
    hedge_after: float = 0.5
    backoff_jitter: float = 0.5

    def __post_init__(self) -> None:
        whole("RetryPolicy.max_attempts", self.max_attempts, low=1)
        number("RetryPolicy.max_time", self.max_time, above=0, note="seconds")
        whole("RetryPolicy.sticky_window", self.sticky_window, low=2)
        backoff("RetryPolicy", ("backoff_initial", self.backoff_initial), ("backoff_factor", self.backoff_factor),
                ("backoff_max", self.backoff_max), ("backoff_jitter", self.backoff_jitter))
        number("RetryPolicy.hedge_after", self.hedge_after, low=0, note="seconds; 0: never")
        if self.backoff_max < self.backoff_initial:
            raise ConfigurationError(
                "RetryPolicy back-off needs 0 <= backoff_initial <= backoff_max and backoff_factor >= 1"
            )

    @property
    def backoff_rule(self) -> Backoff:
        """The policy's back-off as the one rule, jitter and all."""
        return Backoff(self.backoff_initial, self.backoff_factor, self.backoff_max, self.backoff_jitter)

    def hedge_wait(self, since_hang: float) -> float:
        """Seconds a dial waits before a second one goes beside it (0: never), ``since_hang`` seconds after a
        dial to the same address last went unanswered for ``hedge_after``, or a connection through it was lost
        (its node may be gone, and an LB still sends it connections): within :data:`HANG_MEMORY`, a fifth
        of it (:data:`QUICK_HEDGE`; 0.1 s by default: a dial slower than that, over TLS or across sites, opens a
        second connection meanwhile, and whichever opens first is taken).  Behind an LB, a node stopping
        gracefully takes every few connections and answers none for seconds; in a rolling restart's soak, a
        placement that needed three dials to reach its node spent two ``hedge_after`` waits on it (1.4 s)."""
        return self.hedge_after * QUICK_HEDGE if since_hang < HANG_MEMORY else self.hedge_after

    def backoff(self, consecutive_failures: int, rng: random.Random | None = None) -> float:
        """Delay before the next attempt after ``consecutive_failures`` failed connections in a row."""
        return self.backoff_rule.delay(consecutive_failures, rng)

"""How producers, consumers and clients come back after a connection loss or a leader move: the one recovery plan.

Pure: :class:`RecoveryPolicy` is a frozen value and :meth:`RecoveryPolicy.next_delay` a function of the attempt
number and the time spent; :class:`Recovery` is one recovery's steps over it (attempt now, wait and attempt, or
stop: the failure names why), unit-tested without a broker.  Every wing drives it: the stream handles
(``_Handle._recover`` in :mod:`smartclient.stream.handles`, async) and the AMQP 1.0 publishers and consumers
(``Amqp10Placer.recover``, sync); and each recovery ends in a :class:`RecoveryEvent`, which the Environment hands to
its recovery hooks (``env.on_recovery``) and to its telemetry.

Every recovery is bounded twice, by attempts and by time; when either runs out, a producer fails its
pending messages with the reason and a consumer reports it (nothing loops forever).  Authentication
failures end a recovery at once by default: the same credentials will not start working in a tight
loop.  With ``retry_authentication=True`` they are retried, but only every ``max_delay`` seconds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smartclient._errors import REFUSALS, RecoveryFailed, StreamNotFound
from smartclient.core.retry import Backoff
from smartclient.core.validation import backoff, flag, number, whole

__all__ = ["AttemptNow", "Recovery", "RecoveryEvent", "RecoveryPolicy", "Stop"]


@dataclass(frozen=True)
class RecoveryPolicy:
    """Back-off of one producer's or consumer's recovery.

    :param enabled: recover at all (off: a lost producer fails its pending messages at once).
    :param initial_delay: seconds before the second attempt (the first is immediate).
    :param factor: each delay is this times the previous one ...
    :param max_delay: ... up to this many seconds.
    :param jitter: each delay is spread by up to this fraction either way, so that many clients that lost
        the same node do not come back in lock step.
    :param max_attempts: give up after this many attempts.
    :param max_time: give up after this many seconds.
    :param attempt_time: seconds one attempt may spend placing its connection (the
        :class:`RetryPolicy` ``max_time`` during a recovery), so a stale leader is looked up again soon.
    :param retry_authentication: keep trying (every ``max_delay``) when the broker refuses the credentials.
    :param stall_check: seconds a producer waits with messages pending and no confirm before it checks that its
        node still leads the stream (a leader change the broker did not report); a named producer still on the
        leader at the third check declares its publisher again; a consumer handed nothing for this long while its
        stream has committed more subscribes again (:mod:`smartclient.stream.unreported`).  0, or recovery off,
        turns both off.
    """

    enabled: bool = True
    initial_delay: float = 0.1
    factor: float = 1.6
    max_delay: float = 5.0
    jitter: float = 0.2
    max_attempts: int = 200
    max_time: float = 300.0
    attempt_time: float = 3.0
    retry_authentication: bool = False
    stall_check: float = 5.0

    def __post_init__(self) -> None:
        flag("RecoveryPolicy.enabled", self.enabled)
        backoff("RecoveryPolicy", ("initial_delay", self.initial_delay), ("factor", self.factor),
                ("max_delay", self.max_delay), ("jitter", self.jitter))
        whole("RecoveryPolicy.max_attempts", self.max_attempts, low=1)
        number("RecoveryPolicy.max_time", self.max_time, above=0, note="seconds")
        number("RecoveryPolicy.attempt_time", self.attempt_time, above=0, note="seconds")
        flag("RecoveryPolicy.retry_authentication", self.retry_authentication)
        number("RecoveryPolicy.stall_check", self.stall_check, low=0, high=3600, note="seconds; 0: off")

    def next_delay(self, attempts: int, elapsed: float, *, authentication: bool = False, progressed: bool = False,
                   rng: random.Random | None = None) -> float | None:
        """Seconds to wait after ``attempts`` failed attempts and ``elapsed`` seconds, or None: give up.

        ``progressed``: the last attempt ran out of time after its topology read had named a leader (it was
        waiting for a member still joining, or for the broker to answer a subscribe or a declare).  The stream is
        back, and the reads that attempt started go on without it: the next attempt goes at once (a back-off
        there only added to the client's own share of the recovery; each attempt is bounded, so this is no tight
        loop)."""
        if not self.enabled or attempts >= self.max_attempts or elapsed >= self.max_time:
            return None
        if authentication and not self.retry_authentication:
            return None
        if progressed:
            return 0.0
        rule = self.backoff_rule
        if authentication:  # the same credentials will not start working in a tight loop: the longest delay
            rule = Backoff(self.max_delay, 1.0, self.max_delay, self.jitter)
        return max(0.0, min(rule.delay(max(attempts, 1), rng), self.max_time - elapsed))

    @property
    def backoff_rule(self) -> Backoff:
        return Backoff(self.initial_delay, self.factor, self.max_delay, self.jitter)


@dataclass(frozen=True)
class AttemptNow:
    """Attempt the recovery, after ``delay`` seconds."""

    delay: float = 0.0


@dataclass(frozen=True)
class Stop:
    """The recovery is over and failed: ``failure`` (a :class:`RecoveryFailed`, naming why; the last attempt's error
    its ``cause``) is the handle's."""

    failure: RecoveryFailed


class Recovery:
    """One recovery's steps over a :class:`RecoveryPolicy` (no I/O; a driver attempts and sleeps)::

        recovery = Recovery(policy)
        step = recovery.start()
        while isinstance(step, AttemptNow):
            sleep(step.delay)
            try:
                reattach()
            except Exception as exc:
                step = recovery.failed(exc, progressed=...)
            else:
                break                      # recovered: recovery.attempts, recovery.seconds
        else:
            handle.failure = step.failure  # it gave up, or a refusal ended it at once

    A refusal (:data:`~smartclient._errors.REFUSALS`: refused credentials, a token expired or refused, a token
    provider failing, a certificate rejected) ends it at once unless the policy retries authentication; a stream
    that no longer exists ends it too.  ``prior``: recoveries just before this one that did not help (the back-off
    goes on from there instead of starting again at once)."""

    def __init__(self, policy: RecoveryPolicy, *, prior: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy, self.prior, self._clock = policy, prior, clock
        self.began = clock()
        self.attempts = 0  #: attempts made
        self.last: BaseException | None = None  #: the last attempt's error

    @property
    def seconds(self) -> float:
        """Seconds since the recovery began."""
        return self._clock() - self.began

    def start(self, reason: str = "") -> AttemptNow | Stop:
        """The first step: attempt at once (after ``prior`` failed recoveries, on the back-off), or stop when the
        policy turns recovery off."""
        if not self.policy.enabled:
            return Stop(RecoveryFailed(f"lost ({reason}) and recovery is disabled" if reason else
                                       "recovery is disabled"))
        self.attempts = 1
        if self.prior:
            delay = self.policy.next_delay(self.prior, 0.0)
            if delay is None:
                return Stop(RecoveryFailed(f"recovery gave up after {self.prior} attempt(s)"))
            return AttemptNow(delay)
        return AttemptNow()

    def failed(self, error: BaseException, *, progressed: bool = False) -> AttemptNow | Stop:
        """The attempt under way failed with ``error``; ``progressed``: it ran out of time past its topology read
        (the stream is back: the next goes at once).  The next step: attempt again after the policy's delay, or
        stop, the failure naming why."""
        self.last = error
        elapsed = self.seconds
        if isinstance(error, StreamNotFound):
            return Stop(RecoveryFailed(str(error), error))
        refused = isinstance(error, REFUSALS)
        delay = self.policy.next_delay(self.attempts + self.prior, elapsed, authentication=refused,
                                       progressed=progressed)
        if delay is None:
            why = ("ended at once, refused (RecoveryPolicy.retry_authentication retries a refusal)" if refused
                   else "gave up")
            return Stop(RecoveryFailed(f"recovery {why} after {self.attempts} attempt(s) in {elapsed:.1f} s: "
                                       f"{type(error).__name__}: {error}", error))
        self.attempts += 1
        return AttemptNow(delay)


@dataclass(frozen=True)
class RecoveryEvent:
    """What the Environment's recovery hooks are told of each recovery that ended (``env.on_recovery``), from every
    wing: the ``handle`` (a producer, a consumer, an AMQP 1.0 publisher or consumer, an MQTT client), its ``wing``
    (``stream``, ``amqp10``, ``mqtt``), the node it was on ``before`` and is on ``after`` (None: it did not come
    back, or the wing cannot say), the ``cause`` (what was lost: a reason or the error), the ``seconds`` it took, its
    ``attempts``, and its ``failure`` if it gave up."""

    handle: Any
    wing: str
    before: Any
    after: Any
    cause: str
    seconds: float
    attempts: int
    failure: BaseException | None = None

    @property
    def recovered(self) -> bool:
        return self.failure is None

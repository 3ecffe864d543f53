"""The one recovery plan (issue 54): the pure steps every wing drives over a RecoveryPolicy.  No broker."""

from __future__ import annotations

import pytest

from smartclient import (
    AuthenticationFailed,
    CertificateRejected,
    ConnectionFailed,
    RecoveryFailed,
    RecoveryPolicy,
    StepTimeout,
    StreamNotFound,
    TokenExpired,
    TokenProviderFailed,
)
from smartclient.core.recovery import AttemptNow, Recovery, RecoveryEvent, Stop

QUICK = RecoveryPolicy(initial_delay=0.1, factor=2.0, max_delay=0.4, jitter=0.0, max_attempts=4, max_time=60.0)


def test_a_recovery_attempts_at_once_then_on_the_policys_back_off_then_stops_naming_why() -> None:
    now = [0.0]
    recovery = Recovery(QUICK, clock=lambda: now[0])
    assert recovery.start("Connection Closed") == AttemptNow(0.0)
    delays = []
    step: AttemptNow | Stop = AttemptNow()
    while isinstance(step, AttemptNow):
        now[0] += 1.0
        step = recovery.failed(ConnectionFailed("reset"))
        if isinstance(step, AttemptNow):
            delays.append(step.delay)
    assert delays == [0.1, 0.2, 0.4] and recovery.attempts == 4
    assert isinstance(step.failure, RecoveryFailed) and isinstance(step.failure.cause, ConnectionFailed)
    assert str(step.failure).startswith("recovery gave up after 4 attempt(s) in 4.0 s: ConnectionFailed: reset")


@pytest.mark.parametrize("refusal", [AuthenticationFailed("no"), TokenExpired("late"), CertificateRejected("ca"),
                                     TokenProviderFailed("idp down")])
def test_a_refusal_stops_it_at_once_unless_the_policy_retries_authentication(refusal: Exception) -> None:
    step = Recovery(QUICK).failed(refusal)
    assert isinstance(step, Stop) and step.failure.cause is refusal and "refused" in str(step.failure)
    patient = RecoveryPolicy(retry_authentication=True, max_delay=0.4, jitter=0.0)
    assert Recovery(patient).failed(refusal) == AttemptNow(0.4)  # the longest delay, never a tight loop


def test_a_stream_deleted_stops_it_and_an_attempt_that_got_past_its_topology_read_is_followed_at_once() -> None:
    deleted = StreamNotFound("reading the topology of 's': the stream does not exist")
    step = Recovery(QUICK).failed(deleted)
    assert isinstance(step, Stop) and step.failure.cause is deleted
    assert Recovery(QUICK).failed(StepTimeout("subscribe"), progressed=True) == AttemptNow(0.0)


def test_recovery_off_stops_before_any_attempt_and_prior_failures_go_on_with_the_back_off() -> None:
    step = Recovery(RecoveryPolicy(enabled=False)).start("Connection Closed")
    assert isinstance(step, Stop) and "recovery is disabled" in str(step.failure)
    assert Recovery(QUICK, prior=2).start() == AttemptNow(0.2)


def test_the_event_says_whether_it_recovered() -> None:
    assert RecoveryEvent("h", "stream", "n1", "n2", "Connection Closed", 0.3, 1).recovered
    assert not RecoveryEvent("h", "mqtt", "n1", None, "lost", 9.0, 5, RecoveryFailed("gave up")).recovered

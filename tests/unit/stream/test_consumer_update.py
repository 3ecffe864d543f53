"""A consumer's subscription and a single active consumer's activation, asked again where that can help.

A single active consumer's activation (the broker's ConsumerUpdate) is answered off the connection's reader.

The answer needs the stored offset, read on another connection.  rstream awaits it inside the reader, which then
reads nothing else from that connection: in the 2-hour soak a locator cut by a rolling restart kept every consumer
on one node silent (and timed their subscriptions out) while one activation waited (issue 32)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from rstream import schema

from smartclient import AuthenticationFailed, ConnectionFailed, RecoveryPolicy, StreamNotReady
from smartclient.core.deadline import attempt
from smartclient.stream._rstream.wire import NamedClient, forget_handlers
from smartclient.stream.consumer import Consumer, again_soon


def client() -> NamedClient:
    return NamedClient(host="127.0.0.1", port=1, frame_max=1 << 20, heartbeat=60)


def consumer_update(subscription_id: int, correlation_id: int) -> SimpleNamespace:
    return SimpleNamespace(subscription_id=subscription_id, correlation_id=correlation_id, active=1)


def test_an_activation_is_answered_aside_in_order_and_only_by_its_own_subscription() -> None:
    async def scenario() -> list[str]:
        conn = client()
        events: list[str] = []
        release = asyncio.Event()

        async def answer(update: SimpleNamespace) -> None:  # rstream's handler, reading the stored offset
            events.append(f"asked {update.correlation_id}")
            if update.correlation_id == 1:
                await release.wait()
            events.append(f"answered {update.correlation_id}")

        conn.add_handler(schema.ConsumerUpdateResponse, answer, name="7")
        handler = conn._handlers[schema.ConsumerUpdateResponse]["7"]
        assert handler(consumer_update(7, 1)) is None  # the reader goes on at once
        assert handler(consumer_update(8, 9)) is None  # another subscription's: not this handler's business
        assert handler(consumer_update(7, 2)) is None
        await asyncio.sleep(0.05)
        events.append("reader free")
        release.set()
        await asyncio.wait_for(asyncio.gather(*conn.smartclient_updates["7"]), 5)
        assert not conn.smartclient_updates  # each leaves once answered
        return events

    assert asyncio.run(scenario()) == ["asked 1", "reader free", "answered 1", "asked 2", "answered 2"]


def test_answers_of_different_subscriptions_never_wait_for_each_other() -> None:
    async def scenario() -> list[str]:
        conn = client()
        events: list[str] = []
        release = asyncio.Event()

        async def slow(update: SimpleNamespace) -> None:
            await release.wait()
            events.append("7 answered")

        async def quick(update: SimpleNamespace) -> None:
            events.append("8 answered")

        conn.add_handler(schema.ConsumerUpdateResponse, slow, name="7")
        conn.add_handler(schema.ConsumerUpdateResponse, quick, name="8")
        conn._handlers[schema.ConsumerUpdateResponse]["7"](consumer_update(7, 1))
        conn._handlers[schema.ConsumerUpdateResponse]["8"](consumer_update(8, 2))
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.wait_for(asyncio.gather(*[t for ts in conn.smartclient_updates.values() for t in ts]), 5)
        return events

    assert asyncio.run(scenario()) == ["8 answered", "7 answered"]


def test_a_failed_answer_is_logged_not_raised_and_a_removed_subscription_or_a_closed_connection_drops_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> tuple[list[str], list[bool], list[bool]]:
        conn = client()
        events: list[str] = []

        async def fails(update: SimpleNamespace) -> None:
            events.append("failed")
            raise ConnectionFailed("the stored offset could not be read")

        async def waits(update: SimpleNamespace) -> None:
            await asyncio.Event().wait()

        conn.add_handler(schema.ConsumerUpdateResponse, fails, name="1")
        conn.add_handler(schema.ConsumerUpdateResponse, waits, name="2")
        conn.add_handler(schema.ConsumerUpdateResponse, waits, name="3")
        for sid in (1, 2, 3):
            conn._handlers[schema.ConsumerUpdateResponse][str(sid)](consumer_update(sid, sid))
        await asyncio.sleep(0.05)
        second, third = list(conn.smartclient_updates["2"]), list(conn.smartclient_updates["3"])
        forget_handlers(conn, 2)  # subscription 2 is removed: its answer would act on its consumer's next one
        await asyncio.sleep(0)
        removed = [t.cancelled() for t in second + third]
        assert str(2) not in conn._handlers[schema.ConsumerUpdateResponse]
        await conn.close()  # never started: rstream's close is a no-op; the answers still waiting are dropped
        await asyncio.sleep(0)
        return events, removed, [t.cancelled() for t in third]

    with caplog.at_level(logging.INFO, logger="smartclient.stream._rstream.wire"):
        events, removed, closed = asyncio.run(scenario())
    assert events == ["failed"] and removed == [True, False] and closed == [True]
    assert any("subscription 1: its activation was not answered: ConnectionFailed" in r.getMessage()
               for r in caplog.records if r.levelno == logging.INFO)


def test_other_frames_keep_rstreams_handler() -> None:
    conn = client()

    def on_deliver(frame: object) -> None:
        return None

    conn.add_handler(schema.Deliver, on_deliver, name="3")
    assert conn._handlers[schema.Deliver]["3"] is on_deliver


# -- the consumer's side: the stored offset read again within one attempt, never for a refusal ------------------
class _Activating:
    """What Consumer._activated uses of a consumer: the read of its resume point, its host's policy, a repr."""

    def __init__(self, reads: list[Any], attempt_time: float = 1.0) -> None:
        self._reads, self.calls = reads, 0
        self._host = SimpleNamespace(recovery=RecoveryPolicy(attempt_time=attempt_time))

    async def _resume_point(self) -> Any:
        self.calls += 1
        outcome = self._reads[min(self.calls, len(self._reads)) - 1]
        if outcome == "hang":
            await asyncio.Event().wait()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def __repr__(self) -> str:
        return "Consumer(stream='s', name='group')"


def activate(fake: _Activating) -> Any:
    return asyncio.run(Consumer._activated(fake))  # type: ignore[arg-type]


def test_an_activation_reads_the_stored_offset_again_after_a_connection_failure() -> None:
    fake = _Activating([ConnectionFailed("closed before answering"), ConnectionFailed("again"), "spec"])
    assert activate(fake) == "spec" and fake.calls == 3


def test_an_activation_gives_up_within_one_attempt_even_if_a_read_never_answers() -> None:
    fake = _Activating([ConnectionFailed("closed before answering"), "hang"], attempt_time=0.5)
    with pytest.raises(ConnectionFailed, match="no answer within"):
        activate(fake)
    assert fake.calls == 2


def test_an_activation_never_asks_again_after_a_refusal() -> None:
    fake = _Activating([AuthenticationFailed("refused"), "spec"])
    with pytest.raises(AuthenticationFailed):
        activate(fake)
    assert fake.calls == 1


# -- a first subscription: asked again soon for a member not ready or a connection closed under it -------------
def subscribe_with(outcomes: list[BaseException | None], seconds: float = 2.0) -> int:
    calls = 0

    async def subscribing() -> None:
        nonlocal calls
        calls += 1
        outcome = outcomes[min(calls, len(outcomes)) - 1]
        if outcome is not None:
            raise outcome

    async def main() -> None:
        with attempt(seconds, "placing the consumer"):
            await again_soon(subscribing, "Consumer(stream='s')")

    asyncio.run(main())
    return calls


def closed_under_it() -> ConnectionFailed:
    error = ConnectionFailed("subscribing to 's': ConnectionResetError: localhost:1 closed the connection")
    error.__cause__ = ConnectionResetError("localhost:1 closed the connection before answering")
    return error


def test_a_first_subscription_is_asked_again_after_its_connection_closed_under_it_or_the_member_was_not_ready() -> None:
    assert subscribe_with([closed_under_it(), StreamNotReady("no leader yet"), None]) == 3


def test_a_first_subscription_is_not_asked_again_after_any_other_connection_failure() -> None:
    with pytest.raises(ConnectionFailed, match="did not answer"):
        subscribe_with([ConnectionFailed("subscribing to 's': the broker did not answer in time"), None])
    with pytest.raises(AuthenticationFailed):
        subscribe_with([AuthenticationFailed("refused"), None])


def test_a_first_subscription_asks_again_only_within_the_attempt() -> None:
    with pytest.raises(ConnectionFailed, match="closed the connection"):
        subscribe_with([closed_under_it()], seconds=0.3)

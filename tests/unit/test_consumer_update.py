"""A single active consumer's activation (the broker's ConsumerUpdate) is answered off the connection's reader.

The answer needs the stored offset, read on another connection.  rstream awaits it inside the reader, which then
reads nothing else from that connection: in the 2-hour soak a locator cut by a rolling restart kept every consumer
on one node silent (and timed their subscriptions out) while one activation waited (issue 32)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from rstream import schema

from smartclient.stream._rstream.wire import NamedClient


def client() -> NamedClient:
    return NamedClient(host="127.0.0.1", port=1, frame_max=1 << 20, heartbeat=60)


def frame(subscription_id: int, correlation_id: int) -> SimpleNamespace:
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
        assert handler(frame(7, 1)) is None  # the reader goes on at once
        assert handler(frame(8, 9)) is None  # another subscription's: not this handler's business
        assert handler(frame(7, 2)) is None
        await asyncio.sleep(0.05)
        events.append("reader free")
        release.set()
        await asyncio.wait_for(asyncio.gather(*conn.smartclient_updates), 5)
        assert not conn.smartclient_updates  # each leaves once answered
        return events

    assert asyncio.run(scenario()) == ["asked 1", "reader free", "answered 1", "asked 2", "answered 2"]


def test_a_failed_answer_is_logged_not_raised_and_a_closed_connection_drops_the_pending_ones() -> None:
    async def scenario() -> tuple[list[str], bool]:
        conn = client()
        events: list[str] = []

        async def fails(update: SimpleNamespace) -> None:
            events.append("failed")
            raise RuntimeError("the stored offset could not be read")

        async def waits(update: SimpleNamespace) -> None:
            await asyncio.Event().wait()

        conn.add_handler(schema.ConsumerUpdateResponse, fails, name="1")
        conn.add_handler(schema.ConsumerUpdateResponse, waits, name="2")
        conn._handlers[schema.ConsumerUpdateResponse]["1"](frame(1, 1))
        await asyncio.sleep(0.05)
        conn._handlers[schema.ConsumerUpdateResponse]["2"](frame(2, 2))
        await asyncio.sleep(0.05)
        pending = set(conn.smartclient_updates)
        await conn.close()  # never started: rstream's close is a no-op, the answers still waiting are dropped
        await asyncio.sleep(0)
        return events, all(task.cancelled() for task in pending) and len(pending) == 1

    events, dropped = asyncio.run(scenario())
    assert events == ["failed"] and dropped


def test_other_frames_keep_rstreams_handler() -> None:
    conn = client()

    def on_deliver(frame: object) -> None:
        return None

    conn.add_handler(schema.Deliver, on_deliver, name="3")
    assert conn._handlers[schema.Deliver]["3"] is on_deliver

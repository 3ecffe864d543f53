"""A subscription's chunks on their way to its callback (smartclient/stream/_rstream/deliveries.py): handed over
in order by a task that lives only while some wait; stopped as rstream's queue and task were.  No broker."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from smartclient.stream._rstream.deliveries import Chunks
from smartclient.stream._rstream.wire import NamedClient


def _client() -> Any:
    client = NamedClient(host="127.0.0.1", port=1, frame_max=1 << 20, heartbeat=60)
    client._is_not_closed = True  # (what an open connection says; no socket here)
    client._conn = object()
    return client


async def _handed(client: Any, sid: int = 7) -> None:
    deadline = asyncio.get_running_loop().time() + 5
    while client._frames[sid].task is not None or not client._frames[sid].empty():
        assert asyncio.get_running_loop().time() < deadline, "still handing over"
        await asyncio.sleep(0.001)


async def test_frames_before_the_handler_wait_for_it_and_go_in_order_by_a_task_that_ends_when_none_waits() -> None:
    client, got = _client(), []
    await client._frames[7].put("a")  # (what rstream's reader does with a Deliver)
    await client._frames[7].put("b")
    assert isinstance(client._frames[7], Chunks) and client._frames[7].qsize() == 2 and not client._tasks

    async def handler(frame: str) -> None:
        await asyncio.sleep(0)
        got.append(frame)

    await client.run_queue_listener_task(subscriber_id=7, handler=handler)
    assert "run_delivery_handlers_7" in client._tasks  # one task, under rstream's name
    await client._frames[7].put("c")
    await _handed(client)
    assert got == ["a", "b", "c"] and not client._tasks  # in order, and no task once none waits
    await client._frames[7].put("d")
    await _handed(client)
    assert got == ["a", "b", "c", "d"] and not client._tasks


async def test_a_handler_that_raises_is_logged_as_rstream_did_and_the_next_frame_goes(
        caplog: pytest.LogCaptureFixture) -> None:
    client, got = _client(), []

    def handler(frame: str) -> None:
        if frame == "bad":
            raise ValueError("the handler's bug")
        got.append(frame)

    await client.run_queue_listener_task(subscriber_id=7, handler=handler)
    with caplog.at_level(logging.ERROR, logger="rstream.client"):
        for frame in ("bad", "good"):
            await client._frames[7].put(frame)
        await _handed(client)
    assert got == ["good"] and "the handler's bug" in caplog.text


async def test_a_stopped_delivery_drops_what_waits_and_hands_nothing_later_and_a_dead_connection_hands_nothing(
        ) -> None:
    client, got = _client(), []
    release = asyncio.Event()

    async def handler(frame: str) -> None:
        await release.wait()
        got.append(frame)

    await client.run_queue_listener_task(subscriber_id=7, handler=handler)
    for frame in ("a", "b"):
        await client._frames[7].put(frame)
    await asyncio.sleep(0.01)  # "a" is in the handler ("b" waits)
    await client.stop_queue_listener_task(7)  # ("a" is cancelled: only a chunk of _on_deliver is waited for)
    await client._frames[7].put("late")
    release.set()
    await asyncio.sleep(0.01)
    assert got == [] and client._frames[7].qsize() == 1 and not client._tasks  # "b" dropped, "late" not handed
    # a connection that is gone: nothing is handed over
    other, seen = _client(), []
    await other.run_queue_listener_task(subscriber_id=3, handler=seen.append)
    other._is_not_closed = False
    await other._frames[3].put("x")
    await asyncio.sleep(0.01)
    assert seen == [] and not other._tasks


class Frame:
    def __init__(self, sid: int, n: int) -> None:
        self.subscription_id, self.n = sid, n


async def test_only_its_own_frames_wait_and_its_handler_runs_in_the_subscribers_context() -> None:
    import contextvars

    who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="reader")
    client, got = _client(), []
    who.set("subscriber")
    await client.run_queue_listener_task(subscriber_id=7, handler=lambda f: got.append((f.n, who.get())))
    who.set("reader")  # (rstream's reader puts each Deliver frame in every subscription's table)
    for frame in (Frame(7, 1), Frame(8, 2), Frame(7, 3)):
        client._frames[7].put_nowait(frame)
    assert client._frames[7].qsize() == 2  # another subscription's frame is not its own
    await _handed(client)
    assert got == [(1, "subscriber"), (3, "subscriber")]


async def test_a_delivery_task_cancelled_before_its_first_step_does_not_hold_the_next_frames() -> None:
    client, got = _client(), []
    await client.run_queue_listener_task(subscriber_id=7, handler=got.append)
    client._frames[7].put_nowait("a")
    client._frames[7].task.cancel()  # before it ever ran (its finally never runs)
    await asyncio.sleep(0)
    client._frames[7].put_nowait("b")
    await _handed(client)
    assert got == ["a", "b"]


def test_a_client_with_subscriptions_is_freed_at_once_not_by_a_full_collection() -> None:
    """Its table refers to it weakly: a client its own table held was left in a cycle with its socket and TLS
    buffers until a full collection (issue 32's test_tls found it)."""
    import gc
    import weakref

    async def scenario() -> weakref.ref[Any]:
        client = _client()
        await client.run_queue_listener_task(subscriber_id=7, handler=lambda f: None)
        client._frames[8].put_nowait("waits")
        return weakref.ref(client)

    gc.disable()
    try:
        gone = asyncio.run(scenario())
        assert gone() is None
    finally:
        gc.enable()

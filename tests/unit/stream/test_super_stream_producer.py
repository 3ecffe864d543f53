"""SuperStreamProducer's routing of each publishing call, with fake partition producers (no broker): a message
that key routing sends to several partitions is confirmed when every copy is, and a closed producer refuses."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from smartclient import ProducerOptions
from smartclient import ConfigurationError, Confirmation, HandleClosed, PublishFailed
from smartclient.stream.super_stream import SuperStreamProducer

ROUTES = {"a": ["ss-a"], "b": ["ss-b"], "both": ["ss-a", "ss-b"]}


class FakeEnv:
    async def route(self, super_stream: str, key: str) -> list[str]:
        return ROUTES.get(key, [])


class FakeProducer:
    """Confirms every message at once, except ``b"bad"`` on partition ss-b."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.sent: list[tuple[Any, int | None]] = []
        self.next_id = 0
        self.closed = False

    def _fate(self, body: Any) -> asyncio.Future[Confirmation]:
        self.next_id += 1
        future: asyncio.Future[Confirmation] = asyncio.get_running_loop().create_future()
        if body == b"bad" and self.stream == "ss-b":
            future.set_exception(PublishFailed(f"refused on {self.stream}"))
        else:
            future.set_result(Confirmation(self.next_id, True))
        return future

    async def submit(self, body: Any, *, publishing_id: int | None = None) -> asyncio.Future[Confirmation]:
        self.sent.append((body, publishing_id))
        return self._fate(body)

    async def send(self, body: Any, *, publishing_id: int | None = None, on_confirm: Any = None) -> None:
        future = await self.submit(body, publishing_id=publishing_id)
        if on_confirm is not None:
            on_confirm(future.result())

    async def send_many(self, bodies: Sequence[Any], *, first_publishing_id: int | None = None) -> None:
        for body in bodies:
            await self.submit(body)

    async def send_wait(self, body: Any, *, publishing_id: int | None = None) -> Confirmation:
        return await (await self.submit(body, publishing_id=publishing_id))

    async def send_batch(self, bodies: Sequence[Any]) -> list[Confirmation]:
        return list(await asyncio.gather(*[await self.submit(body) for body in bodies]))

    async def flush(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


def producer(routing: str = "key") -> tuple[SuperStreamProducer, dict[str, FakeProducer]]:
    handle = SuperStreamProducer(FakeEnv(), "ss", ["ss-a", "ss-b"], routing, None,  # type: ignore[arg-type]
                                 ProducerOptions())
    fakes = {p: FakeProducer(p) for p in handle.partitions}
    handle.producers = fakes  # type: ignore[assignment]
    return handle, fakes


async def test_a_message_sent_to_several_partitions_is_confirmed_when_every_copy_is() -> None:
    handle, fakes = producer()
    future = await handle.submit(b"x", key="both")
    assert (await future).confirmed and [b for b, _ in fakes["ss-a"].sent] == [b"x"] == [
        b for b, _ in fakes["ss-b"].sent]
    failing = await handle.submit(b"bad", key="both")  # confirmed on ss-a, refused on ss-b
    with pytest.raises(PublishFailed, match="ss-b"):
        await failing
    with pytest.raises(PublishFailed, match="ss-b"):
        await handle.send_wait(b"bad", key="both")
    assert await handle.send_wait(b"bad", key="a") == ["ss-a"]
    fates: list[Confirmation] = []
    assert await handle.send(b"y", key="both", on_confirm=fates.append) == ["ss-a", "ss-b"]
    assert len(fates) == 2  # once per copy


async def test_send_batch_returns_one_confirmation_per_message_in_order() -> None:
    handle, fakes = producer()
    bodies = [b"1", b"2", b"3", b"4"]
    keys = iter(["a", "both", "b", "a"])
    handle.key = lambda body: next(keys)
    confirmations = await handle.send_batch(bodies)
    # ss-a gets 1, 2, 4 (ids 1 2 3), ss-b gets 2, 3 (ids 1 2); message 2's is its first copy's, on ss-a
    assert [c.publishing_id for c in confirmations] == [1, 2, 2, 3]
    assert [b for b, _ in fakes["ss-a"].sent] == [b"1", b"2", b"4"] and [b for b, _ in fakes["ss-b"].sent] == [
        b"2", b"3"]
    with pytest.raises(ConfigurationError, match="empty batch"):
        await handle.send_batch([])


async def test_send_many_keeps_the_order_and_gives_message_i_the_id_first_plus_i() -> None:
    handle, fakes = producer()
    await handle.send_many([b"1", b"2", b"3"], key="both", first_publishing_id=10)
    assert fakes["ss-a"].sent == [(b"1", 10), (b"2", 11), (b"3", 12)] == fakes["ss-b"].sent
    await handle.send_many([b"4", b"5"], key="b")
    assert [b for b, _ in fakes["ss-b"].sent[3:]] == [b"4", b"5"] and len(fakes["ss-a"].sent) == 3


async def test_no_key_is_a_configuration_error_and_close_refuses_every_later_call() -> None:
    handle, fakes = producer("hash")
    with pytest.raises(ConfigurationError, match="no routing key"):
        await handle.submit(b"x")
    await handle.close()
    assert all(f.closed for f in fakes.values())
    for call in (handle.route(b"x", "a"), handle.send(b"x", key="a"), handle.send_many([b"x"], key="a"),
                 handle.submit(b"x", key="a"), handle.send_wait(b"x", key="a"), handle.send_batch([b"x"], key="a"),
                 handle.flush()):
        with pytest.raises(HandleClosed, match=r"SuperStreamProducer.*is closed"):
            await call
    await handle.close()  # idempotent

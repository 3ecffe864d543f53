"""A single active consumer's activation, when the stored-offset read it needs is cut or slow (issue 32).

The broker hands a single active consumer nothing until it answers its activation (ConsumerUpdate), and the
answer needs the stored offset, read on the Environment's locator connection then (on its second metadata
connection, ``-aside``, now: QueryOffset waits for the writer).  The 2-hour soak found both ways
this went wrong in a rolling restart: the locator died under the read (the answer never went out, and the group
was silent until the delivery watch subscribed it again, 14 times in 2 hours), and the read waited inside
rstream's reader of the consumer's own connection (every other consumer on that node silent meanwhile, their
subscriptions timed out).  The delivery watch is off here (``stall_check=0``): only the fix can deliver."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from smartclient import Environment, OffsetSpec, OffsetTracking, RecoveryPolicy, StreamArguments
from smartclient.stream import _rstream
from smartclient.stream._rstream import wire
from smartclient.testing import TestBed

from ..conftest import wait_until
from .conftest import direct_env, publish


@pytest.fixture
async def sac_env(rabbitmq_testbed: TestBed) -> AsyncIterator[Environment]:
    """An Environment on the first node whose delivery watch is off (only the fix can deliver) and whose
    recovery attempts are short."""
    async with direct_env(rabbitmq_testbed,
                          recovery=RecoveryPolicy(stall_check=0, attempt_time=1.5)) as environment:
        yield environment


async def _stored(env: Environment, stream: str, bodies: list[bytes]) -> None:
    """``bodies`` published, consumed by a single active consumer 'group' and its last offset stored."""
    await publish(env, stream, bodies)
    got: list[bytes] = []
    first = await env.consumer(stream, lambda m, c: got.append(bytes(m)), offset="first", name="group",
                               single_active=True, tracking=OffsetTracking(every=1000, interval=None))
    await wait_until(lambda: len(got) == len(bodies), 10, f"{len(bodies)} messages on the first instance")
    await first.store_offset()
    await first.close()

    async def stored() -> bool:  # a store has no answer: it lands a moment later
        return await env.stored_offset(stream, "group") == len(bodies) - 1

    await wait_until(stored, 10, "the stored offset")


async def _reads_fail_then(env: Environment, stream: str, monkeypatch: pytest.MonkeyPatch,
                           fails: Any, ready: Any, what: str) -> Any:
    """A group with an offset stored at 9, then a new instance whose stored-offset reads go through ``fails(client)``
    (which may raise, as a dying locator does); once ``ready(consumer)``, 5 more messages must reach it, and only
    those.  Returns the consumer (closed)."""
    await env.create_stream(stream)
    try:
        await _stored(env, stream, [b"m%d" % i for i in range(10)])
        real = _rstream.query_offset

        async def query(client: Any, stream_: str, name: str) -> Any:
            fails(client)
            return await real(client, stream_, name)

        monkeypatch.setattr(_rstream, "query_offset", query)
        got: list[bytes] = []
        second = await env.consumer(stream, lambda m, c: got.append(bytes(m)), offset="first", name="group",
                                    single_active=True)
        await wait_until(lambda: ready(second), 15, what)
        await publish(env, stream, [b"n%d" % i for i in range(5)])
        await wait_until(lambda: len(got) == 5, 10, "the 5 messages after the stored offset")
        assert got == [b"n%d" % i for i in range(5)]  # right after the stored offset: no repeat, no gap
        await second.close()
        return second
    finally:
        await env.delete_stream(stream, missing_ok=True)


def _closed_before_answering(client: Any) -> ConnectionResetError:
    return ConnectionResetError(f"{client.host}:{client.port} closed the connection before answering")


async def test_an_activation_whose_locator_dies_under_the_read_reads_again_and_resumes_after_the_stored_offset(
    sac_env: Environment, rabbitmq_unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut: list[str] = []

    def locator_dies(client: Any) -> None:
        if not cut:  # the first read: its connection goes, as a rolling restart took it in the soak
            cut.append(f"{client.host}:{client.port}")
            wire.drop_socket(client)
            raise _closed_before_answering(client)

    second = await _reads_fail_then(sac_env, rabbitmq_unique_name, monkeypatch, locator_dies,
                                    lambda c: c.active is True, "the activation to be answered")
    assert cut, "the injected cut never happened: the test proved nothing"
    assert second.recoveries == 0  # read again within the activation, not rescued by a recovery


async def test_an_activation_that_cannot_read_the_stored_offset_recovers_the_consumer(
    sac_env: Environment, rabbitmq_unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed: list[float] = []

    def unreadable(client: Any) -> None:  # for 2.5 s from the first read: longer than one attempt (1.5 s)
        if not failed or time.monotonic() < failed[0] + 2.5:
            failed.append(time.monotonic())
            raise _closed_before_answering(client)

    second = await _reads_fail_then(sac_env, rabbitmq_unique_name, monkeypatch, unreadable,
                                    lambda c: c.recoveries >= 1 and c.active is True,
                                    "a recovery and an answered activation")
    assert second.recoveries >= 1 and len(failed) > 1  # read again before giving up, then recovered


async def test_a_slow_activation_does_not_hold_the_other_consumers_of_its_connection(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = rabbitmq_testbed.nodes[0]
    # attempts long enough that the held read is not given up while the neighbour is looked at
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port),
                           recovery=RecoveryPolicy(stall_check=0, attempt_time=30)) as env:
        await _slow_activation(env, rabbitmq_unique_name, monkeypatch)


async def _slow_activation(env: Environment, rabbitmq_unique_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = rabbitmq_unique_name
    await env.create_stream(stream, StreamArguments(initial_cluster_size=2))  # one replica: both consumers on it
    try:
        await _stored(env, stream, [b"m%d" % i for i in range(10)])
        plain: list[int] = []
        # single active consumers share connections only with one another: the neighbour is one, of its own group
        # (from the first message: a single active consumer's "next" is where it stands when its answer arrives)
        before: list[int] = []
        neighbour = await env.consumer(
            stream, lambda m, c: (plain if bytes(m)[:1] == b"n" else before).append(c.offset), offset="first",
            name="neighbour", single_active=True)
        # its activation answered (the stored offset read before the slow one below) and delivering
        await wait_until(lambda: len(before) == 10, 10, "the neighbour's first 10 messages")
        real = _rstream.query_offset
        held, release = asyncio.Event(), asyncio.Event()

        reads: list[float] = []

        async def slow(client: Any, stream_: str, name: str) -> Any:
            reads.append(time.monotonic())
            held.set()
            await release.wait()  # a connection that does not answer (yet)
            return await real(client, stream_, name)

        monkeypatch.setattr(_rstream, "query_offset", slow)
        got: list[int] = []
        second = await env.consumer(stream, lambda m, c: got.append(c.offset), offset="first", name="group",
                                    single_active=True)
        await asyncio.wait_for(held.wait(), 10)
        assert neighbour._subscriber.client is second._subscriber.client, "both must share a connection to test this"
        await publish(env, stream, [b"n%d" % i for i in range(5)])
        await wait_until(lambda: len(plain) == 5, 10, "the neighbour's 5 messages while the activation waits")
        assert got == [] and len(reads) == 1 and second.recoveries == 0  # the group itself still waits for its answer
        release.set()
        await wait_until(lambda: len(got) == 5, 10, "the group's 5 messages once answered")
        assert len(got) == 5 and min(got) > 9  # after the stored offset (the store's own chunk takes one offset)
        await second.close()
        await neighbour.close()
    finally:
        await env.delete_stream(stream, missing_ok=True)


async def test_an_on_update_handler_that_raises_makes_the_consumer_subscribe_again_not_fall_silent(
    sac_env: Environment, rabbitmq_unique_name: str
) -> None:
    stream = rabbitmq_unique_name
    await sac_env.create_stream(stream)
    try:
        await publish(sac_env, stream, [b"m%d" % i for i in range(3)])
        asked: list[bool] = []

        def flaky(is_active: bool, consumer: Any) -> OffsetSpec:
            asked.append(is_active)
            if len(asked) == 1:
                raise RuntimeError("the application's handler failed once")
            return OffsetSpec.first()

        got: list[bytes] = []
        consumer = await sac_env.consumer(stream, lambda m, c: got.append(bytes(m)), offset="next", name="handler",
                                      single_active=True, on_update=flaky)
        await wait_until(lambda: len(got) == 3, 15, lambda: f"the 3 messages after a second activation ({asked})")
        assert asked[:2] == [True, True] and consumer.recoveries >= 1
        assert got == [b"m%d" % i for i in range(3)]
        await consumer.close()
    finally:
        await sac_env.delete_stream(stream, missing_ok=True)

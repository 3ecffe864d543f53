"""Where a recovering consumer goes: the first candidate whose member can be read (Carriers.ready_member, with the
core's ready_choice deciding).  Each member's read is a fake here: it answers when the test lets it.  No broker."""

from __future__ import annotations

import asyncio
import time

import pytest

from smartclient import Address, ConnectionFailed
from smartclient.core.topology import StreamTopology
from smartclient.stream import carriers as carriers_module
from smartclient.stream.carriers import READY_GRACE, Carriers, _keep_fresh

L, R1, R2 = Address("n1", 5552), Address("n2", 5552), Address("n3", 5552)
CANDIDATES = StreamTopology("s", L, (R1, R2)).consumer_candidates()  # {R1, R2} > {L}


class Members:
    """The members' reads: each answers once its gate opens, ready or with its error."""

    def __init__(self) -> None:
        self.gates = {node: asyncio.Event() for node in (L, R1, R2)}
        self.errors: dict[Address, Exception] = {}
        self.asked: list[Address] = []

    def carriers(self) -> Carriers:
        carriers = Carriers.__new__(Carriers)
        carriers._probes, carriers._ready_at, carriers._fell_back, carriers._chosen = {}, {}, {}, {}

        async def probe(stream: str, node: Address) -> None:
            self.asked.append(node)
            await self.gates[node].wait()
            if node in self.errors:
                raise self.errors[node]
            _keep_fresh(carriers._ready_at, (stream, node))

        carriers._probe = probe  # type: ignore[method-assign]
        return carriers

    def answer(self, *nodes: Address) -> None:
        for node in nodes:
            self.gates[node].set()


async def test_a_first_choice_that_answers_is_taken_and_the_leader_is_not_asked() -> None:
    members = Members()
    carriers = members.carriers()
    members.answer(R2)
    assert await carriers.ready_member("s", CANDIDATES) == R2
    assert sorted(members.asked) == [R1, R2]  # the first tier only
    members.answer(R1, L)


async def test_after_the_grace_the_leader_is_asked_and_taken_then_at_once_for_a_moment() -> None:
    members = Members()
    carriers = members.carriers()
    members.answer(L)
    began = time.monotonic()
    assert await carriers.ready_member("s", CANDIDATES) == L
    assert time.monotonic() - began >= READY_GRACE
    began = time.monotonic()
    assert await carriers.ready_member("s", CANDIDATES) == L  # the grace was waited once: the next take the fallback
    assert time.monotonic() - began < READY_GRACE
    members.answer(R1, R2)
    await asyncio.sleep(0)
    assert await carriers.ready_member("s", CANDIDATES) in (R1, R2)  # a first choice that can be read wins again


async def test_a_first_tier_that_fails_at_once_sends_it_to_the_next_tiers_at_once() -> None:
    members = Members()
    carriers = members.carriers()
    members.errors = {R1: ConnectionFailed("R1 down"), R2: ConnectionFailed("R2 down")}
    members.answer(R1, R2, L)
    began = time.monotonic()
    assert await carriers.ready_member("s", CANDIDATES) == L
    assert time.monotonic() - began < READY_GRACE


async def test_no_member_that_can_be_read_is_an_error_naming_each() -> None:
    members = Members()
    carriers = members.carriers()
    members.errors = {node: ConnectionFailed(f"{node.host} down") for node in (L, R1, R2)}
    members.answer(L, R1, R2)
    with pytest.raises(ConnectionFailed, match="no member of 's' could be read") as caught:
        await carriers.ready_member("s", CANDIDATES)
    assert all(f"{n.host} down" in str(caught.value) for n in (L, R1, R2))


async def test_a_member_read_ready_is_forgotten_once_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(carriers_module, "READY_FRESH", 0.05)
    members = Members()
    carriers = members.carriers()
    members.answer(R1)
    assert await carriers.ready_member("s", CANDIDATES) == R1
    assert carriers._ready_at
    await asyncio.sleep(0.1)
    assert carriers._ready_at == {} and carriers._fell_back == {}  # (no later use needed: they leave on time)
    members.answer(R2, L)


async def test_member_ready_takes_the_choice_but_the_next_choices_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(carriers_module, "READY_FRESH", 1.0)  # (wide: a loaded machine wakes late)
    members = Members()
    carriers = members.carriers()
    members.answer(R1)
    await asyncio.sleep(0)
    carriers._member_probe("s", R1)  # read ready a while before a consumer asks
    await asyncio.sleep(0.6)  # (the choice then outlasts the read by 0.6 s: CI's loaded loop woke 0.05 s too late)
    assert await carriers.ready_member("s", CANDIDATES) == R1
    deadline = time.monotonic() + 5
    while carriers._fresh("s", R1) and time.monotonic() < deadline:  # until the read is no longer fresh
        await asyncio.sleep(0.05)
    assert not carriers._fresh("s", R1)
    await carriers.member_ready("s", R1)  # after the placement's dial: the choice stands, R1 is not asked again
    assert members.asked.count(R1) == 1
    assert await carriers.ready_member("s", CANDIDATES) == R1  # a next choice reads it again: a choice is no read
    assert members.asked.count(R1) == 2
    members.answer(R2, L)

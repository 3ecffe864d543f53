"""When a stream can take a write again after a fault: the moment from which whatever a client still waits is its own.

Metadata naming a leader is not enough (a newly named leader cannot confirm until a replica has joined it), so the
probe is a raw producer: after the fault it asks a node that is up for the stream's leader, connects to the leader
and publishes a message every 0.1 s until one is confirmed; a try that fails (no leader yet, a node going) is made
again after :data:`PROBE_INTERVAL` s, each bounded to :data:`TRY_BOUND` s.  The confirm's arrival is recorded per
stream as a ``writable`` history record (see :mod:`smartclient.testing.checker`), with the fault's ``t``.

Each probe message is stored in the stream like any other: its body is ``probe:<id>`` and it is recorded as a
``send`` and a ``confirm`` of the client ``probe`` (one id sequence over every stream), so the checker accounts
for it and never counts it as a client's progress.

A quorum queue's probe (:func:`queues_writable`, after a silent drop) is an AMQP 1.0 publisher through the load
balancer, as the queue clients go, on a fresh connection per try, skipping the node the fault takes away until it
is healed; the broker's settlement is the queue taking a write again.  Its message (``probe:<id>``, never recorded
as a send: no stream reads it back) goes to the queue's consumers, which skip it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["PROBE", "PROBE_INTERVAL", "is_probe", "queues_writable", "writable_back"]

PROBE = "probe"  # the client name of the probe's messages
PROBE_INTERVAL = 0.05  # seconds between two tries on one stream
TRY_BOUND = 5.0  # seconds one try (leader, connect, then a message every 0.1 s until one is confirmed) may take
LANDINGS = 9  # dials through a namespaced bed's round-robin LB to land on one node (of 3) before a try fails
GIVE_UP = 120.0  # seconds after which a stream that never took a write is reported missing
QUEUE_EVERY = 0.25  # seconds between two writes of a queue's probe once one settled
QUEUE_HEDGES = 3  # a queue's tries in flight at most: a new one each QUEUE_HEDGE_AFTER s while none settles
QUEUE_HEDGE_AFTER = 0.25
SETTLE = 15.0  # seconds after the heal a queue's probe goes on (the clients' recoveries after it)

_IDS = itertools.count(1)
_TURNS = itertools.count()


async def writable_back(bed: Any, streams: list[str], fault_t: float, history: Any, victim: str = "",
                        healed: asyncio.Event | None = None) -> None:
    """Probe every stream of ``streams`` at once until each takes a write; record one ``writable`` record:
    ``fault_t``, ``target``, ``streams`` (stream -> ``t``), ``missing``.  ``victim``: a node the fault takes away,
    never asked, nor written to as the leader until ``healed`` is set (back, it may lead again; meanwhile a write
    to it would only say it has not gone yet)."""
    deadline = time.monotonic() + GIVE_UP
    gone = (lambda: healed is None or not healed.is_set()) if victim else (lambda: False)
    back = await asyncio.gather(*(_first_confirm(bed, s, victim, gone, history, deadline) for s in streams))
    when = {s: t for s, t in zip(streams, back, strict=True) if t is not None}
    history.add("writable", fault_t=fault_t, target=victim, streams=when, missing=len(streams) - len(when))


async def _first_confirm(bed: Any, stream: str, victim: str, gone: Callable[[], bool], history: Any,
                         deadline: float) -> float | None:
    while time.monotonic() < deadline:
        try:
            return await asyncio.wait_for(_try_write(bed, stream, victim if gone() else "", history), TRY_BOUND)
        except Exception:  # no leader yet, the leader not confirming yet, a node going: try again
            await asyncio.sleep(PROBE_INTERVAL)
    return None


async def _try_write(bed: Any, stream: str, victim: str, history: Any) -> float:
    from smartclient.stream import _rstream
    from smartclient.testing.streams import raw_stream_client

    up = [n for n in bed.nodes if n.name != victim]  # (a node back from a fault answers Metadata too)
    asked = up[next(_TURNS) % len(up)]  # in turn: another fault may have taken one of them away
    async with raw_stream_client(bed, asked.host, asked.stream_port, name="soak-probe") as client:
        leader, _ = await client.query_leader_and_replicas(stream)
    node = bed.node_by_advertised(leader.host, leader.port)
    if node.name == victim:
        raise LookupError(f"{stream}'s leader is still said to be on {victim}")

    def next_id() -> int:
        ident = next(_IDS)
        history.add("send", client=PROBE, id=ident)
        return ident

    async with _reach(bed, node) as client:
        ident = await _rstream.write_until_confirmed(client, stream, next_id, lambda i: f"{PROBE}:{i}".encode(),
                                                     PROBE_INTERVAL * 2)
        confirmed: float = history.add("confirm", client=PROBE, id=ident)
        return confirmed


@contextlib.asynccontextmanager
async def _reach(bed: Any, node: Any) -> AsyncIterator[Any]:
    """A raw client on ``node``: dialled directly, or on a namespaced bed (whose clients reach the nodes only through
    the load balancer) through the round-robin LB until it lands there, so that the probe finds a node writable when
    the LB routes to it again, as the clients do.  :raises LookupError: it never landed there."""
    from smartclient.stream._rstream import identity
    from smartclient.testing.streams import raw_stream_client

    if not node.management_host:  # a loopback bed's node: dialled as it is
        async with raw_stream_client(bed, node.host, node.stream_port, name="soak-probe") as client:
            yield client
        return
    host, port = bed.lb("stream")
    for _ in range(LANDINGS):
        async with raw_stream_client(bed, host, port, name="soak-probe") as client:
            landed = identity(client)[0]
            if landed is not None and (landed.host, landed.port) == node.advertised:
                yield client
                return
    raise LookupError(f"the load balancer never routed to {node.name} in {LANDINGS} dials")


def is_probe(body: bytes) -> bool:
    """Whether a message's ``body`` is a probe's (a queue's consumer skips it)."""
    return body.startswith(b"probe:")


async def queues_writable(bed: Any, queues: list[str], fault_t: float, history: Any, victim: str = "",
                          healed: asyncio.Event | None = None) -> None:
    """Probe every queue of ``queues`` (quorum queues) at once, a fresh connection every :data:`QUEUE_EVERY` s,
    from the fault until :data:`SETTLE` s after ``healed`` is set (without one: until the first write): each write
    settled is a ``queue_back`` record (``queue``, ``back``), from which the checker times a queue client's share
    from when a fresh client could write after it found its connection dead; then one ``writable`` record of the
    first, as :func:`writable_back` makes.  Without the ``[amqp10]`` extra, none (the queue clients' share is then
    timed from the heal, as for a client no probe follows)."""
    import importlib.util

    if not queues or importlib.util.find_spec("rabbitmq_amqp_python_client") is None:
        return
    deadline = time.monotonic() + GIVE_UP
    ends: list[float] = []  # when probing ends: SETTLE s after the heal

    def gone() -> bool:  # the victim still away
        return bool(victim) and (healed is None or not healed.is_set())

    def over() -> bool:
        if healed is not None and healed.is_set() and not ends:
            ends.append(time.monotonic() + SETTLE)
        return time.monotonic() >= (ends[0] if ends else deadline)

    pool = ThreadPoolExecutor(len(queues) * QUEUE_HEDGES, thread_name_prefix="queue-probe")
    loop = asyncio.get_running_loop()

    async def probed(queue: str) -> float | None:
        tries: set[asyncio.Future[float]] = set()
        try:
            return await probing(queue, tries)
        finally:  # what a try still in flight settles (within TRY_BOUND s) is not recorded, nor how it fails
            for left in tries:
                left.cancel()

    async def probing(queue: str, tries: set[asyncio.Future[float]]) -> float | None:
        first: float | None = None
        started = 0.0  # when the newest try in flight began
        while not over():
            if not tries or (len(tries) < QUEUE_HEDGES and time.monotonic() - started >= QUEUE_HEDGE_AFTER):
                # another try beside those in flight: one that landed on a silent node holds for TRY_BOUND s
                tries.add(loop.run_in_executor(pool, _settled, bed, queue, victim if gone() else "", history))
                started = time.monotonic()
            done, _ = await asyncio.wait(tries, timeout=QUEUE_HEDGE_AFTER, return_when=asyncio.FIRST_COMPLETED)
            tries.difference_update(done)
            backs = [t.result() for t in done if t.exception() is None]
            if not backs:  # no leader yet, the victim reached, the LB not routing: again
                if done:
                    await asyncio.sleep(PROBE_INTERVAL)
                continue
            for back in sorted(backs):
                history.add("queue_back", queue=queue, back=back)
            first = min(backs) if first is None else first
            if healed is None:
                break
            await asyncio.sleep(QUEUE_EVERY)
        return first

    try:
        back = await asyncio.gather(*(probed(q) for q in queues), return_exceptions=True)
    finally:
        pool.shutdown(wait=False)
    back = [t if isinstance(t, float) else None for t in back]
    when = {q: t for q, t in zip(queues, back, strict=True) if t is not None}
    history.add("writable", fault_t=fault_t, target=victim, streams=when, missing=len(queues) - len(when))


def _settled(bed: Any, queue: str, victim: str, history: Any) -> float:
    """One try: a fresh AMQP 1.0 connection through the LB (not to ``victim``), one message to ``queue``, and the
    moment the broker settled it; each step bounded by :data:`TRY_BOUND`."""
    from smartclient.amqp10._rabbitmq_amqp import close_quietly, new_publisher, node_of, open_connection, publish
    from smartclient.core.address import Address
    from smartclient.credentials import Login

    host, port = bed.lb("amqp")
    connection = open_connection(Address(host, port), login=Login("PLAIN", bed.username, bed.password), vhost="/",
                                 name=f"queue-probe-{next(_IDS)}", timeout=TRY_BOUND)
    try:
        if victim and node_of(connection) == victim:
            raise LookupError(f"landed on {victim}, which the fault takes away")
        publish(new_publisher(connection, queue), f"{PROBE}:{next(_IDS)}".encode(), f"queue {queue!r}")
        return round(time.monotonic() - float(history.start), 4)  # (the history's clock)
    finally:
        close_quietly(connection)

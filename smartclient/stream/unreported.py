"""Losses the broker does not report: a producer left on a node that no longer leads its stream, and a
consumer that gets nothing although its stream holds more.

A leader change reaches a producer as a MetadataUpdate, and a lost connection as a closed socket.  Either
can go unreported: RabbitMQ (4.0 and 4.3 alike) may answer Metadata with the old leader for a moment after
an election, so a producer that recovers then declares its publisher on a node that no longer leads.  The
broker accepts that (the node writes to the remote leader), so confirms keep coming, every message crosses
the cluster once more, and no MetadataUpdate follows.  When the leader is not reachable that way, its
messages wait for confirms that never come.  Two looks catch it:

- :func:`confirm_leader`: a producer recovered from a leader change reads the topology again 0.25, 1, 3.25
  and 7.25 s later (:data:`LEADER_SETTLE`), and moves if its node is no longer the first choice;
- :func:`move_back`: a consumer that recovered onto a member that is not its first choice (the first could not
  be read yet: :meth:`~smartclient.stream.carriers.Carriers.ready_member`) reads the topology again 1, 3, 7, ...
  s later (:data:`MOVE_BACK`) and moves once a first-choice member can be read;
- :class:`ConfirmWatch`: while messages are pending and no confirm (or failure) has arrived for
  ``RecoveryPolicy.stall_check`` seconds, the producer reads the topology again and moves if need be; a named
  producer whose third look still finds it on the leader declares its publisher again (what is pending is
  sent again, and stored once).  Off with recovery off.  It reads counters the publish path keeps anyway:
  the hot path pays nothing.

A consumer's subscription can go silent too: once, in CI on RabbitMQ 4.0, a consumer recovered onto a replica
that had just restarted got every message but the stream's last 32 for 30 s, with nothing published after
them; the Spark source's read of a last chunk was once silent the same way (issue 18).  The cause is not
found.  :class:`DeliveryWatch` makes it impossible to stay silent: a consumer that has been handed nothing
for ``stall_check`` seconds, with no chunk waiting for or in its callback, reads the stream's committed chunk
id; if a committed chunk starts at or after the next offset it waits for, it subscribes again there (on a
node its placement picks again).  A look is a StreamStats request to the leader, on a connection of its own
(shared by the consumers of a stream for half a period), and the looks of an idle consumer space out to
every 8 ``stall_check``.  Off for filtered consumers (their silence is the
filter's), for an inactive single active consumer, and with recovery off.

Both watches of all of an Environment's handles are ticked by one task (:func:`watch`), four times per
``stall_check``; a look that reads the broker runs beside the ticks, one per watch at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Coroutine
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol

from smartclient._errors import FeatureNotSupported, HandleStopped
from smartclient.core.deadline import attempt
from smartclient.core.retry import WATCH_POLL, Backoff

if TYPE_CHECKING:
    from smartclient.core.address import Address
    from smartclient.core.topology import Role
    from smartclient.stream.host import HandleControl, StreamHost

__all__ = ["DECLARE_AGAIN", "IDLE_LOOKS", "LEADER_LOOKS", "LEADER_SETTLE", "MOVE_BACK", "MOVE_BACK_LOOKS",
           "STALL_LOOKS", "ConfirmWatch", "DeliveryWatch", "Watch", "confirm_leader", "leader_moved", "move_back",
           "watch", "watch_confirms", "watch_deliveries"]

log = logging.getLogger(__name__)

STALL_LOOKS = 3  # looks at the topology, on the leader, before the publisher is declared again
# After a recovery from a leader change, the waits before each of LEADER_LOOKS looks (at 0.25, 1, 3.25 and
# 7.25 s): an election settles within a second or so, and a broker may answer with the old leader meanwhile.
LEADER_SETTLE = Backoff(initial=0.25, factor=3.0, max=4.0)
LEADER_LOOKS = 4
# A consumer placed on a fallback: the waits before each look for a first choice that can be read (a restarted
# node's members may initialise for tens of seconds), about 4 minutes in all
MOVE_BACK = Backoff(initial=1.0, factor=2.0, max=30.0)
MOVE_BACK_LOOKS = 12
MOVE_BACK_ALONE = 4  # looks in a row with no replica named, after which the leader is the stream's only member
# In stall_check periods: a producer with no confirm looks once a period; each declaration in a row doubles
# that, up to 16 periods, so a broker that is only slow is not flooded.
DECLARE_AGAIN = Backoff(initial=1.0, factor=2.0, max=16.0)
#: the attribute of the log record of each resubscription by the delivery watch: "rescue" (committed messages
#: beyond the offset awaited: a consumer was silent) or "last chunk" (one chunk right at it, which may be an
#: offset-tracking chunk, never delivered): a long run (the soak) counts them
WATCH_RECORD = "smartclient_delivery_watch"
#: the same record's facts, a dict: the stream, the node the consumer was on, the offset it waited for, the
#: committed chunk id read and the seconds it had been silent (the soak records them, with the broker's view)
WATCH_FACTS = "smartclient_delivery_watch_facts"
# In stall_check periods: each look that finds nothing missing doubles the wait before the next, up to 8.
IDLE_LOOKS = Backoff(initial=1.0, factor=2.0, max=8.0)


class _Buffer(Protocol):
    confirmed: int
    failed: int

    @property
    def in_flight(self) -> int: ...

    @property
    def suspended(self) -> bool: ...


class _Handle(Protocol):
    closed: bool
    failure: HandleStopped | None
    stream: str
    name: str | None
    role: Role

    @property
    def recovering(self) -> bool: ...

    @property
    def node(self) -> Address | None: ...

    @property
    def control(self) -> HandleControl: ...


class _Consumer(_Handle, Protocol):
    active: bool | None

    @property
    def waiting_for(self) -> int | None: ...  # the next offset it expects, when that is known

    @property
    def handing_over(self) -> bool: ...  # a chunk waits for, or is in, the callback


class _Producer(_Handle, Protocol):
    @property
    def buffer(self) -> _Buffer | None: ...


async def leader_moved(handle: _Handle, host: StreamHost, context: str) -> bool:
    """Read the topology again (through ``host``, the handle's); if ``handle``'s node is no longer its first
    choice, recover it.  True: stop looking (it moved, or it closed, failed or is recovering already)."""
    if handle.closed or handle.recovering or handle.failure is not None:
        return True
    host.drop_topology(handle.stream)
    try:
        with attempt(host.recovery.attempt_time, f"confirming the leader of {handle.stream!r}"):
            topology = await host.topology(handle.stream)
    except Exception as exc:  # a loss would come through the connection; nothing to conclude here
        log.debug("%r: the leader could not be confirmed (%s)", handle, exc)
        return False
    if handle.node is not None and topology.candidates(handle.role).tier_of(handle.node) != 0:  # the core decides
        handle.control.lost(f"the leader moved to {topology.leader} {context}")
        return True
    return False


async def confirm_leader(handle: _Handle, host: StreamHost, settle: Backoff = LEADER_SETTLE,
                         looks: int = LEADER_LOOKS) -> None:
    """After a recovery from a leader change: look again ``looks`` times, ``settle`` apart, once the election
    settled, and move if need be."""
    for delay in islice(settle.delays(), looks):
        await asyncio.sleep(delay)
        if await leader_moved(handle, host, "while it was recovering"):
            return


async def move_back(handle: _Handle, host: StreamHost, settle: Backoff = MOVE_BACK,
                    looks: int = MOVE_BACK_LOOKS) -> None:
    """``handle``, a consumer placed on a fallback (its first choice could not be read then): look ``looks``
    times, ``settle`` apart, and once a first-choice member can be read, move there (a recovery, from its next
    offset, onto that member: it was read ready a moment ago)."""
    from smartclient.core.topology import Candidates, consumer_fallback

    alone = 0  # looks in a row that found no replica named
    for delay in islice(settle.delays(), looks):
        await asyncio.sleep(delay)
        if handle.closed or handle.recovering or handle.failure is not None or handle.node is None:
            return
        host.drop_topology(handle.stream)
        try:
            with attempt(host.recovery.attempt_time, f"looking for a first choice for {handle!r}"):
                topology = await host.topology(handle.stream)
                if not topology.replicas:  # named once they have joined the leader; a stream of one member has
                    alone += 1  # none (MOVE_BACK_ALONE looks, about 15 s)
                    if alone >= MOVE_BACK_ALONE:
                        return
                    continue
                alone = 0
                if not consumer_fallback(topology, handle.node):  # (the core decides)
                    return
                first = topology.candidates(handle.role).tiers[:1]
                node = await host.ready_member(handle.stream, Candidates(handle.stream, handle.role, first))
        except Exception as exc:  # a first choice not ready yet, or a loss (which comes through the connection)
            log.debug("%r: no first choice that can be read yet (%s)", handle, exc)
            continue
        if not (handle.closed or handle.recovering or handle.failure is not None):
            handle.control.lost(f"moving back to {node}, a first choice that can be read again")
        return


class Watch:
    """A handle's watch, one look at a time: :meth:`tick` reads the handle's counters (cheap, no I/O) and returns
    the look to make now, if any.  The looks of every handle of an Environment are ticked by one task
    (:func:`watch`), not a task per handle: a task and its sleeping coroutine cost 2.2 KiB (tracemalloc),
    a watch 0.15."""

    __slots__ = ("_home", "_making", "ended", "every", "handle", "host")

    def __init__(self, handle: _Handle, host: StreamHost, every: float) -> None:
        self.handle, self.host, self.every = handle, host, every  # (every: its period, the host's stall_check)
        self.ended = False
        self._making: asyncio.Task[None] | None = None  # the look being made, when ticked by the shared task
        self._home: _Watches | None = None  # the watches it is ticked with

    @property
    def over(self) -> bool:
        """Ended, cancelled, or its handle closed or gave up."""
        return self.ended or self.handle.closed or self.handle.failure is not None

    def tick(self, now: Callable[[], float]) -> Coroutine[Any, Any, None] | None:
        """The look to make now, if any (``now``: the clock)."""
        raise NotImplementedError

    def cancel(self) -> None:
        """End it (its handle closes), and the look it is making; it leaves its host's watches at once (the last
        one stops their task: a loop that ends right after its handles closed leaves nothing behind)."""
        self.ended = True
        if self._making is not None:
            self._making.cancel()
        if (home := self._home) is not None:
            self._home = None
            home.drop(self)

    def make(self, look: Coroutine[Any, Any, None]) -> None:
        """Make ``look`` beside the ticks (the next tick of this watch waits for it)."""
        self._making = asyncio.get_running_loop().create_task(look)
        self._making.add_done_callback(self._made)

    def _made(self, look: asyncio.Task[None]) -> None:
        self._making = None
        if not look.cancelled() and (exc := look.exception()) is not None:  # a bug: said, and this watch ends
            log.error("%r: its watch failed", self.handle, exc_info=exc)
            self.ended = True

    async def drive(self, now: Callable[[], float]) -> None:
        """Run it on its own until it is over, a look at a time (tests drive it so, with their own clock)."""
        polls = WATCH_POLL.scaled(self.every).delays()
        while not self.over:
            await asyncio.sleep(next(polls))
            if not self.over and (look := self.tick(now)) is not None:
                await look


class _Watches:
    """The watches of one host (an Environment's stream wing), ticked by one task while there are any."""

    __slots__ = ("__weakref__", "every", "task", "watches")

    def __init__(self, every: float) -> None:
        self.every = every
        self.watches: dict[Watch, None] = {}  # (ordered: each tick looks at them in the order they came)
        self.task: asyncio.Task[None] | None = None

    def add(self, watch: Watch) -> Watch:
        self.watches[watch] = None
        watch._home = self
        if self.task is None or self.task.done():  # (done: cancelled before its first step, or its loop ended)
            self.task = asyncio.get_running_loop().create_task(self._run())
        return watch

    def drop(self, watch: Watch) -> None:
        self.watches.pop(watch, None)
        if not self.watches and self.task is not None:
            self.task.cancel()
            self.task = None

    async def _run(self) -> None:
        polls = WATCH_POLL.scaled(self.every).delays()
        try:
            while self.watches:
                await asyncio.sleep(next(polls))
                for watch in list(self.watches):
                    try:
                        if watch.over:
                            del self.watches[watch]
                        elif watch._making is None and (look := watch.tick(time.monotonic)) is not None:
                            watch.make(look)
                    except Exception:  # a bug in one watch: said, and that watch ends (the others go on)
                        log.exception("%r: its watch failed", watch.handle)
                        watch.ended = True
                        self.watches.pop(watch, None)
        except asyncio.CancelledError:  # its loop ends (or its last watch left): nothing keeps the host from here
            if self.task is asyncio.current_task():
                self.watches.clear()
            raise
        finally:
            if self.task is asyncio.current_task():
                self.task = None


_WATCHES: weakref.WeakKeyDictionary[Any, _Watches] = weakref.WeakKeyDictionary()


def watch(handle: _Handle, host: StreamHost, made: Callable[[Any, StreamHost, float], Watch]) -> Watch:
    """Start ``made(handle, host, every)`` (:class:`ConfirmWatch` or :class:`DeliveryWatch`) on ``host``'s one
    ticking task, with its ``RecoveryPolicy.stall_check`` as the period; ``cancel()`` it when ``handle``
    closes."""
    every = host.recovery.stall_check
    watches = _WATCHES.get(host)
    if watches is None or watches.every != every:
        watches = _WATCHES[host] = _Watches(every)
    return watches.add(made(handle, host, every))


class ConfirmWatch(Watch):
    """A producer's confirms; see the module.  Only a named producer declares its publisher again (what it sends
    again is stored once); an unnamed one only looks, since sending again could store its messages twice.  Each
    declaration in a row doubles the wait before the next (up to 16 times, :data:`DECLARE_AGAIN`), so a broker
    that is only slow is not flooded."""

    __slots__ = ("declared", "looks", "seen", "since")
    handle: _Producer

    def __init__(self, producer: _Producer, host: StreamHost, every: float) -> None:
        super().__init__(producer, host, every)
        self.seen = -1  # confirms and failures counted at the last tick
        self.since: float | None = None  # since when none came, with messages pending
        self.looks = self.declared = 0

    def tick(self, now: Callable[[], float]) -> Coroutine[Any, Any, None] | None:
        producer = self.handle
        buffer = producer.buffer
        if buffer is None:
            return None
        settled = buffer.confirmed + buffer.failed
        if settled != self.seen or not buffer.in_flight or buffer.suspended or producer.recovering:
            if settled != self.seen:
                self.declared = 0  # confirms came: the broker is well again
            self.seen, self.since, self.looks = settled, None, 0
            return None
        if self.since is None:
            self.since = now()
            return None
        waited = now() - self.since
        if waited < DECLARE_AGAIN.delay(self.declared + 1) * self.every * (self.looks + 1):
            return None
        self.looks += 1
        return self._look(f"no confirm for {waited:.1f} s with {buffer.in_flight} message(s) pending")

    async def _look(self, why: str) -> None:
        producer = self.handle
        if await leader_moved(producer, self.host, f"without a MetadataUpdate ({why})"):
            return
        if self.looks >= STALL_LOOKS and producer.name is not None:
            self.looks, self.since, self.declared = 0, None, self.declared + 1
            log.warning("%r: %s, on the leader: declaring its publisher again", producer, why)
            producer.control.lost(f"{why}: the publisher is declared again")
        else:
            log.info("%r: %s; it is still on the leader", producer, why)


async def watch_confirms(producer: _Producer, host: StreamHost, every: float,
                         now: Callable[[], float] = time.monotonic) -> None:
    """A :class:`ConfirmWatch` on its own, until ``producer`` closes or gives up (handles share a task:
    :func:`watch`)."""
    await ConfirmWatch(producer, host, every).drive(now)


def _paused(consumer: _Consumer) -> bool:
    """Closed, recovering, an inactive single active consumer, or a chunk waits for or is in the callback."""
    return consumer.closed or consumer.recovering or consumer.active is False or consumer.handing_over


class DeliveryWatch(Watch):
    """A consumer's deliveries; see the module.  Each look that finds nothing missing doubles the wait before the
    next (up to 8 times, :data:`IDLE_LOOKS`).  A committed chunk that a resubscription did not bring (an
    offset-tracking chunk, which consumers are never handed, or a chunk whose callback raised) is not acted on
    twice: only a later committed chunk is."""

    __slots__ = ("idle", "seen", "since", "tried")
    handle: _Consumer

    def __init__(self, consumer: _Consumer, host: StreamHost, every: float) -> None:
        super().__init__(consumer, host, every)
        self.seen: tuple[int | None, int] | None = None  # the offset awaited and the subscription, at the last tick
        self.since: float | None = None
        self.idle = 0
        self.tried: int | None = None  # the committed chunk the last resubscription was for

    def tick(self, now: Callable[[], float]) -> Coroutine[Any, Any, None] | None:
        consumer, seen = self.handle, self.seen
        mark = (consumer.waiting_for, id(consumer.control.subscriber))
        if _paused(consumer) or mark != seen:
            if seen is not None and mark[1] == seen[1] and mark[0] != seen[0]:
                self.idle = 0  # deliveries came
            self.seen, self.since = mark, None
            return None
        if self.since is None:
            self.since = now()
            return None
        waited = now() - self.since
        if waited < IDLE_LOOKS.delay(self.idle + 1) * self.every or mark[0] is None:
            return None
        return self._look(mark[0], mark, waited, now)

    async def _look(self, awaited: int, mark: tuple[int | None, int], waited: float, now: Callable[[], float]
                    ) -> None:
        consumer = self.handle
        try:
            with attempt(self.host.recovery.attempt_time, f"reading the committed chunk of {consumer.stream!r}"):
                committed = await self.host.committed_chunk_id(consumer.stream)
        except FeatureNotSupported as exc:  # a broker before 3.11: nothing to look at
            log.warning("%r: no delivery watch: %s", consumer, exc)
            self.ended = True
            return
        except Exception as exc:  # a loss would come through the connection; look again later
            log.debug("%r: the committed chunk could not be read (%s)", consumer, exc)
            self.idle, self.since = self.idle + 1, now()
            return
        if committed < awaited or (self.tried is not None and committed <= self.tried):
            self.idle, self.since = self.idle + 1, now()  # nothing missing, or nothing a resubscription would bring
            return
        if _paused(consumer) or (consumer.waiting_for, id(consumer.control.subscriber)) != mark:
            return  # a chunk came meanwhile
        self.tried, self.since = committed, None
        why = (f"nothing delivered for {waited:.1f} s with committed messages at offset {committed} and beyond, "
               f"waiting for offset {awaited}")
        # one chunk right at the offset awaited may be an offset-tracking chunk: said quietly
        rescue = committed > awaited
        facts = {"stream": consumer.stream, "node": str(consumer.node), "waiting_for": awaited,
                 "committed": committed, "silent": round(waited, 2)}
        log.log(logging.WARNING if rescue else logging.INFO, "%r: %s: subscribing again", consumer, why,
                extra={WATCH_RECORD: "rescue" if rescue else "last chunk", WATCH_FACTS: facts})
        consumer.control.lost(why)


async def watch_deliveries(consumer: _Consumer, host: StreamHost, every: float,
                           now: Callable[[], float] = time.monotonic) -> None:
    """A :class:`DeliveryWatch` on its own, until ``consumer`` closes or gives up (handles share a task:
    :func:`watch`)."""
    await DeliveryWatch(consumer, host, every).drive(now)

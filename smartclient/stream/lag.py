"""Consumer lag, sampled: one sampler per Environment reads each consumed stream's end (StreamStats, from a
member of the stream) every :data:`LAG_SAMPLE` seconds and, right after each answer, the position of every
consumer of that stream; the lag is the one :mod:`smartclient.core.lag` decides (0 once a consumer settled:
idle, and neither its position nor the end moved over a whole period).  ``Consumer.lag`` and the
``smartclient.consumer.lag`` gauge read the last sample.

What it costs: nothing per message (a position is what the consumer keeps anyway, read once per sample), and
nothing at all until someone asks: the sampler starts on the first read of ``Consumer.lag`` or the first
collection of the gauge, runs while the Environment has consumers, and stops with its last one.  A sample is
one StreamStats request per consumed stream, on a short connection of its own, all streams at once, each
bounded by ``RecoveryPolicy.attempt_time``; a stream whose read fails keeps its last lags until a read
succeeds.  Any member of the stream answers, not only its leader: through a load balancer the first node
reached is taken (one session per read, counted in ``smartclient.placement.sessions``, and never a node
mismatch), and a replica's view trails the leader's only by its replication, as do the consumers it serves.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from smartclient._errors import FeatureNotSupported, StreamNotFound
from smartclient.core.deadline import attempt
from smartclient.core.lag import Mark, StreamEnd, consumer_lag, has_settled, worst
from smartclient.core.retry import Backoff
from smartclient.core.topology import Role

__all__ = ["LAG_SAMPLE", "LagSampler", "lag_sampler"]

log = logging.getLogger(__name__)

LAG_SAMPLE = Backoff.steady(5.0)
"""The pace of the samples: each costs a connection per consumed stream, so a few seconds, the scale of a
metrics reader's period; a lag read is at most this old (plus the StreamStats round trip)."""


class LagSampler:
    """The lag sampler of one Environment's consumers (``host``: its carriers, which hold the handles, the
    topologies and the connector)."""

    def __init__(self, host: Any, every: Backoff = LAG_SAMPLE) -> None:
        self.host = weakref.proxy(host)  # (the registry's key: a strong one would keep it for ever)
        self.every = every
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[None] | None = None
        self.lags: dict[int, int | None] = {}  # id(consumer) -> its lag at the last sample of its stream
        self.marks: dict[int, Mark] = {}  # id(consumer) -> (its stream's end, its position) at that sample
        self.ends: dict[str, StreamEnd] = {}  # stream -> its end at the last sample
        self.by_name: dict[tuple[str, str | None], int] = {}  # (stream, consumer name) -> the worst lag
        self.samples = 0  # samples taken (each stream read, or tried, once)
        self.unsupported = False  # the broker has no StreamStats (before 3.11): no lag

    # -- readings (any thread) ------------------------------------------------------------------------
    def lag(self, consumer: Any) -> int | None:
        """``consumer``'s lag at the last sample (None before its stream's first one); starts the sampling."""
        self.wanted()
        return self.lags.get(id(consumer))

    def worst(self) -> dict[tuple[str, str | None], int]:
        """The largest lag of each (stream, consumer name) at the last sample; starts the sampling."""
        self.wanted()
        return self.by_name

    # -- the sampling ----------------------------------------------------------------------------------
    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the Environment's consumers run on (where the sampler runs)."""
        self.loop = loop

    def wanted(self) -> None:
        """Someone reads the lag: sample, if not already, from the loop's thread whichever thread asks."""
        loop = self.loop
        if self.task is not None or self.unsupported or loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._start()
        else:
            loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        if self.task is None and self._consumers():
            self.task = asyncio.get_running_loop().create_task(self._run())
            self.task.add_done_callback(self._stopped)

    def _stopped(self, task: asyncio.Task[None]) -> None:
        if self.task is task:
            self.task = None
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("the consumer lag sampler stopped: %s", exc, exc_info=exc)

    def forget(self, consumer: Any) -> None:
        """``consumer`` closed: its lag goes; with the last consumer, the sampling stops."""
        self.lags.pop(id(consumer), None)
        self.marks.pop(id(consumer), None)
        if self.task is not None and not self._consumers(but=consumer):
            self.task.cancel()
            self.task = None
            self._clear()

    def _clear(self) -> None:
        self.lags, self.marks, self.ends, self.by_name = {}, {}, {}, {}

    def _consumers(self, but: Any = None) -> list[Any]:
        try:
            handles = list(self.host.handles)
        except ReferenceError:  # the Environment is gone (a read from another thread came late)
            return []
        return [h for h in handles if h.role is Role.CONSUMER and h is not but and not h.closed and h.failure is None]

    async def _run(self) -> None:
        waits = self.every.delays()
        while consumers := self._consumers():
            await self.sample(consumers)
            if self.unsupported:
                return
            await asyncio.sleep(next(waits))
        self._clear()

    async def sample(self, consumers: Iterable[Any]) -> None:
        """One sample: each stream's end read (all at once), then the positions of its consumers."""
        streams: dict[str, list[Any]] = defaultdict(list)
        for consumer in consumers:
            streams[consumer.stream].append(consumer)
        lags = dict(self.lags)
        answers = await asyncio.gather(*(self._sample_stream(stream, mine) for stream, mine in streams.items()))
        for found in answers:
            lags.update(found)
        live = {id(c) for c in self._consumers()}
        self.lags = {key: lag for key, lag in lags.items() if key in live}
        self.marks = {key: mark for key, mark in self.marks.items() if key in live}
        self.ends = {stream: end for stream, end in self.ends.items() if stream in streams}  # (streams come and go)
        self.by_name = worst(((c.stream, c.name), self.lags.get(id(c))) for c in self._consumers())
        self.samples += 1

    async def _sample_stream(self, stream: str, consumers: list[Any]) -> dict[int, int | None]:
        from smartclient.stream.stats import stream_stats_from

        host = self.host
        try:
            with attempt(host.recovery.attempt_time, f"reading the end of {stream!r}"):
                topology = await host.topology(stream)
                stats = await stream_stats_from(host.placement.connector, topology.candidates(Role.LOCATOR), stream,
                                                f"{host.connection_name}-lag")
        except FeatureNotSupported as exc:
            log.warning("no consumer lag: %s", exc)
            self.unsupported = True
            return {}
        except StreamNotFound:
            self.ends.pop(stream, None)
            return {id(c): None for c in consumers}
        except Exception as exc:  # a loss or a slow leader: the last lags stay until a read succeeds
            log.debug("the end of %r could not be read for its consumers' lag: %s", stream, exc)
            return {}
        positions = [(c, _position(c), _idle(c)) for c in consumers]  # right after the answer: the lag then
        end = self.ends[stream] = StreamEnd.from_stats(stats, (p for _, p, _ in positions))
        lags = {}
        for consumer, position, idle in positions:
            mark = (end.next_offset, position)
            lags[id(consumer)] = consumer_lag(end, position, has_settled(self.marks.get(id(consumer)), mark, idle))
            self.marks[id(consumer)] = mark
        return lags


def _position(consumer: Any) -> int | None:
    """The next offset ``consumer`` would hand over; None when unknown, or for an inactive single active
    consumer (another instance of its name reads for it)."""
    return None if consumer.active is False else consumer.waiting_for


def _idle(consumer: Any) -> bool:
    """No chunk waits for or is in ``consumer``'s callback, and it is not recovering."""
    return not consumer.handing_over and not consumer.recovering


_SAMPLERS: weakref.WeakKeyDictionary[Any, LagSampler] = weakref.WeakKeyDictionary()


def lag_sampler(host: Any) -> LagSampler:
    """The one lag sampler of ``host`` (an Environment's carriers), made on first use."""
    sampler = _SAMPLERS.get(host)
    if sampler is None:
        sampler = _SAMPLERS[host] = LagSampler(host)
    return sampler

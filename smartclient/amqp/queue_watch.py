"""AMQP 0.9.1's queue watch: what a connection waits for from its queues' leaders, read from the methods it sends
and receives (pika's, handed over by the seam, :class:`smartclient.amqp._pika.SilenceWatch`, which asks the
questions and ends the connection).  No pika import: it reads each method's ``NAME`` and fields."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["ZERO_FOR", "QueueWatch"]

#: seconds of 0-consumer answers in a row (asked at each look: a second apart) that end a connection
ZERO_FOR = 4.0


class QueueWatch:
    """What a connection waits for from its queues' leaders, read from the methods it sends and receives.  A node
    cut off from its peers (a partition's minority) answers all it can alone (``basic.qos``, heartbeats), so the link
    looks alive while its quorum queues stall: no confirm comes, nothing is delivered.  Two signs end the connection
    (:class:`NodeCutOff`; the placer then avoids the node a while): **no confirm** for ``confirm_limit`` s with
    messages pending (not judged while the broker blocks the connection), and **a consumed queue that no longer
    counts its consumers**: with nothing delivered for a while, the watch's question is a passive ``queue.declare``
    of a queue the connection consumes, which a node that cannot reach the queue's leader answers at once with 0
    consumers (RabbitMQ 4.3.6, measured: ``rabbit_quorum_queue:stat`` asks the leader for 250 ms, and answers 0
    and 0 when it does not hear back).  A stream always answers 0, so only a queue counted before is judged (the
    watch asks right after each ``basic.consume``, and while idle, until one counts); and since a leader only busy
    for 250 ms answers 0 too, a 0 is asked again at each look, and the connection ends only once the answers were
    0 for :data:`ZERO_FOR` seconds in a row with nothing delivered (a delivery proves the leader reachable)."""

    def __init__(self, confirm_limit: float) -> None:
        self.confirm_limit = confirm_limit
        self.consumed: dict[tuple[int, str], str] = {}  # (channel, consumer tag) -> queue
        self.counted: set[str] = set()  # consumed queues a declare counted consumers of
        self.zeros: dict[str, float] = {}  # counted queues answering 0 since (nothing delivered meanwhile)
        self.unasked: list[str] = []  # consumed queues not declared since their basic.consume
        self.confirms: dict[int, list[float]] = {}  # channel -> [published, confirmed, since: last progress]
        self.delivered = time.monotonic()  # the last delivery (or consume)
        self.asked = 0.0  # when an idle consumer's queue was last asked
        self.skipped: set[str] = set()  # queues a passive declare does not find (404): never asked again
        self.cut: str | None = None  # why the node is cut off from its queues' leaders

    def sent(self, channel: int, method: Any) -> None:  # on the publish path: a clock read only where one is kept
        name = method.NAME
        if name == "Basic.Publish":
            if (state := self.confirms.get(channel)) is not None:
                if state[0] == state[1]:
                    state[2] = time.monotonic()
                state[0] += 1
        elif name == "Basic.Ack":  # (a consumer's acks: the most frequent after publishes)
            return
        elif name == "Basic.Consume":
            self.consumed[(channel, method.consumer_tag)] = method.queue
            self.unasked.append(method.queue)
            self.delivered = time.monotonic()
        elif name == "Basic.Cancel":
            self.consumed.pop((channel, method.consumer_tag), None)
        elif name == "Confirm.Select":
            self.confirms[channel] = [0, 0, time.monotonic()]
        elif name in ("Channel.Close", "Channel.CloseOk"):
            self.forget(channel)

    def received(self, channel: int, method: Any) -> None:
        if method.NAME == "Basic.Deliver":
            self.delivered = time.monotonic()
            self.zeros.clear()
        elif method.NAME in ("Basic.Ack", "Basic.Nack"):
            if (state := self.confirms.get(channel)) is not None:
                state[1] = min(state[0], max(state[1] + 1, method.delivery_tag) if not method.multiple
                               else max(state[1], method.delivery_tag))
                state[2] = time.monotonic()
        elif method.NAME == "Basic.Cancel":
            self.consumed.pop((channel, method.consumer_tag), None)
        elif method.NAME in ("Channel.Close", "Channel.CloseOk"):
            self.forget(channel)

    def forget(self, channel: int) -> None:
        self.confirms.pop(channel, None)
        for key in [key for key in self.consumed if key[0] == channel]:
            del self.consumed[key]

    def to_ask(self, now: float, every: float) -> str | None:
        """The queue to declare now: one not asked since its consume, else one whose last answer was 0 after a
        count, else (nothing delivered for ``every`` s) any consumed, in turn."""
        queues = set(self.consumed.values()) - self.skipped
        while self.unasked:
            if (queue := self.unasked.pop(0)) in queues:
                return queue
        doubted = sorted(queues & self.zeros.keys())
        if doubted:
            return doubted[int(now) % len(doubted)]
        waiting = sorted(queues)
        if waiting and now - self.delivered >= every and now - self.asked >= every:
            self.asked = now  # idle: one a third of dead_after, as the silence watch's question
            return waiting[int(now) % len(waiting)]
        return None

    def declared(self, queue: str, consumers: int, now: float) -> None:
        if queue not in self.consumed.values():
            return
        if consumers:
            self.counted.add(queue)
            self.zeros.pop(queue, None)
        elif queue in self.counted:
            since = self.zeros.setdefault(queue, now)
            if now - since >= ZERO_FOR:
                self.cut = (f"queue {queue!r} answered 0 consumers on this node for {now - since:.1f} s while this "
                            f"connection consumes it (it counted them before): the node cannot reach the queue's "
                            f"leader")

    def stalled(self, now: float) -> str | None:  # why the node is cut off from its queues' leaders, or None
        if self.cut is not None:
            return self.cut
        for published, confirmed, since in self.confirms.values():
            if published > confirmed and now - since >= self.confirm_limit:
                return (f"no confirm for {now - since:.1f} s with {published - confirmed:g} message(s) pending: the "
                        f"node commits nothing")
        return None

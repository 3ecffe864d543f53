"""Streams over AMQP 0.9.1 (pika): declaration, ``x-stream-offset`` consumers on a replica, QoS, acks.

A stream read over AMQP needs a per-consumer prefetch (``basic.qos`` with ``global=false``); with a
global one the broker closes the channel.  :func:`stream_qos` refuses it first, with a clear error.
Messages must be acknowledged (there is no auto-ack on a stream); :class:`AmqpStreamConsumer` acks each
one after the callback returns (at-least-once), unless the callback acked it already.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from smartclient._errors import ConfigurationError, ConnectionFailed, NoCandidateNode, StreamNotReady
from smartclient.amqp._pika import pika_errors
from smartclient.core.offsets import OffsetSpec
from smartclient.core.retry import Backoff
from smartclient.core.stream_arguments import StreamArguments, validate_stream_name

if TYPE_CHECKING:
    from smartclient.amqp.placement import AmqpPlacer, PlacedConnection

__all__ = ["AmqpStreamConsumer", "StreamDelivery", "declare_stream", "stream_members", "stream_qos"]


def declare_stream(channel: Any, stream: str,
                   arguments: StreamArguments | Mapping[str, Any] | None = None) -> None:
    """Declare a stream (durable, ``x-queue-type: stream``) with validated arguments.

    :raises ConfigurationError: a bad name or argument, before anything is sent.
    :raises ConnectionFailed: the broker refused the declaration (closing the channel), e.g. a stream or
        queue of that name with other arguments.
    """
    validate_stream_name(stream)
    amqp_arguments = StreamArguments.coerce(arguments).to_amqp()
    with pika_errors(f"declaring stream {stream!r}"):
        channel.queue_declare(stream, durable=True, arguments=amqp_arguments)


def stream_qos(channel: Any, prefetch: int, *, global_qos: bool = False) -> None:
    """Set the per-consumer prefetch a stream consumer needs.

    :raises ConfigurationError: ``global_qos=True`` (the broker would close the channel), or a prefetch
        that is not a positive int.
    """
    if global_qos:
        raise ConfigurationError(
            "global QoS is not allowed on a stream consumer: RabbitMQ closes the channel "
            "(PRECONDITION_FAILED); use a per-consumer prefetch (global_qos=False)"
        )
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise ConfigurationError(f"a stream consumer needs a prefetch of at least 1, not {prefetch!r}")
    with pika_errors(f"setting a prefetch of {prefetch}"):
        channel.basic_qos(prefetch_count=prefetch, global_qos=False)


def stream_members(placer: AmqpPlacer, stream: str) -> tuple[str, tuple[str, ...]]:
    """``(leader, replicas)`` of a stream, as node names, from the management API."""
    info = placer.management.queue(placer.vhost, stream)
    leader = str(info.get("leader") or info.get("node") or "")
    members = [str(m) for m in info.get("members") or [] if str(m) != leader]
    if not leader:
        raise NoCandidateNode(f"the management API reports no leader for stream {stream!r}")
    return leader, tuple(sorted(members))


@dataclass
class StreamDelivery:
    """One message read from a stream over AMQP."""

    body: bytes
    offset: int
    properties: Any
    _channel: Any
    _tag: int
    acked: bool = False

    def ack(self) -> None:
        if not self.acked:
            with pika_errors(f"acking offset {self.offset}"):
                self._channel.basic_ack(self._tag)
            self.acked = True


class AmqpStreamConsumer:
    """Reads a stream over AMQP from a replica node (the leader if it has none).

    :param offset: where to start: ``"first"``, ``"last"``, ``"next"``, an offset, a ``datetime``
        (sent as an AMQP timestamp, in seconds) or an interval such as ``"1h"``; see :class:`OffsetSpec`.
    :param prefetch: per-consumer prefetch (required: streams need it).
    :param node: consume on this node only (else a replica, chosen at random).
    :param ready_timeout: how long a member that does not run yet (a stream just declared, a replica restarting)
        is waited for: an unpinned consumer tries the other replicas meanwhile, and the leader past it.
    :raises StreamNotReady: no member asked ran by ``ready_timeout``.
    """

    def __init__(self, placer: AmqpPlacer, stream: str, callback: Callable[[StreamDelivery], None], *,
                 offset: OffsetSpec | str | int | dt.datetime = "next", prefetch: int = 100,
                 node: str | None = None, global_qos: bool = False, ready_timeout: float = 10.0) -> None:
        validate_stream_name(stream)
        self.spec = OffsetSpec.parse(offset)
        stream_qos(_NoChannel(), prefetch, global_qos=global_qos)  # bad input fails before any I/O
        if isinstance(ready_timeout, bool) or not isinstance(ready_timeout, (int, float)) or ready_timeout < 0:
            raise ConfigurationError(f"ready_timeout must be a number of seconds >= 0, not {ready_timeout!r}")
        self.placer = placer
        self.stream = stream
        self.callback = callback
        self.prefetch = prefetch
        self.placed: PlacedConnection = self._subscribe(node, time.monotonic() + ready_timeout)
        self.delivered = 0

    def _subscribe(self, pinned: str | None, deadline: float) -> PlacedConnection:
        """Consume on ``pinned``, else on a replica (the leader if the stream has none).  A member that does not
        run yet (a stream just declared, a replica restarting: the broker closes the channel, 406) is asked again,
        another replica first, until ``deadline``; past it an unpinned consumer takes the leader.

        :raises StreamNotReady: no member asked ran one by ``deadline``.
        """
        refused: set[str] = set()
        rounds = 0
        leader: str = ""
        replicas: tuple[str, ...] = ()  # (read at the first round: a pinned consumer needs neither)
        while True:
            if pinned is None and not refused:  # a round begins: the members are read again (they may have changed)
                leader, replicas = stream_members(self.placer, self.stream)
            late = time.monotonic() >= deadline
            if pinned is not None:
                node = pinned
            else:
                waiting = [r for r in replicas if r not in refused]
                node = random.choice(waiting) if waiting and not late else leader
            try:
                return self._consume_on(node)
            except ConnectionFailed as exc:
                if _NOT_RUNNING not in str(exc):
                    raise
                refused.add(node)
                if time.monotonic() >= deadline and (pinned is not None or node == leader):
                    raise StreamNotReady(f"stream {self.stream!r} has no running member on {node} to consume from "
                                         f"(asked {len(refused)} node(s) until the ready timeout): {exc}") from exc
            if pinned is not None or not [r for r in replicas if r not in refused]:
                refused.clear()  # every replica asked: give them a moment to start, then ask them again
                rounds += 1
                if (left := deadline - time.monotonic()) > 0:
                    time.sleep(min(MEMBER_AGAIN.delay(rounds), left))

    def _consume_on(self, node: str) -> PlacedConnection:
        placed = self.placer.connect(node)
        try:
            self.channel = placed.channel()
            stream_qos(self.channel, self.prefetch)
            with pika_errors(f"consuming stream {self.stream!r} on {placed.node}"):
                self.tag = self.channel.basic_consume(
                    self.stream, self._on_message, auto_ack=False,
                    arguments={"x-stream-offset": self.spec.to_amqp()},
                )
        except BaseException:
            placed.close()
            raise
        return placed

    @property
    def node(self) -> str:
        return self.placed.node

    def _on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        offset = int((properties.headers or {}).get("x-stream-offset", -1))
        delivery = StreamDelivery(body, offset, properties, channel, method.delivery_tag)
        self.callback(delivery)
        delivery.ack()
        self.delivered += 1

    def poll(self, seconds: float) -> None:
        """Deliver what arrives for ``seconds`` (call it from the thread that created the consumer).

        :raises ConnectionFailed: the connection or channel was lost.  The callback's own errors pass through.
        """
        with pika_errors(f"reading stream {self.stream!r} on {self.node}", callbacks=True):
            self.placed.connection.process_data_events(time_limit=seconds)

    def run(self) -> None:
        """Deliver until :meth:`stop` is called from the callback.

        :raises ConnectionFailed: the connection or channel was lost.  The callback's own errors pass through.
        """
        with pika_errors(f"reading stream {self.stream!r} on {self.node}", callbacks=True):
            self.channel.start_consuming()

    def stop(self) -> None:
        with pika_errors(f"stopping the consumer of stream {self.stream!r}"):
            self.channel.stop_consuming()

    def close(self) -> None:
        self.placed.close()

    def __enter__(self) -> AmqpStreamConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: the pause before every member of a stream is asked again, when none ran one yet (a stream just declared)
MEMBER_AGAIN = Backoff(initial=0.05, factor=2.0, max=0.5)

#: what the broker says, closing the channel (406), to a consumer on a node whose member of the stream does not run
_NOT_RUNNING = "does not have a running replica on the local node"


class _NoChannel:
    def basic_qos(self, **_: Any) -> None:
        return None

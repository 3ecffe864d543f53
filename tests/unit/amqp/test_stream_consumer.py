"""An AMQP 0.9.1 stream consumer asked onto a member that does not run yet (the broker closes the channel, 406).

CI on 2026-12-02 saw it on RabbitMQ 4.0.5: a consumer placed on a replica of a stream declared a moment before got
"does not have a running replica on the local node".  The consumer asks the other replicas, then again after a pause,
and past ``ready_timeout`` the leader; a pinned one waits for its node.  Fakes stand in for the placer and pika's
channel here; ``tests/integration/test_amqp.py`` reads real streams.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika.exceptions as px
import pytest

from smartclient import ConfigurationError, ConnectionFailed, StreamNotReady
from smartclient.amqp.streams import AmqpStreamConsumer

NOT_RUNNING = "PRECONDITION_FAILED - stream queue 's' in vhost '/' does not have a running replica on the local node"


class FakeChannel:
    def __init__(self, refuse: Callable[[], Exception | None]) -> None:
        self.refuse = refuse

    def basic_qos(self, **_: Any) -> None:
        return None

    def basic_consume(self, *_: Any, **__: Any) -> str:
        if (exc := self.refuse()) is not None:
            raise exc
        return "ctag"


class FakePlaced:
    def __init__(self, node: str, channel: FakeChannel) -> None:
        self.node, self._channel, self.closed = node, channel, False

    def channel(self) -> FakeChannel:
        return self._channel

    def close(self) -> None:
        self.closed = True


class FakePlacer:
    """Members rabbit-1 (leader), rabbit-2 and rabbit-3; ``running`` says which consume, as it changes per ask."""

    vhost = "/"

    def __init__(self, running: Callable[[str, int], bool]) -> None:
        self.running, self.asked, self.placed = running, [], []
        self.management = self

    def queue(self, vhost: str, name: str) -> dict[str, Any]:
        return {"leader": "rabbit-1", "members": ["rabbit-1", "rabbit-2", "rabbit-3"]}

    def connect(self, node: str) -> FakePlaced:
        self.asked.append(node)
        ask = len(self.asked)
        refuse = (lambda: None) if self.running(node, ask) else (lambda: px.ChannelClosedByBroker(406, NOT_RUNNING))
        placed = FakePlaced(node, FakeChannel(refuse))
        self.placed.append(placed)
        return placed


def consumer(placer: FakePlacer, **kwargs: Any) -> AmqpStreamConsumer:
    return AmqpStreamConsumer(placer, "s", lambda d: None, **kwargs)  # type: ignore[arg-type]


def test_a_replica_that_does_not_run_yet_sends_the_consumer_to_the_other_replica() -> None:
    placer = FakePlacer(lambda node, _ask: node == "rabbit-3")
    c = consumer(placer)
    assert c.node == "rabbit-3"
    assert set(placer.asked) <= {"rabbit-2", "rabbit-3"} and placer.asked[-1] == "rabbit-3"
    assert all(p.closed for p in placer.placed[:-1]) and not placer.placed[-1].closed  # refused connections closed


def test_replicas_that_start_late_are_asked_again_and_the_consumer_stays_on_a_replica() -> None:
    placer = FakePlacer(lambda node, ask: node != "rabbit-1" and ask > 4)
    assert consumer(placer, ready_timeout=5).node in {"rabbit-2", "rabbit-3"}
    assert "rabbit-1" not in placer.asked


def test_past_the_ready_timeout_the_consumer_takes_the_leader() -> None:
    placer = FakePlacer(lambda node, _ask: node == "rabbit-1")
    assert consumer(placer, ready_timeout=0.2).node == "rabbit-1"
    assert placer.asked[-1] == "rabbit-1" and {"rabbit-2", "rabbit-3"} <= set(placer.asked)


def test_a_pinned_node_is_waited_for_then_a_typed_error_names_it() -> None:
    placer = FakePlacer(lambda node, ask: node == "rabbit-2" and ask >= 3)
    assert consumer(placer, node="rabbit-2").node == "rabbit-2"
    assert placer.asked == ["rabbit-2"] * 3
    never = FakePlacer(lambda _node, _ask: False)
    with pytest.raises(StreamNotReady, match="no running member on rabbit-2"):
        consumer(never, node="rabbit-2", ready_timeout=0.2)
    assert set(never.asked) == {"rabbit-2"} and all(p.closed for p in never.placed)


def test_other_channel_closes_pass_through_at_once() -> None:
    placer = FakePlacer(lambda _node, _ask: False)
    placer.connect = lambda node: FakePlaced(node, FakeChannel(lambda: px.ChannelClosedByBroker(404, "NOT_FOUND")))  # type: ignore[method-assign]
    with pytest.raises(ConnectionFailed, match="404") as info:
        consumer(placer)
    assert not isinstance(info.value, StreamNotReady)


@pytest.mark.parametrize("bad", [-1, "10", True, None])
def test_a_bad_ready_timeout_is_a_typed_error(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="ready_timeout"):
        consumer(FakePlacer(lambda _node, _ask: True), ready_timeout=bad)

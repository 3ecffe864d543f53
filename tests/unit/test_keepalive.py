"""smartclient.keepalive: the options that find a silent peer within ConnectionOptions.dead_after."""

import socket

import pytest

from smartclient import ConfigurationError, ConnectionOptions
from smartclient.keepalive import heartbeat, idle_timeout, mqtt_watch, silence_limit, tcp_options, watch


def test_the_options_find_a_silent_peer_within_dead_after() -> None:
    assert tcp_options(10.0) == {"TCP_USER_TIMEOUT": 9000, "TCP_KEEPIDLE": 3, "TCP_KEEPINTVL": 1, "TCP_KEEPCNT": 10}
    assert tcp_options(2) == {"TCP_USER_TIMEOUT": 1000, "TCP_KEEPIDLE": 1, "TCP_KEEPINTVL": 1, "TCP_KEEPCNT": 2}
    assert tcp_options(0) == {}


def test_a_tcp_socket_gets_them_and_anything_else_is_left_alone() -> None:
    with socket.socket() as sock:
        watch(sock, 10.0)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 9000
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 3
    with socket.socket() as sock:
        watch(sock, 0)  # off
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
    left, right = socket.socketpair()
    with left, right:
        watch(left, 10.0)  # a Unix socket: nothing to watch
    watch(None, 10.0)
    watch(object(), 10.0)


def test_dead_after_is_checked() -> None:
    assert ConnectionOptions().dead_after == 10.0
    assert ConnectionOptions(dead_after=0).dead_after == 0
    with pytest.raises(ConfigurationError, match="ConnectionOptions.dead_after must be 0 .off. or at least 4 seconds"):
        ConnectionOptions(dead_after=3)
    with pytest.raises(ConfigurationError, match="ConnectionOptions.dead_after"):
        ConnectionOptions(dead_after=-1)


def test_the_heartbeat_comes_at_least_every_fifth_of_dead_after() -> None:
    assert heartbeat(60, 10.0) == 2  # an idle peer's two heartbeats apart at most: 4 s, within the 6 s limit
    assert heartbeat(2, 10.0) == 2  # the user's, shorter
    assert heartbeat(60, 2.0) == 1
    assert heartbeat(60, 0) == 60  # dead_after off: the user's heartbeat
    assert heartbeat(0, 10.0) == 0  # heartbeats off stay off (only TCP's own checks are left)


def test_the_silence_limit_leaves_room_for_a_one_way_drop_and_none_for_a_false_alarm() -> None:
    assert silence_limit(2, 10.0) == 6  # a one-way drop stalls the node's TCP at its next frame: <= 4 s + 6 s
    assert silence_limit(1, 10.0) == 8  # the user's shorter heartbeat
    assert silence_limit(1, 4.0) == 3  # the least dead_after: three heartbeats, never fewer (a live idle peer)
    assert silence_limit(12, 60.0) == 36
    assert silence_limit(0, 10.0) == 10  # no heartbeat: the whole of dead_after
    for dead_after in (4, 5, 7, 10, 13, 30, 60, 600):
        beat = heartbeat(60, dead_after)
        assert silence_limit(beat, dead_after) >= 3 * beat  # above a live peer's gap (2 heartbeats) by one
        assert silence_limit(beat, dead_after) + 2 * beat <= max(dead_after, 5 * beat)


def test_an_amqp10_idle_timeout_is_two_fifths_of_dead_after() -> None:
    assert idle_timeout(60, 10.0) == 4.0  # the broker sends every 2 s: a drop toward the node is silent within that
    assert idle_timeout(3, 10.0) == 3.0  # the user's, shorter
    assert idle_timeout(60, 0) == 60.0  # dead_after off: the heartbeat
    assert idle_timeout(0, 10.0) == 0.0  # off stays off
    assert idle_timeout(60, 4.0) == 2.0  # never under 2 s: proton advertises half, RabbitMQ refuses under 1 s
    assert idle_timeout(1, 10.0) == 2.0


@pytest.mark.parametrize(("dead_after", "every", "limit"), [(4, 1, 3), (5, 1, 3), (6, 1, 4), (10, 2, 8), (20, 5, 18)])
def test_the_silence_watch_ends_two_seconds_before_dead_after_and_never_under_three_pings(
        dead_after: float, every: float, limit: float) -> None:
    assert mqtt_watch(dead_after) == (every, limit)

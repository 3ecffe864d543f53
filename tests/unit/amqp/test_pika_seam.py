"""smartclient reaches into pika in one module, ``smartclient/amqp/_pika.py``.

These tests are generated from that module's lists (``PIKA_INTERNALS``, ``PIKA_NAMES``, ``PIKA_SIGNATURES``):
every entry is checked against the installed pika, the lists are checked to cover every private name the seam
touches, and the library is grepped for pika imports and those private names outside the seam.  They fail
loudly when a new pika moves the seam; ``pyproject.toml`` pins pika>=1.3.2,<1.5.

The error mapping is checked with pika's own exceptions, and against local sockets (a closed port, a TLS
listener whose certificate names another host); the integration tests run the real broker.
"""

from __future__ import annotations

import inspect
import socket
import ssl
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pika
import pika.exceptions as px
import pytest

from smartclient import (
    Address,
    AuthenticationFailed,
    CertificateRejected,
    ConnectionFailed,
    NoRpcServer,
    PublishFailed,
    TokenExpired,
    TokenRefused,
)
from smartclient.amqp._pika import (
    PIKA_INTERNALS,
    PIKA_NAMES,
    PIKA_SIGNATURES,
    SilenceWatch,
    open_connection,
    pika_errors,
)
from smartclient.credentials import Login
from tests.unit.fakes import FakeBroker, tls_contexts
from tests.unit.seams import ROOT, imports_of, parameters, private_names_used_in, private_uses, resolve_path

SEAM = ROOT / "smartclient" / "amqp" / "_pika.py"


# -- the lists, entry by entry -------------------------------------------------------------------------
@pytest.mark.parametrize("entry", PIKA_INTERNALS)
def test_every_private_name_of_pika_the_seam_relies_on_exists(entry: str) -> None:
    owner, name = entry.rsplit(".", 1)
    if name in INSTANCE_ATTRIBUTES:  # set by the owner (its __init__, or the state it sets up), not a method
        assert f"self.{name} = " in inspect.getsource(resolve_path(owner)), entry
    else:
        assert callable(resolve_path(entry)), entry


#: the entries of PIKA_INTERNALS that are instance attributes (the rest are methods)
INSTANCE_ATTRIBUTES = {"_impl", "_transport", "_sock"}


def test_a_new_token_goes_through_the_connections_io_loop() -> None:
    """PIKA_INTERNALS: update-secret is sent from the I/O loop, which runs callbacks handed to it while any
    blocking call (a publish too) flushes; BlockingConnection's own add_callback_threadsafe would wait for
    process_data_events."""
    blocking = inspect.getsource(pika.BlockingConnection.add_callback_threadsafe)
    assert "self._impl._adapter_add_callback_threadsafe(" in blocking
    assert "call_later(0" in inspect.getsource(pika.BlockingConnection._on_threadsafe_callback)
    flush = inspect.getsource(pika.BlockingConnection._flush_output)
    assert "self._impl.ioloop.poll()" in flush and "self._impl.ioloop.process_timeouts()" in flush
    assert "update_secret" in vars(pika.connection.Connection)


def test_a_failed_connect_raises_the_last_attempts_own_error() -> None:
    """PIKA_INTERNALS: BlockingConnection._reap_last_connection_workflow_error unwraps the TLS phase's error, so
    that a certificate that does not verify reaches pika_errors as ssl.SSLCertVerificationError."""
    reap = "pika.adapters.blocking_connection.BlockingConnection._reap_last_connection_workflow_error"
    assert reap in PIKA_INTERNALS
    source = inspect.getsource(resolve_path(reap))
    assert "error.exceptions[-1]" in source and "AMQPConnectorPhaseErrorBase" in source
    assert "error = error.exception" in source
    assert "_reap_last_connection_workflow_error(" in inspect.getsource(pika.BlockingConnection._create_connection)


@pytest.mark.parametrize("path", PIKA_NAMES)
def test_every_public_name_the_wing_uses_exists(path: str) -> None:
    assert resolve_path(path) is not None


@pytest.mark.parametrize("entry", sorted(PIKA_SIGNATURES))
def test_every_signature_the_wing_relies_on(entry: str) -> None:
    fn = resolve_path(entry)
    have = parameters(fn)
    missing = set(PIKA_SIGNATURES[entry]) - set(have)
    assert not missing, f"pika's {entry}{inspect.signature(fn)} lost {sorted(missing)}"


def test_the_lists_name_every_private_pika_name_the_seam_touches() -> None:
    listed = {e.rsplit(".", 1)[1] for e in PIKA_INTERNALS}
    touched = private_names_used_in(SEAM)
    assert touched <= listed, f"the seam touches pika's {sorted(touched - listed)}: add them to PIKA_INTERNALS"


# -- the one error mapping ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("raised", "error", "message"), [
    (px.ProbableAuthenticationError("ACCESS_REFUSED"), AuthenticationFailed, "refused the credentials"),
    (px.ProbableAccessDeniedError(530, "NOT_ALLOWED"), AuthenticationFailed, "no access to vhost 'v'"),
    # pika's guess from a socket cut in the handshake (its repr of the StreamLostError): a connection failure
    (px.ProbableAuthenticationError("StreamLostError: ('Transport indicated EOF',)"), ConnectionFailed,
     "cut during the handshake"),
    (px.ProbableAccessDeniedError("StreamLostError: (\"Stream connection lost: ConnectionResetError(104)\",)"),
     ConnectionFailed, "cut during the handshake"),
    (px.UnroutableError([]), PublishFailed, "returned the message"),
    (px.NackError([]), PublishFailed, "basic.nack"),
    (px.ChannelClosedByBroker(404, "NOT_FOUND - no queue"), ConnectionFailed, r"channel was closed \(404 NOT_FOUND"),
    (px.ConnectionClosedByBroker(320, "CONNECTION_FORCED"), ConnectionFailed, r"connection was closed \(320 "),
    # the broker's words about tokens (4.3.6; 4.0.5 refuses a channel's work instead of closing)
    (px.ConnectionClosedByBroker(320, "CONNECTION_FORCED - credential expired"), TokenExpired,
     "the token it logged in with expired"),
    (px.ConnectionClosedByBroker(530, "NOT_ALLOWED - New secret was refused by one of the backends"), TokenRefused,
     "refused the new token"),
    (px.ChannelClosedByBroker(403, "ACCESS_REFUSED - ... Provided JWT token has expired at timestamp 1"),
     TokenExpired, "has expired"),
    (px.StreamLostError("Transport indicated EOF"), ConnectionFailed, "StreamLostError: Transport indicated EOF"),
    (px.AMQPConnectionError("boom"), ConnectionFailed, "AMQPConnectionError"),
    (ssl.SSLCertVerificationError(1, "certificate verify failed"), CertificateRejected, "AMQP over TLS"),
    (ConnectionResetError(104, "reset"), ConnectionFailed, "ConnectionResetError"),
])
def test_pika_errors_maps_onto_the_tree_and_chains(raised: BaseException, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message) as caught, pika_errors("doing x", vhost="v"):
        raise raised
    assert caught.value.__cause__ is raised
    assert str(caught.value).startswith("doing x")


def test_pika_errors_lets_the_caller_say_what_a_returned_message_means_and_keeps_callback_errors() -> None:
    with pytest.raises(NoRpcServer, match="nobody on n1") as caught, \
            pika_errors("publishing", returned=lambda: NoRpcServer("nobody on n1", "n1")):
        raise px.UnroutableError([])
    assert caught.value.node == "n1" and isinstance(caught.value.__cause__, px.UnroutableError)
    mine = OSError("the callback's own disk is full")
    with pytest.raises(OSError) as raw, pika_errors("reading", callbacks=True):
        raise mine
    assert raw.value is mine
    with pytest.raises(ValueError, match="not pika's"), pika_errors("reading"):
        raise ValueError("not pika's")


def test_a_connect_to_a_closed_port_is_connection_failed() -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(ConnectionFailed, match=f"connecting to 127.0.0.1:{port}") as caught:
        open_connection(Address("127.0.0.1", port), name="seam-test", login=Login("PLAIN", "guest", "guest"),
                        vhost="/", heartbeat=60, tls=None)
    assert isinstance(caught.value.__cause__, px.AMQPError)


def test_a_certificate_that_does_not_verify_is_certificate_rejected() -> None:
    server_context, client_context = tls_contexts("node-1.example")
    listener = FakeBroker(connack=None, tls=server_context)
    try:
        with pytest.raises(CertificateRejected, match=r"AMQP over TLS.*not valid for '127\.0\.0\.1'") as caught:
            open_connection(listener.address, name="seam-test", login=Login("PLAIN", "guest", "guest"), vhost="/",
                            heartbeat=60, tls=client_context)
        assert isinstance(caught.value.__cause__, ssl.SSLCertVerificationError)
    finally:
        listener.close()


# -- nobody else reaches into pika -------------------------------------------------------------------------
def test_only_the_seam_imports_pika() -> None:
    assert imports_of("pika", SEAM) == []


def test_only_the_seam_touches_pikas_private_names() -> None:
    names = {e.rsplit(".", 1)[1] for e in PIKA_INTERNALS}
    assert private_uses(names, SEAM, set()) == []


class _Channel:
    def __init__(self, on_open: Any) -> None:
        self.is_open, self.is_closed, self.on_open, self.on_qos = False, False, on_open, None
        self.declares: list[tuple[str, Any]] = []
        self.on_close: Any = None

    def basic_qos(self, prefetch_count: int, callback: Any) -> None:
        self.on_qos = callback

    def queue_declare(self, queue: str, passive: bool, callback: Any) -> None:
        assert passive
        self.declares.append((queue, callback))

    def add_on_close_callback(self, callback: Any) -> None:
        self.on_close = callback

    def _set_cookie(self, cookie: Any) -> None:
        self.cookie = cookie


class _Impl:
    """The few things of pika's Connection the silence watch uses."""

    def __init__(self) -> None:
        self.is_open, self.bytes_received, self.timers, self.ended = True, 0, 0, None
        self.channels: list[_Channel] = []
        self.on_blocked: Any = None

    def add_on_connection_blocked_callback(self, cb: Any) -> None:
        self.on_blocked = cb

    def add_on_connection_unblocked_callback(self, cb: Any) -> None:
        pass

    def _adapter_call_later(self, delay: float, callback: Any) -> None:
        self.timers += 1

    def _terminate_stream(self, error: Exception) -> None:
        self.ended = error

    def _send_method(self, channel_number: int, method: Any, content: Any = None) -> None:
        pass

    def _process_frame(self, value: Any) -> None:
        pass

    def channel(self, on_open_callback: Any) -> _Channel:
        self.channels.append(_Channel(on_open_callback))
        return self.channels[-1]


def _watched(monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], _Impl, SilenceWatch]:
    clock = [1000.0]
    monkeypatch.setattr("smartclient.amqp._pika.time.monotonic", lambda: clock[0])
    impl = _Impl()
    watch = SilenceWatch(impl, 10.0)
    watch.start()
    return clock, impl, watch


def _seconds(clock: list[float], watch: SilenceWatch, n: int, hear: Callable[[int], None] = lambda s: None) -> None:
    for second in range(1, n + 1):  # a look a second
        clock[0] += 1
        hear(second)
        watch.look()


def test_the_silence_watch_asks_after_a_third_and_ends_a_silent_connection_within_dead_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock, impl, watch = _watched(monkeypatch)
    assert impl.timers == 1
    _seconds(clock, watch, 3)  # a third of dead_after: the first question is a channel of its own
    assert len(impl.channels) == 1 and watch.probes == 1
    impl.bytes_received += 20  # its answer
    impl.channels[0].is_open = True
    impl.channels[0].on_open(impl.channels[0])
    _seconds(clock, watch, 4)  # heard at the next look, then silent again for a third: basic.qos on it
    assert watch.probes == 2 and impl.channels[0].on_qos is not None
    _seconds(clock, watch, 4)  # no answer, nothing heard
    assert impl.ended is None
    _seconds(clock, watch, 1)  # 8 s of silence: a look a second (which may come late) finds it within dead_after
    assert isinstance(impl.ended, px.AMQPHeartbeatTimeout) and "heard nothing for 8.0 s" in str(impl.ended)


def test_an_unanswered_question_ends_a_connection_that_still_hears_the_nodes_heartbeat(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A link cut one way toward the node: the node's next heartbeat still comes, the answer never does."""
    clock, impl, watch = _watched(monkeypatch)
    _seconds(clock, watch, 5, hear=lambda s: setattr(impl, "bytes_received", impl.bytes_received + 8 * (s == 5)))
    assert watch.probes == 1 and impl.ended is None  # asked at 3 s; the node's heartbeat came at 5 s
    _seconds(clock, watch, 2)
    assert impl.ended is None
    _seconds(clock, watch, 1)
    assert isinstance(impl.ended, px.AMQPHeartbeatTimeout) and "no answer for 5.0 s" in str(impl.ended)


def test_the_silence_watch_keeps_a_connection_that_hears_or_was_not_looked_at_or_is_blocked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock, impl, watch = _watched(monkeypatch)
    _seconds(clock, watch, 30, hear=lambda s: setattr(impl, "bytes_received", impl.bytes_received + 8))
    assert impl.ended is None and watch.probes == 0  # something every second: never asked, never ended
    clock[0] += 20  # the thread was elsewhere for 20 s: what came meanwhile is not read yet
    watch.look()
    assert impl.ended is None
    impl.on_blocked(None, None)  # a resource alarm: the broker reads nothing, pika's blocked timeout judges
    _seconds(clock, watch, 30)
    assert impl.ended is None
    impl.is_open = False
    timers = impl.timers
    watch.look()  # closed: the watch ends
    assert impl.timers == timers


def test_a_late_look_starts_the_count_again_only_when_something_waits_unread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy machine wakes the loop late: with nothing waiting in the socket, the silence still counts (a partition
    run found a one-way drop at 11.5 s when every late look started it again); with bytes waiting, it starts again."""
    import socket
    from types import SimpleNamespace

    clock, impl, watch = _watched(monkeypatch)
    ours, peer = socket.socketpair()
    with ours, peer:
        impl._transport = SimpleNamespace(_sock=ours)  # type: ignore[attr-defined]
        _seconds(clock, watch, 3)  # asked at 3 s
        clock[0] += 3  # a look 3 s late, nothing came
        watch.look()
        assert impl.ended is None and watch.question is not None  # the question asked stays
        _seconds(clock, watch, 2)  # unanswered 5 s: ended on time, late look or not
        assert isinstance(impl.ended, px.AMQPHeartbeatTimeout) and "no answer for 5.0 s" in str(impl.ended)

        # an idle connection the application left alone 20 s: nothing came (its broker sends nothing for up to
        # half its heartbeat) and nothing was asked meanwhile: not ended, asked now
        clock, impl, watch = _watched(monkeypatch)
        impl._transport = SimpleNamespace(_sock=ours)  # type: ignore[attr-defined]
        _seconds(clock, watch, 2, hear=lambda s: setattr(impl, "bytes_received", impl.bytes_received + 8))
        clock[0] += 20
        watch.look()
        assert impl.ended is None and watch.probes == 1 and watch.question == clock[0]

        clock, impl, watch = _watched(monkeypatch)
        impl._transport = SimpleNamespace(_sock=ours)  # type: ignore[attr-defined]
        _seconds(clock, watch, 6)
        peer.send(b"\x08" * 8)  # the node's heartbeat, not read yet
        clock[0] += 3
        watch.look()
        _seconds(clock, watch, 5)
        assert impl.ended is None and watch.heard == clock[0] - 5  # counted again from the late look


def test_the_watchs_channel_is_skipped_by_blocking_connections_close_and_dispatch() -> None:
    """PIKA_INTERNALS: BlockingConnection.close() closes each open channel through its cookie (the BlockingChannel)
    before it closes the connection, and dispatches events through it: the watch's channel, which has none, gets a
    cookie that is not open and has nothing to dispatch."""
    from smartclient.amqp._pika import _ProbeCookie

    close = inspect.getsource(pika.BlockingConnection.close)
    assert "impl_channel._get_cookie()" in close and "if channel.is_open:" in close
    assert "_get_cookie()._dispatch_events()" in inspect.getsource(pika.BlockingConnection._dispatch_channel_events)
    connection = type("C", (), {"callbacks": pika.callback.CallbackManager()})()
    channel = pika.channel.Channel(connection, 1, lambda ch: None)
    channel._set_cookie(_ProbeCookie())
    assert channel._get_cookie().is_open is False
    channel._get_cookie()._dispatch_events()


# -- the queue watch: a node cut off from its queues' leaders (a partition's minority) ------------------------
def _method(channel: int, method: Any) -> Any:
    return pika.frame.Method(channel, method)


def test_a_publish_with_no_confirm_for_the_limit_ends_a_connection_that_hears_its_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node in a minority answers basic.qos and sends heartbeats, but confirms nothing: the queue watch ends the
    connection once a publish waited dead_after - 2 s with no confirm, never while confirms come, nor while the
    broker blocks the connection (a resource alarm)."""
    from smartclient.amqp._pika import NodeCutOff

    clock, impl, watch = _watched(monkeypatch)
    hear = lambda s: setattr(impl, "bytes_received", impl.bytes_received + 8)  # noqa: E731
    impl._send_method(1, pika.spec.Confirm.Select())
    for second in range(30):  # publishes confirmed a second later: never ended
        impl._send_method(1, pika.spec.Basic.Publish(routing_key="q"), (None, b"x"))
        _seconds(clock, watch, 1, hear)
        impl._process_frame(_method(1, pika.spec.Basic.Ack(second + 1, multiple=False)))
    assert impl.ended is None
    impl._send_method(1, pika.spec.Basic.Publish(routing_key="q"), (None, b"x"))
    impl._send_method(1, pika.spec.Basic.Publish(routing_key="q"), (None, b"x"))
    impl._process_frame(_method(1, pika.spec.Basic.Ack(31, multiple=True)))  # one of the two
    _seconds(clock, watch, 7, hear)
    assert impl.ended is None
    _seconds(clock, watch, 1, hear)
    assert isinstance(impl.ended, NodeCutOff) and "no confirm for 8.0 s with 1 message(s) pending" in str(impl.ended)

    clock, impl, watch = _watched(monkeypatch)
    impl._send_method(1, pika.spec.Confirm.Select())
    impl._send_method(1, pika.spec.Basic.Publish(routing_key="q"), (None, b"x"))
    impl.on_blocked(None, None)
    _seconds(clock, watch, 30, hear)
    assert impl.ended is None  # blocked: pika's blocked_connection_timeout judges
    impl._process_frame(_method(1, pika.spec.Channel.Close(406, "PRECONDITION_FAILED")))  # its channel goes
    watch.blocked = False
    _seconds(clock, watch, 30, hear)
    assert impl.ended is None


def _consuming(monkeypatch: pytest.MonkeyPatch, baseline: int) -> tuple[list[float], _Impl, SilenceWatch]:
    """A connection consuming queue q: the watch asks for the baseline (its channel opens, then a passive declare),
    answered with ``baseline`` consumers, while deliveries come every second."""
    clock, impl, watch = _watched(monkeypatch)
    impl._send_method(1, pika.spec.Basic.Consume(queue="q", consumer_tag="ctag1"))
    _seconds(clock, watch, 1)
    assert len(impl.channels) == 1  # the watch's channel: its channel.open is the question
    channel = impl.channels[0]
    channel.is_open = True
    channel.on_open(channel)
    _seconds(clock, watch, 1)
    assert [q for q, _ in channel.declares] == ["q"]  # the baseline, at once, though deliveries come
    channel.declares.pop()[1](SimpleNamespace(method=SimpleNamespace(consumer_count=baseline, message_count=0)))
    return clock, impl, watch


def _deliveries(impl: _Impl) -> Callable[[int], None]:
    def deliver(second: int) -> None:
        impl.bytes_received += 100
        impl._process_frame(_method(1, pika.spec.Basic.Deliver("ctag1", second, False, "", "q")))
    return deliver


def test_a_consumed_queue_that_stops_counting_its_consumers_ends_the_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """RabbitMQ 4.3.6, measured: a node cut off from a quorum queue's leader answers a passive declare at once with
    0 consumers (it asks the leader for 250 ms), where the leader counts this connection's.  Once nothing was
    delivered for a third of dead_after, the watch asks; a 0 after a count is asked again at each look (a leader
    busy for 250 ms answers 0 too), and 0s for 4 s in a row end the connection."""
    from smartclient.amqp._pika import NodeCutOff

    clock, impl, watch = _consuming(monkeypatch, baseline=1)
    channel = impl.channels[0]
    _seconds(clock, watch, 20, _deliveries(impl))
    assert not channel.declares  # deliveries come: nothing asked
    hear = lambda s: setattr(impl, "bytes_received", impl.bytes_received + 8)  # noqa: E731

    def answer(consumers: int) -> None:
        assert [q for q, _ in channel.declares] == ["q"]
        channel.declares.pop()[1](SimpleNamespace(method=SimpleNamespace(consumer_count=consumers, message_count=0)))

    _seconds(clock, watch, 2, hear)
    assert not channel.declares
    _seconds(clock, watch, 1, hear)  # nothing delivered for 3 s: asked
    answer(1)
    _seconds(clock, watch, 3, hear)  # idle, still counted: asked again, a third later
    answer(0)  # a leader busy for 250 ms, say
    _seconds(clock, watch, 1, hear)  # asked again at the next look
    answer(1)
    _seconds(clock, watch, 3, hear)
    for _ in range(5):  # 0 at each look: ended once they span 4 s
        assert impl.ended is None
        answer(0)
        _seconds(clock, watch, 1, hear)
    assert isinstance(impl.ended, NodeCutOff) and "queue 'q' answered 0 consumers on this node for 4.0 s" in str(
        impl.ended)


def test_a_stream_which_never_counts_consumers_and_a_cancelled_or_deleted_queue_are_not_judged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock, impl, watch = _consuming(monkeypatch, baseline=0)  # a stream answers 0 consumers, always
    channel = impl.channels[0]
    hear = lambda s: setattr(impl, "bytes_received", impl.bytes_received + 8)  # noqa: E731
    for _ in range(10):
        _seconds(clock, watch, 3, hear)
        for _q, answer in channel.declares:
            answer(SimpleNamespace(method=SimpleNamespace(consumer_count=0, message_count=0)))
        channel.declares.clear()
    assert impl.ended is None

    clock, impl, watch = _consuming(monkeypatch, baseline=1)
    channel = impl.channels[0]
    _seconds(clock, watch, 3, hear)
    channel.on_close(channel, px.ChannelClosedByBroker(404, "NOT_FOUND"))  # deleted meanwhile: the answer
    assert watch.question is None and watch.channel is None and watch.queues.skipped == {"q"}
    impl._process_frame(_method(1, pika.spec.Basic.Cancel("ctag1")))  # the broker cancels its consumer
    _seconds(clock, watch, 30, hear)
    assert impl.ended is None


def test_a_node_found_cut_off_by_another_wing_ends_the_connection_at_its_next_look(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer on a node cut from its peers hears the node and has nothing to compare: another wing's finding
    (the placer's CutOffNodes) ends it as the queue watch would, at the next look; a finding before it was placed
    does not."""
    from smartclient.amqp._pika import WATCHES, NodeFoundCutOff, watch_cut_off
    from smartclient.core.broker_nodes import CutOffNodes

    clock, impl, watch = _watched(monkeypatch)
    cut = CutOffNodes(clock=lambda: clock[0])
    connection = _Channel(None)  # (any object the watches are kept by)
    WATCHES[connection] = watch
    watch_cut_off(connection, lambda: cut.ends("a@h", 1000.0))
    hear = lambda s: setattr(impl, "bytes_received", impl.bytes_received + 8)  # noqa: E731
    _seconds(clock, watch, 5, hear)
    assert impl.ended is None
    cut.found("a@h", "the PUBACK watch of MQTT client m")
    _seconds(clock, watch, 1, hear)
    # (a NodeCutOff, as its own queue watch's, but marked: the placer does not record it as a finding of its own)
    assert isinstance(impl.ended, NodeFoundCutOff) and "by the PUBACK watch of MQTT client m" in str(impl.ended)

    clock, impl, watch = _watched(monkeypatch)  # (its clock starts at 1000 again: the finding was at 1006)
    WATCHES[connection] = watch
    clock[0] = placed = 1010.0
    watch_cut_off(connection, lambda: cut.ends("a@h", placed))  # placed after the finding: kept
    _seconds(clock, watch, 5, hear)
    assert impl.ended is None

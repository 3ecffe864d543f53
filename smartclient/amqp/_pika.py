"""The one seam between smartclient and pika.

Only this module imports pika, and only here do pika's exceptions become smartclient's errors
(:func:`pika_errors`).  The AMQP wing (``placement.py``, ``rpc.py``, ``streams.py``) opens connections with
:func:`open_connection`, builds message properties with :func:`basic_properties`, and runs every call into
pika inside :func:`pika_errors`.

The wing touches no private attribute of pika; what this module relies on is listed in :data:`PIKA_INTERNALS` (the
error mapping's, the I/O loop a refreshed token takes (:func:`update_secret`), the silence and queue watches' timer,
frames and end (:class:`SilenceWatch`, :class:`QueueWatch`)), :data:`PIKA_NAMES` (public names used) and
:data:`PIKA_SIGNATURES` (parameters passed to pika's callables, here and on the channels the wing drives).
``tests/unit/test_pika_seam.py`` checks every entry against the installed pika and greps the library for
pika imports outside this file; ``pyproject.toml`` pins pika below 1.5.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import ssl
import struct
import termios
import time
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pika
import pika.credentials
import pika.exceptions as px
from pika import BlockingConnection

from smartclient import keepalive
from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConnectionFailed,
    PublishFailed,
    SmartClientError,
    TokenExpired,
    TokenRefused,
)
from smartclient.amqp.queue_watch import QueueWatch
from smartclient.core.address import Address
from smartclient.core.relogin import certificate_alert
from smartclient.credentials import Login

__all__ = [
    "DECLARE_WITHIN",
    "PIKA_INTERNALS",
    "PIKA_NAMES",
    "PIKA_SIGNATURES",
    "BlockingConnection",
    "NodeCutOff",
    "NodeFoundCutOff",
    "basic_properties",
    "close_quietly",
    "open_connection",
    "pika_errors",
    "update_secret",
    "watch_close",
    "watch_cut_off",
]

log = logging.getLogger(__name__)

#: Every private attribute or method of pika the seam touches or relies on.
PIKA_INTERNALS: tuple[str, ...] = (
    # relied on, not called: a connect that fails in the TLS handshake raises the ssl error itself (it
    # unwraps AMQPConnectorTransportSetupError.exception), so a certificate that does not verify is
    # recognised as ssl.SSLCertVerificationError
    "pika.adapters.blocking_connection.BlockingConnection._reap_last_connection_workflow_error",
    # a refreshed token goes to the connection's I/O loop, not to BlockingConnection's event dispatch:
    # BlockingConnection.add_callback_threadsafe runs its callbacks only in process_data_events() and
    # start_consuming(), never while the thread publishes, so a publisher would keep its old token until the
    # broker closed it at expiry.  The loop runs during every blocking call (a publish, its confirm, a
    # declare, process_data_events), and there update-secret is sent without waiting for its answer.
    "pika.adapters.blocking_connection.BlockingConnection._impl",  # the asynchronous connection underneath
    "pika.connection.Connection._adapter_add_callback_threadsafe",  # a call on the I/O loop's thread, from any
    # the silence watch (SilenceWatch): a look every second on the connection's own I/O loop (it runs while the
    # thread is in a pika call), a probe on a channel of its own, and the end of a silent connection as pika's
    # heartbeat checker ends one (the stream aborted with AMQPHeartbeatTimeout)
    "pika.connection.Connection._adapter_call_later",
    "pika.connection.Connection._terminate_stream",
    # its channel is pika's, with no BlockingChannel: BlockingConnection.close() and its event dispatch read the
    # channel's cookie (_ProbeCookie stands in: not open, no events)
    "pika.channel.Channel._set_cookie",
    "pika.adapters.blocking_connection.BlockingChannel._dispatch_events",
    # a look that comes late asks the socket whether anything waits unread (FIONREAD): only then can it not judge
    "pika.adapters.base_connection.BaseConnection._transport",
    "pika.adapters.utils.io_services_utils._AsyncTransportBase._sock",
    # the queue watch (QueueWatch) reads the methods going out (every channel sends through the connection's
    # _send_method) and coming in (every frame passes _process_frame, the confirms too: they go to callbacks)
    "pika.connection.Connection._send_method",
    "pika.connection.Connection._process_frame",
)

#: Every public name of pika the AMQP wing uses, as a module path.
PIKA_NAMES: tuple[str, ...] = (
    "pika.BlockingConnection",
    "pika.ConnectionParameters",
    "pika.PlainCredentials",
    "pika.credentials.ExternalCredentials",
    "pika.SSLOptions",
    "pika.BasicProperties",
    "pika.adapters.blocking_connection.BlockingChannel",
    "pika.exceptions.AMQPError",
    "pika.exceptions.ProbableAuthenticationError",
    "pika.exceptions.ProbableAccessDeniedError",
    "pika.exceptions.UnroutableError",
    "pika.exceptions.NackError",
    "pika.exceptions.ChannelClosed",
    "pika.exceptions.ConnectionClosed",
    "pika.exceptions.ConnectionWrongStateError",
    "pika.connection.Connection.update_secret",
    "pika.connection.Connection.add_on_close_callback",
    "pika.connection.Connection.add_on_connection_blocked_callback",
    "pika.connection.Connection.add_on_connection_unblocked_callback",
    "pika.connection.Connection.channel",
    "pika.channel.Channel.add_on_close_callback",
    "pika.channel.Channel.basic_qos",
    "pika.channel.Channel.queue_declare",
    "pika.exceptions.AMQPHeartbeatTimeout",
    "pika.frame.Method",
    # the queue watch (smartclient.amqp.queue_watch) reads the methods by their NAME and fields
    "pika.spec.Basic.Publish.NAME",
    "pika.spec.Basic.Ack.NAME",
    "pika.spec.Basic.Nack.NAME",
    "pika.spec.Basic.Consume.NAME",
    "pika.spec.Basic.Cancel.NAME",
    "pika.spec.Basic.Deliver.NAME",
    "pika.spec.Confirm.Select.NAME",
    "pika.spec.Channel.Close.NAME",
    "pika.spec.Channel.CloseOk.NAME",
)

#: The parameters the AMQP wing passes to pika's callables (a subset of each signature).
PIKA_SIGNATURES: dict[str, tuple[str, ...]] = {
    "pika.ConnectionParameters.__init__": (
        "host", "port", "virtual_host", "credentials", "heartbeat", "client_properties", "ssl_options",
        "connection_attempts", "socket_timeout", "blocked_connection_timeout",
    ),
    "pika.PlainCredentials.__init__": ("username", "password"),
    "pika.SSLOptions.__init__": ("context", "server_hostname"),
    "pika.BasicProperties.__init__": ("headers", "correlation_id", "reply_to", "delivery_mode"),
    "pika.BlockingConnection.__init__": ("parameters",),
    "pika.BlockingConnection.channel": ("self",),
    "pika.BlockingConnection.close": ("self",),
    "pika.BlockingConnection.process_data_events": ("time_limit",),
    "pika.connection.Connection.update_secret": ("new_secret", "reason", "callback"),
    "pika.connection.Connection.add_on_close_callback": ("callback",),
    "pika.connection.Connection._adapter_add_callback_threadsafe": ("callback",),
    "pika.connection.Connection._adapter_call_later": ("delay", "callback"),
    "pika.connection.Connection._terminate_stream": ("error",),
    "pika.connection.Connection.channel": ("on_open_callback",),
    "pika.channel.Channel.basic_qos": ("prefetch_count", "callback"),
    "pika.channel.Channel.queue_declare": ("queue", "passive", "callback"),
    "pika.adapters.blocking_connection.BlockingChannel.basic_publish": (
        "exchange", "routing_key", "body", "properties", "mandatory",
    ),
    "pika.adapters.blocking_connection.BlockingChannel.basic_consume": (
        "queue", "on_message_callback", "auto_ack", "arguments",
    ),
    "pika.adapters.blocking_connection.BlockingChannel.basic_qos": ("prefetch_count", "global_qos"),
    "pika.adapters.blocking_connection.BlockingChannel.basic_ack": ("delivery_tag",),
    "pika.adapters.blocking_connection.BlockingChannel.queue_declare": (
        "queue", "durable", "exclusive", "auto_delete", "arguments",
    ),
    "pika.adapters.blocking_connection.BlockingChannel.queue_bind": ("queue", "exchange", "routing_key"),
    "pika.adapters.blocking_connection.BlockingChannel.exchange_declare": ("exchange", "exchange_type", "durable"),
    "pika.adapters.blocking_connection.BlockingChannel.confirm_delivery": ("self",),
    "pika.adapters.blocking_connection.BlockingChannel.start_consuming": ("self",),
    "pika.adapters.blocking_connection.BlockingChannel.stop_consuming": ("self",),
}


@contextlib.contextmanager
def pika_errors(
    where: str,
    *,
    vhost: str | None = None,
    returned: Callable[[], SmartClientError] | None = None,
    callbacks: bool = False,
) -> Iterator[None]:
    """Run pika calls, raising smartclient's errors instead of pika's (``raise ... from exc``).  The one
    place where they are mapped.

    :param where: what was being done, for the message (``connecting to h:5672``).
    :param vhost: the vhost connected to, for the message when access to it is denied.
    :param returned: the error a message the broker returned (``mandatory``, nothing bound) means to the
        caller; :class:`PublishFailed` if None.
    :param callbacks: True around calls that run the caller's own callbacks (``process_data_events``,
        ``start_consuming``): an ``OSError`` raised there is theirs and passes through unchanged.
    :raises AuthenticationFailed: the broker refused the credentials, or access to the vhost.
    :raises CertificateRejected: the server's TLS certificate does not verify for the name checked.
    :raises PublishFailed: the broker returned or nacked a message (unless ``returned`` says otherwise).
    :raises ConnectionFailed: the connection or channel could not be opened or was closed (by the broker,
        with its reply code and text), or the socket failed.
    """
    try:
        try:
            yield
        except (px.AMQPError, OSError) as exc:  # the broker refused the client certificate: pika passes its alert
            if not callbacks and (alert := certificate_alert(str(exc))) is not None:  # on inside another error
                raise CertificateRejected(f"{where} (AMQP over TLS): the broker refused the client certificate "
                                          f"({alert}): {exc}") from exc
            raise
    except SmartClientError:
        raise
    except (px.ProbableAuthenticationError, px.ProbableAccessDeniedError) as exc:
        # pika guesses these from the stage at which the connection ended; only the broker's own Close says
        # so.  A socket cut in the handshake (an LB that restarts, a node that stops) is a connection failure,
        # which is retried, and not refused credentials, which stop a retrying RPC server for good.
        if "StreamLostError" in str(exc):
            raise ConnectionFailed(f"{where}: the connection was cut during the handshake ({exc})") from exc
        if isinstance(exc, px.ProbableAccessDeniedError):
            raise AuthenticationFailed(f"{where}: no access to vhost {vhost!r}") from exc
        raise AuthenticationFailed(f"{where}: the broker refused the credentials") from exc
    except px.UnroutableError as exc:
        if returned is not None:
            raise returned() from exc
        raise PublishFailed(f"{where}: the broker returned the message: nothing is bound to take it") from exc
    except px.NackError as exc:
        raise PublishFailed(f"{where}: the broker refused the message (basic.nack)") from exc
    except px.ChannelClosed as exc:
        if exc.reply_code == 403 and _TOKEN_EXPIRED in str(exc.reply_text):  # 4.0: the connection stays, refused
            raise TokenExpired(f"{where}: the broker refused the channel's work: the token the connection logged "
                               f"in with has expired ({exc.reply_code} {exc.reply_text})") from exc
        raise ConnectionFailed(f"{where}: the channel was closed ({exc.reply_code} {exc.reply_text})") from exc
    except px.ConnectionClosed as exc:
        raise closed_error(where, exc.reply_code, exc.reply_text) from exc
    except px.AMQPError as exc:
        raise ConnectionFailed(f"{where}: {type(exc).__name__}: {exc}") from exc
    except ssl.SSLCertVerificationError as exc:
        if callbacks:
            raise
        reason = getattr(exc, "verify_message", None) or exc
        raise CertificateRejected(f"{where} (AMQP over TLS): {reason}") from exc
    except OSError as exc:  # raised as is by a connect that fails in the TLS handshake
        if callbacks:
            raise
        raise ConnectionFailed(f"{where}: {type(exc).__name__}: {exc}") from exc


#: what RabbitMQ says when it closes a connection whose token expired (4.3: 320 CONNECTION_FORCED), refuses a
#: token update-secret carried (530 NOT_ALLOWED, and 4.0.5 541 INTERNAL_ERROR for a token signed by a key it does
#: not trust), or refuses a channel's work on 4.0.5, which keeps the connection of an expired token open
_CREDENTIAL_EXPIRED = "credential expired"
_SECRET_REFUSED = "secret was refused"
_TOKEN_EXPIRED = "token has expired"


def closed_error(where: str, code: int, text: str) -> ConnectionFailed:
    """The error a connection the broker closed with ``code`` and ``text`` means: :class:`TokenExpired` (its
    token expired), :class:`TokenRefused` (it refused a new token), else :class:`ConnectionFailed`."""
    if _CREDENTIAL_EXPIRED in str(text):
        return TokenExpired(f"{where}: the broker closed the connection: the token it logged in with expired "
                            f"({code} {text})")
    if _SECRET_REFUSED in str(text):
        return TokenRefused(f"{where}: the broker refused the new token and closed the connection ({code} {text})")
    return ConnectionFailed(f"{where}: the connection was closed ({code} {text})")


def open_connection(
    dialled: Address,
    *,
    name: str,
    login: Login,
    vhost: str,
    heartbeat: int,
    tls: ssl.SSLContext | None,
    tls_name: str | None = None,
    dead_after: float = 0.0,
) -> BlockingConnection:
    """A pika ``BlockingConnection`` to ``dialled``, named ``name`` (its client-provided
    ``connection_name``), one attempt, logging in as ``login`` says (PLAIN with a password or a token;
    EXTERNAL: the client certificate in ``tls`` is the identity), TLS verifying ``tls_name`` (what the
    resolution seam says; else the dialled host).  With ``dead_after``, a silent peer ends it within that many
    seconds (:mod:`smartclient.keepalive`; pika sets the options on its socket).

    :raises AuthenticationFailed, CertificateRejected, ConnectionFailed: see :func:`pika_errors`.
    """
    credentials: Any = (pika.credentials.ExternalCredentials() if login.mechanism == "EXTERNAL"
                        else pika.PlainCredentials(login.username, login.password))
    params = pika.ConnectionParameters(
        host=dialled.host, port=dialled.port, virtual_host=vhost,
        credentials=credentials,
        heartbeat=heartbeat, client_properties={"connection_name": name},
        ssl_options=pika.SSLOptions(tls, tls_name or dialled.host) if tls is not None else None,
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=30,
        tcp_options=keepalive.tcp_options(dead_after) or None,
    )
    with pika_errors(f"connecting to {dialled}", vhost=vhost):
        connection = BlockingConnection(params)
    if dead_after:
        watch = WATCHES[connection] = SilenceWatch(connection._impl, dead_after)
        watch.start()
    return connection


#: each open connection's silence watch (what it found: ``WATCHES[connection].queues.counted``, say)
WATCHES: weakref.WeakKeyDictionary[Any, SilenceWatch] = weakref.WeakKeyDictionary()


def watch_cut_off(connection: BlockingConnection, why: Callable[[], str | None]) -> None:
    """End ``connection`` as cut off (:class:`NodeFoundCutOff`) once ``why`` names what found its node cut off (asked at
    each look of its silence watch, if it has one)."""
    if (watch := WATCHES.get(connection)) is not None:
        watch.cut_off = lambda: (f"its node was found cut off since it was placed there, by {found}"
                                 if (found := why()) is not None else None)


class _ProbeCookie:
    """Where ``BlockingConnection`` keeps a channel's ``BlockingChannel`` (``Channel._set_cookie``), for the watch's
    channel: ``close()`` closes open ones first (this one goes with the connection), events go to those with some."""

    is_open = False

    def _dispatch_events(self) -> None:
        """Nothing: the watch's answers come through its callbacks."""


class NodeCutOff(px.AMQPHeartbeatTimeout):  # type: ignore[misc]  # (pika is untyped)
    """The end :class:`QueueWatch` gives a connection whose node cannot reach its queues' leaders."""


class NodeFoundCutOff(NodeCutOff):
    """The end given a connection whose node another connection (of any wing) found cut off since it was placed:
    not a finding of its own (see :func:`watch_cut_off`)."""


class SilenceWatch:
    """AMQP 0.9.1's silence watch: a connection that heard nothing for ``dead_after`` (two seconds less: it looks
    every second, on a loop that may look late) is ended as pika's heartbeat checker ends one
    (``AMQPHeartbeatTimeout``), whatever its heartbeat.  A ``BlockingConnection`` heartbeats only inside pika
    calls, so its heartbeat stays the user's (60 s: a shorter one would have the broker close a connection the
    application leaves idle), and the broker's come only every half of it: so once nothing came for a third of
    ``dead_after``, the watch asks the broker something (``basic.qos`` on a channel of its own, opened at the first
    probe: the ``channel.open`` is the first question), whose answer is the sign of life.  A question unanswered
    until that limit would have passed since it was asked ends the connection too, whatever came meanwhile: a link
    cut one way toward the node still brings the node's next heartbeat (or whatever it sent before its TCP
    stalled).

    It runs on the connection's I/O loop, which runs while the thread is in a pika call (a publish waiting for its
    confirm, ``process_data_events``, ``start_consuming``): so it finds a silent link while the application waits
    on it.  A look that comes late (the thread was elsewhere, or the machine too busy to wake it) starts the count
    again when something waits unread in the socket: what arrived meanwhile is a sign of life, and an answer may be
    among it (where the socket cannot say, it starts again, as it cannot judge).  With nothing unread, the silence
    counts as a third of ``dead_after`` at most (nobody asked the broker anything meanwhile: an idle connection's
    broker sends nothing for up to half its heartbeat), so it asks now, and a question already asked stays: a
    dead link is found within the answer's time.  A connection the broker
    blocked (a resource alarm: it reads nothing) is not judged: pika's ``blocked_connection_timeout`` ends it.  The
    cost: on a connection idle past a third of ``dead_after``, one ``basic.qos`` and its answer per third, and one
    channel."""

    STEP = 1.0

    def __init__(self, impl: Any, dead_after: float) -> None:
        self.impl = impl
        self.limit = dead_after - 2 * self.STEP  # looked at every step, on a loop that may look late: within it
        self.every = max(1.0, dead_after // 3)
        self.answer_within = max(2.0, self.limit - self.every)  # a question's answer (2 s at least: a busy broker)
        self.bytes = impl.bytes_received
        self.heard = self.looked = time.monotonic()
        self.question: float | None = None  # when the question not answered yet was asked
        self.blocked = False
        self.channel: Any = None
        self.probes = 0  #: questions asked (a channel opened, then basic.qos or a passive queue.declare)
        self.queues = QueueWatch(self.limit)  # its queues' leaders: confirms, consumers counted
        self.declaring: str | None = None  # the queue of the passive declare not answered yet
        #: what found the connection's node cut off since it was placed there (another wing, say), if anything
        self.cut_off: Callable[[], str | None] = lambda: None
        send, process = impl._send_method, impl._process_frame  # every method out, every frame in

        def sending(channel_number: int, method: Any, content: Any = None) -> None:
            self.queues.sent(channel_number, method)
            send(channel_number, method, content)

        def processing(value: Any) -> None:
            if isinstance(value, pika.frame.Method):
                self.queues.received(value.channel_number, value.method)
            process(value)

        impl._send_method, impl._process_frame = sending, processing

    def start(self) -> None:
        self.impl.add_on_connection_blocked_callback(lambda *_: setattr(self, "blocked", True))
        self.impl.add_on_connection_unblocked_callback(lambda *_: setattr(self, "blocked", False))
        self.impl._adapter_call_later(self.STEP, self.look)

    def look(self) -> None:
        if not self.impl.is_open:
            return
        now = time.monotonic()
        # late: the thread was not in a pika call, or was not woken (a busy machine)
        late = now - self.looked > 1.5 * self.STEP
        unread = late and _unread(self.impl)  # what came meanwhile waits unread: a sign of life, maybe the answer
        self.looked = now
        if unread or self.blocked:  # (a blocked broker reads nothing)
            self.question = None
        if unread or self.blocked or self.impl.bytes_received != self.bytes:
            self.bytes, self.heard = self.impl.bytes_received, now
        elif late:  # nothing came, but nothing was asked while it was away: ask now (a question asked stays)
            self.heard = max(self.heard, now - self.every)
        silent = now - self.heard
        unanswered = now - self.question if self.question is not None else 0.0
        if silent >= self.limit or unanswered >= self.answer_within:
            what = (f"heard nothing for {silent:.1f} s" if silent >= self.limit else
                    f"no answer for {unanswered:.1f} s to a question asked after {self.every:g} s of silence")
            log.warning("AMQP connection: %s (dead_after %g s): ending it", what, self.limit + 2 * self.STEP)
            self.impl._terminate_stream(px.AMQPHeartbeatTimeout(
                f"{what} (dead_after {self.limit + 2 * self.STEP:g} s)"))
            return
        stalled = None if self.blocked else self.queues.stalled(now)
        told = None if self.blocked or stalled is not None else self.cut_off()  # another's finding: not its own
        if (why := stalled or told) is not None:
            log.warning("AMQP connection: %s (dead_after %g s): ending it", why, self.limit + 2 * self.STEP)
            ending = NodeCutOff if stalled is not None else NodeFoundCutOff
            self.impl._terminate_stream(ending(f"{why} (dead_after {self.limit + 2 * self.STEP:g} s)"))
            return
        if self.question is None:
            queue = self.queues.to_ask(now, self.every)
            if queue is not None or silent >= self.every:
                self.question = now
                self.ask(queue)
        self.impl._adapter_call_later(self.STEP, self.look)

    def answered(self, *_: Any) -> None:
        self.question = None

    def ask(self, queue: str | None = None) -> None:
        """One question the broker answers: the channel's ``channel.open``, then ``basic.qos`` on it, or a passive
        ``queue.declare`` of ``queue`` (:class:`QueueWatch`: its answer counts the queue's consumers)."""
        self.probes += 1
        try:
            if self.channel is None:
                self.channel = self.impl.channel(on_open_callback=self.answered)
                self.channel._set_cookie(_ProbeCookie())  # where BlockingConnection looks for its own wrapper
                self.channel.add_on_close_callback(self.channel_closed)
            elif self.channel.is_open:
                if queue is None:
                    self.channel.basic_qos(prefetch_count=0, callback=self.answered)
                else:
                    self.channel.queue_declare(queue, passive=True, callback=partial(self.on_declared, queue))
                    self.declaring = queue
                    return
            else:  # (refused: a channel_max reached, or still opening) only silence is left to judge by
                self.question = None
                if self.channel.is_closed:
                    self.channel = None
        except (px.AMQPError, OSError) as exc:  # no channel free, a closing connection: silence alone is judged
            self.question = None
            log.debug("AMQP silence watch: asking the broker failed: %s", exc)
        if queue is not None:
            self.queues.unasked.insert(0, queue)  # asked at the next look, once the channel is open

    def on_declared(self, queue: str, frame: Any) -> None:
        self.answered()
        self.declaring = None
        self.queues.declared(queue, int(frame.method.consumer_count), time.monotonic())

    def channel_closed(self, *_: Any) -> None:
        """The watch's channel closed: an answer (the next question opens one).  A queue being declared then is not
        asked again (deleted meanwhile, or one no declare finds: ``amq.rabbitmq.reply-to``, 404)."""
        if self.declaring is not None:
            self.queues.skipped.add(self.declaring)
        self.question = self.declaring = None
        self.channel = None


def _unread(impl: Any) -> bool:
    """Whether bytes wait unread in ``impl``'s socket (True where the socket cannot say)."""
    sock = getattr(getattr(impl, "_transport", None), "_sock", None)
    try:
        return bool(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0])  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        return True


def update_secret(connection: Any, token: str, on_done: Callable[[], None]) -> bool:
    """Hand ``token`` to ``connection`` (AMQP 0.9.1's ``connection.update-secret``), from any thread; return
    False if it is closed.  The frame is sent from the connection's own I/O loop, which runs whenever its thread
    is in a blocking pika call (a publish and its confirm, a declare, ``process_data_events``,
    ``start_consuming``); ``on_done()`` is called there when the broker accepts it.  A broker that refuses the
    token closes the connection (530 NOT_ALLOWED; see :func:`closed_error` and :func:`watch_close`).
    """
    impl = connection._impl

    def send() -> None:
        if impl.is_open:
            impl.update_secret(token, "token refreshed", lambda frame: on_done())

    try:
        if not connection.is_open:
            return False
        impl._adapter_add_callback_threadsafe(send)
    except (px.ConnectionWrongStateError, AttributeError, RuntimeError, OSError) as exc:
        log.debug("handing a new token to a closing AMQP connection: %s", exc)
        return False
    return True


def watch_close(connection: Any, on_closed: Callable[[ConnectionFailed | None], None]) -> None:
    """Call ``on_closed(error)`` on the connection's thread when it closes: None if the application closed it,
    else what the close means (:func:`closed_error`)."""
    def closed(_impl: Any, reason: BaseException) -> None:
        if isinstance(reason, px.ConnectionClosedByClient):
            on_closed(None)
        elif isinstance(reason, px.ConnectionClosed):
            on_closed(closed_error("AMQP connection", reason.reply_code, reason.reply_text))
        else:  # (the cause says why: NodeCutOff, a node cut off from its queues' leaders)
            error = ConnectionFailed(f"AMQP connection lost: {type(reason).__name__}: {reason}")
            error.__cause__ = reason
            on_closed(error)

    connection._impl.add_on_close_callback(closed)


#: seconds a new connection's exclusive queue may take to be declared before its node is given up on: a healthy node
#: declares it within milliseconds (its metadata store's majority commits it), one in a partition's minority never
DECLARE_WITHIN = 2.0


def probe_node(connection: Any, node_of_queue: Callable[[str], str | None], within: float = DECLARE_WITHIN
               ) -> str | None:
    """Declare an exclusive server-named queue on a channel of its own, ask ``node_of_queue(name)`` (the
    management API's answer), delete the queue, close the channel, and return that answer.  A node whose
    metadata store cannot take the declaration (a partition's minority: it answers after the store's 30 s
    timeout, then closes the connection) is given up on after ``within`` seconds: the connection is ended.

    :raises ConnectionFailed: the channel or the declaration was refused or not answered in time, or the
        connection failed.
    """
    impl = connection._impl
    declared: list[str] = []

    def too_late() -> None:
        if not declared and impl.is_open:
            log.warning("AMQP connection: no queue declared within %g s: its node takes no metadata writes (a "
                        "partition's minority?): ending it", within)
            impl._terminate_stream(px.AMQPConnectionError(f"no queue declared within {within:g} s: the node takes no "
                                                          f"metadata writes (a partition's minority?)"))

    impl._adapter_call_later(within, too_late)
    with pika_errors("declaring a queue to find the connection's node"):
        channel = connection.channel()
        try:
            queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
            declared.append(queue)
            try:
                node = node_of_queue(queue)
            finally:
                with contextlib.suppress(Exception):
                    channel.queue_delete(queue)  # else it goes with its connection
        finally:
            with contextlib.suppress(Exception):
                if channel.is_open:
                    channel.close()
    return node


def close_quietly(connection: Any) -> None:
    """Close a connection if it is open; never raises (a broken one has nothing to close)."""
    try:
        if connection.is_open:
            connection.close()
    except Exception as exc:
        log.debug("closing an AMQP connection: %s", exc)


def basic_properties(**fields: Any) -> Any:
    """pika's ``BasicProperties`` with ``fields`` (``reply_to``, ``correlation_id``, ``headers``...)."""
    return pika.BasicProperties(**fields)

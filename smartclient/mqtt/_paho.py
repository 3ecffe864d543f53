"""The one seam between smartclient and paho-mqtt.

Only this module imports paho or touches its private attributes, and only here do paho's exceptions and
return codes become smartclient's errors (:func:`paho_errors`).  The MQTT wing (``placement.py``,
``fleet.py``) builds on :class:`PahoClient` and the few names below.

What the seam relies on is listed, entry by entry, in :data:`PAHO_INTERNALS` (private attributes and
methods), :data:`PAHO_NAMES` (public names imported) and :data:`PAHO_SIGNATURES` (parameters passed or
overridden).  ``tests/unit/test_paho_seam.py`` checks every entry against the installed paho and greps the
library for paho imports and private names outside this file; ``pyproject.toml`` pins paho to the 2.2 line.
When paho 3 arrives, this file changes and that test says what broke.

Why each private name is touched, and what relies on it: :mod:`smartclient.mqtt._paho_surface`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import select
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import paho.mqtt.client as paho
from paho.mqtt.client import MQTTMessage, MQTTMessageInfo
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from smartclient import keepalive
from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConfigurationError,
    ConnectionFailed,
    PublishNotSent,
    SmartClientError,
)
from smartclient.core.address import Address
from smartclient.core.relogin import certificate_alert
from smartclient.mqtt._paho_surface import PAHO_INTERNALS, PAHO_NAMES, PAHO_OVERRIDES, PAHO_SIGNATURES
from smartclient.mqtt.named_context import NamedContext

__all__ = ["PAHO_INTERNALS", "PAHO_NAMES", "PAHO_OVERRIDES", "PAHO_SIGNATURES", "HeldInfo", "MQTTMessage",
           "MQTTMessageInfo", "MQTTProtocolVersion", "NamedContext", "PahoClient", "Properties", "connack_of",
           "is_refusal", "paho_errors", "session_properties"]

log = logging.getLogger(__name__)

#: CONNACK reason codes that mean "wrong credentials or no access" (MQTT 3.1.1: 4, 5; MQTT 5: 134, 135,
#: 140): :class:`AuthenticationFailed`, never retried
_AUTH_CODES = frozenset({4, 5, 134, 135, 140})
#: an MQTT DISCONNECT with no reason code and no properties (MQTT 3.1.1 and 5: "normal disconnection")
_DISCONNECT = b"\xe0\x00"
#: most messages a client holds while it is not connected; more are refused (paho's MQTT_ERR_QUEUE_SIZE)
MAX_HELD = 100_000
_HOLD_LOCKS = threading.Lock()  # makes each client's hold lock once
#: the states of a QoS 1 or 2 message sent and waiting for the broker (PUBACK, PUBREC, PUBCOMP)
_AWAITING = frozenset({paho.mqtt_ms_wait_for_puback, paho.mqtt_ms_wait_for_pubrec, paho.mqtt_ms_wait_for_pubcomp})

_C = TypeVar("_C", bound="PahoClient")
_R = TypeVar("_R")


class _Refused(Exception):
    """A CONNACK with a reason code other than 0 (raised and mapped here only)."""
    def __init__(self, code: int) -> None:
        super().__init__(f"CONNACK reason code {code}: {_connack_text(code)}")
        self.code = code


class _NoConnack(Exception):
    """No CONNACK within the connect timeout (raised and mapped here only)."""
    def __init__(self, timeout: float) -> None:
        super().__init__(f"no CONNACK within {timeout} s")
        self.timeout = timeout


def _connack_text(code: int) -> str:
    if code < 6:
        return paho.connack_string(code)
    try:
        return str(ReasonCode(PacketTypes.CONNACK, identifier=code).getName())
    except KeyError:
        return "unknown reason"


@contextlib.contextmanager
def paho_errors(dialled: Address) -> Iterator[None]:
    """Run paho calls that connect to ``dialled``, raising smartclient's errors instead of paho's exceptions
    and return codes (``raise ... from exc``).  The one place where they are mapped.

    :raises CertificateRejected: the server's certificate does not verify for the name checked.
    :raises AuthenticationFailed: the broker refused the credentials or the vhost (CONNACK 4, 5, 134, 135,
        140).
    :raises ConnectionFailed: refused, reset, timed out, a TLS failure, no CONNACK in time, or any other
        CONNACK reason code.
    :raises ConfigurationError: paho refused a value it was given (host, port, keepalive, properties).
    """
    try:
        yield
    except SmartClientError:
        raise
    except _Refused as exc:
        text = f"connecting to {dialled}: the broker refused the client (reason code {exc.code}: " \
               f"{_connack_text(exc.code)})"
        if exc.code in _AUTH_CODES:
            raise AuthenticationFailed(text) from exc
        raise ConnectionFailed(text) from exc
    except _NoConnack as exc:
        raise ConnectionFailed(f"connecting to {dialled}: no CONNACK within {exc.timeout} s") from exc
    except ssl.SSLCertVerificationError as exc:  # before ValueError: it is one too
        reason = getattr(exc, "verify_message", None) or exc
        raise CertificateRejected(f"connecting to {dialled} (MQTT over TLS): {reason}") from exc
    except OSError as exc:  # refused, reset, timed out, unresolvable, a TLS handshake that failed
        if (alert := certificate_alert(str(exc))) is not None:  # the broker refused the client certificate
            raise CertificateRejected(f"connecting to {dialled} (MQTT over TLS): the broker refused the client "
                                      f"certificate ({alert}): {exc}") from exc
        raise ConnectionFailed(f"connecting to {dialled} (MQTT): {type(exc).__name__}: {exc}") from exc
    except ValueError as exc:
        raise ConfigurationError(f"connecting to {dialled} (MQTT): paho refused a setting: {exc}") from exc


def is_refusal(code: int) -> bool:
    """Whether a CONNACK reason code means refused credentials or no access (see :func:`paho_errors`)."""
    return code in _AUTH_CODES


def connack_of(flags: Any, reason: Any) -> tuple[bool, int]:
    """``(session present, reason code)`` from the ``flags`` and ``reason`` paho passes to a VERSION2
    ``on_connect`` callback."""
    code = reason.value if hasattr(reason, "value") else reason
    return bool(getattr(flags, "session_present", False)), int(code)


def session_properties(expiry: int) -> Properties:
    """MQTT 5 CONNECT properties carrying a session expiry interval of ``expiry`` seconds."""
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = expiry
    return props


class HeldInfo(MQTTMessageInfo):
    """What :meth:`PahoClient.publish` answers for a message it held while the client was handing over to a new
    token or reconnecting: ``mid`` is 0 until the message is sent; then it follows the sent message's info
    (``wait_for_publish`` waits for its PUBACK at QoS 1).  ``rc`` says why, if it is never sent (the client gave up,
    or was closed), and the :class:`PublishNotSent` its wait raises (a ``RuntimeError`` too, as paho's) says it with
    ``why`` (the client's failure, say)."""

    __slots__ = ("_sent", "_settled", "why")

    def __init__(self) -> None:
        super().__init__(0)
        self._sent: MQTTMessageInfo | None = None
        self._settled = threading.Event()
        self.why: BaseException | None = None

    def bind(self, sent: MQTTMessageInfo) -> None:
        self.mid, self.rc, self._sent = sent.mid, sent.rc, sent
        self._settled.set()

    def fail(self, rc: MQTTErrorCode, why: BaseException | None = None) -> None:
        self.rc, self.why = rc, why
        self._settled.set()

    def _not_sent(self) -> PublishNotSent:
        error = PublishNotSent(f"Message publish failed: {paho.error_string(self.rc)}"
                               + (f": {type(self.why).__name__}: {self.why}" if self.why is not None else ""))
        error.__cause__ = self.why
        return error

    def wait_for_publish(self, timeout: float | None = None) -> None:
        began = time.monotonic()
        if not self._settled.wait(timeout):
            return  # as paho's: a timeout returns, is_published() says
        if self._sent is None:
            raise self._not_sent()
        self._sent.wait_for_publish(None if timeout is None else max(0.0, timeout - (time.monotonic() - began)))

    def is_published(self) -> bool:
        if self._sent is None:
            if self._settled.is_set():
                raise self._not_sent()
            return False
        return self._sent.is_published()


class PahoClient(paho.Client):
    """paho's ``Client`` as smartclient drives it: its network loop on ``poll()``, re-aimable at another
    node before a reconnect, TLS verifying a chosen name, and closed quietly.  Every paho call that can fail
    to connect raises smartclient's errors (:func:`paho_errors`)."""

    #: ``(session present, reason code)`` of the last CONNACK (:meth:`record_connack`); None before one
    last_connack: tuple[bool, int] | None = None
    #: publishes held while not connected, in order (None: not holding); see :meth:`hold_publishes`
    _held_publishes: list[tuple[tuple[Any, ...], HeldInfo]] | None = None
    _held_lock: threading.RLock | None = None
    #: hold what is published while the connection is down (a client that reconnects on its own)
    hold_while_down: bool = False
    _read_error: OSError | None = None  # why the last read failed (paho keeps it to itself): a TLS alert, say
    #: seconds of silence that end the connection (:mod:`smartclient.keepalive`, on every socket paho opens)
    dead_after: float = 0.0

    def _create_socket_connection(self) -> Any:
        sock = super()._create_socket_connection()
        keepalive.watch(sock, self.dead_after)
        return sock

    def _check_keepalive(self) -> None:
        """paho's keepalive (the one agreed with the broker), then the silence watch of ``dead_after``
        (:func:`smartclient.keepalive.mqtt_watch`): a PINGREQ once nothing was received for a while, and the
        connection lost once nothing was received for long enough to be found within ``dead_after`` (paho's own
        would wait up to two keepalives: 120 s by default).  The keepalive the broker holds the client to stays the
        user's, so a client not pumped for a while (a placement waiting for the management API to list it) is not
        dropped by the broker."""
        super()._check_keepalive()
        every, limit = keepalive.mqtt_watch(self.dead_after)
        if not self.dead_after or not self.is_connected():
            return
        now = time.monotonic()  # (paho's clock)
        unacked = now - self.oldest_in_flight(now)  # the node answers, its queues cannot take it; or another found
        if (why := f"no PUBACK for {unacked:.1f} s (dead_after) while the broker answers" if unacked >= limit
                else self.found_cut_off()) is not None:
            log.warning("MQTT client %s: %s: is its node cut off? The connection is lost", self.client_id, why)
            self.lost_cut_off = unacked >= limit  # (its own finding: another wing's is that wing's)
            self.lose_connection()
            return
        if 0 < self._keepalive <= every:
            return  # paho's own pings find a silent one sooner
        with self._msgtime_mutex:
            silent = now - self._last_bytes_received
        unanswered = now - self._ping_t if self._ping_t else 0.0  # paho's: a PINGREQ sent, no PINGRESP yet
        if silent >= limit or unanswered >= limit - every:
            log.warning("MQTT client %s: nothing received for %.1f s, a ping unanswered for %.1f s (dead_after): the "
                        "connection is lost", self.client_id, silent, unanswered)
            self.lose_connection()
        elif not self._ping_t and now - self._smartclient_pinged >= every:  # busy or not: a link cut toward the
            self._smartclient_pinged = now  # node only lets through what the node had sent, until its window fills
            self._send_pingreq()

    _smartclient_pinged = 0.0  # when the silence watch last sent a PINGREQ
    lost_cut_off = False  #: the PUBACK watch ended the last connection: its node answers, its queues take nothing

    def watch_afresh(self) -> None:
        """Start the silence watch afresh on the connection a placement just kept: a PINGRESP may wait unread from
        while the placement held paho's loop (seen: "a ping unanswered for 19.2 s" on a connection 0 s old)."""
        now = self._smartclient_pinged = time.monotonic()
        self._ping_t, self.lost_cut_off = 0.0, False
        with self._msgtime_mutex:
            self._last_bytes_received = now

    def found_cut_off(self) -> str | None:
        return None  # (what another found this connection's node cut off by: a placed client asks its placer)

    def oldest_in_flight(self, now: float) -> float:
        """When the oldest QoS 1 or 2 message sent and not yet acknowledged was sent (paho's clock; sent again
        after a CONNACK: from then), ``now`` if none is."""
        with self._out_message_mutex:
            return next((m.timestamp for m in self._out_messages.values() if m.state in _AWAITING), now)

    def lose_connection(self) -> None:
        """End the connection as paho's keepalive does: no DISCONNECT, and paho's loop reconnects."""
        self._sock_close()
        self._do_on_disconnect(packet_from_broker=False, v1_rc=MQTTErrorCode.MQTT_ERR_KEEPALIVE)

    def _sock_recv(self, bufsize: int) -> bytes:
        try:
            return super()._sock_recv(bufsize)
        except OSError as exc:
            self._read_error = None if isinstance(exc, BlockingIOError) else exc
            raise

    @classmethod
    def create(cls: type[_C], client_id: str, protocol: MQTTProtocolVersion, clean_start: bool) -> _C:
        """An unconnected client with paho's VERSION2 callbacks (MQTT 5 takes ``clean_start`` at connect)."""
        v5 = protocol is MQTTProtocolVersion.MQTTv5
        return cls(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                   clean_session=None if v5 else clean_start)

    def configure(self, username: str | None, password: str | None, *, reconnect_delay: tuple[float, float],
                  connect_timeout: float, tls: ssl.SSLContext | None, dead_after: float = 0.0) -> None:
        """Credentials, paho's reconnect delays, the connect timeout, TLS (a verifying context), and the silence
        that ends a connection.

        :raises ConfigurationError: ``tls`` does not verify certificates and host names.
        """
        self.username_pw_set(username, password)
        low, high = reconnect_delay
        self.reconnect_delay_set(low, high)  # type: ignore[arg-type]  # paho sleeps floats fine
        self.connect_timeout = connect_timeout
        self.dead_after = dead_after
        if tls is not None:
            self.tls_set_context(NamedContext(tls))  # type: ignore[arg-type]

    @property
    def client_id(self) -> str:
        """The MQTT client id."""
        return self._client_id.decode()

    @property
    def tls_server_name(self) -> str | None:
        """The name TLS verifies on the next connect (None without TLS, or before the first)."""
        return (self._ssl_context.server_name or None) if isinstance(self._ssl_context, NamedContext) else None

    def aim_at(self, dialled: Address, server_name: str | None = None) -> None:
        """Make the next (re)connect dial ``dialled`` and, with TLS, verify ``server_name``."""
        self._host, self._port = dialled.host, dialled.port
        if server_name is not None and isinstance(self._ssl_context, NamedContext):
            self._ssl_context.server_name = server_name

    def send_connect(self, dialled: Address, keepalive: int, *, clean_start: bool,
                     properties: Properties | None, server_name: str | None = None) -> None:
        """Open the connection to ``dialled`` and send CONNECT.  The TCP/TLS connect blocks, bounded by the
        connect timeout; the CONNACK comes later (:meth:`await_connack`, or the loop's ``on_connect``).

        :raises CertificateRejected, ConnectionFailed, ConfigurationError: see :func:`paho_errors`.
        """
        with paho_errors(dialled):
            self.aim_at(dialled, server_name)
            if self.protocol is MQTTProtocolVersion.MQTTv5:
                self.connect(dialled.host, dialled.port, keepalive, clean_start=clean_start, properties=properties)
            else:
                self.connect(dialled.host, dialled.port, keepalive)

    def record_connack(self, flags: Any, reason: Any) -> tuple[bool, int]:
        """Record a CONNACK as a VERSION2 ``on_connect`` reports it; return ``(session present, code)``."""
        self.last_connack = connack_of(flags, reason)
        return self.last_connack

    def await_connack(self, timeout: float) -> bool:
        """Drive the socket (no thread, no socket pair) until the CONNACK; return whether a session was
        resumed.  ``on_connect`` must call :meth:`record_connack`.

        :raises AuthenticationFailed: refused credentials.  :raises ConnectionFailed: no CONNACK within
            ``timeout`` seconds, or another reason code.
        """
        dialled = Address(self._host, self._port)
        self._read_error = None
        with paho_errors(dialled):
            deadline = time.monotonic() + timeout
            while self.last_connack is None:
                left = deadline - time.monotonic()
                if self.socket() is None or left <= 0:
                    break
                if self._loop(min(left, 0.1)) != paho.MQTT_ERR_SUCCESS:
                    break
            if self.last_connack is None:
                if self._read_error is not None:  # (paho logs it and says only "connection lost")
                    raise self._read_error
                raise _NoConnack(timeout)
            session_present, code = self.last_connack
            if code != 0:
                raise _Refused(code)
            return session_present

    def while_subscribed(self, topic: str, timeout: float, read: Callable[[], _R]) -> _R | None:
        """``read()`` while subscribed to ``topic`` at QoS 0, the socket driven here (a placement's thread: no loop
        runs); None when the broker granted nothing within ``timeout`` s.  The application's ``on_subscribe`` and
        ``on_unsubscribe`` are not told."""
        acks: dict[int, bool] = {}
        told = self.on_subscribe, self.on_unsubscribe
        self.on_subscribe = lambda _c, _u, mid, codes, _p: acks.__setitem__(mid, not any(c.is_failure for c in codes))
        self.on_unsubscribe = lambda _c, _u, mid, _codes, _p: acks.__setitem__(mid, True)

        def acked(sent: tuple[MQTTErrorCode, int | None], deadline: float) -> bool:
            rc, mid = sent
            while rc == paho.MQTT_ERR_SUCCESS and mid not in acks and self.socket() is not None and (
                    left := deadline - time.monotonic()) > 0:
                rc = self._loop(min(left, 0.1))
            return acks.get(mid or -1, False)

        try:
            if not acked(self.subscribe(topic, 0), time.monotonic() + timeout):
                return None
            try:
                return read()
            finally:
                acked(self.unsubscribe(topic), time.monotonic() + timeout)
        finally:
            self.on_subscribe, self.on_unsubscribe = told

    def reconnect_now(self) -> None:
        """Reconnect (to wherever :meth:`_before_reconnect` aims), from an external loop.

        :raises ConnectionFailed: the connect failed (see :func:`paho_errors`).
        """
        try:
            self.reconnect()
        except Exception:
            with paho_errors(Address(self._host, self._port)):
                raise

    def _before_reconnect(self) -> bool:
        """Called before every (re)connect paho makes: aim elsewhere here and return False (paho then dials
        where the client is aimed), or connect the client here (:meth:`reconnect_to`) and return True (paho
        dials nothing).  A :class:`SmartClientError` makes that reconnect fail (paho's loop calls
        ``on_connect_fail``, then tries again after its reconnect delay unless :meth:`stop_reconnecting`
        was called)."""
        return False

    # paho calls reconnect() for the first connect too, from connect() and from its loop
    def reconnect(self) -> MQTTErrorCode:
        try:
            if self._before_reconnect():
                return MQTTErrorCode.MQTT_ERR_SUCCESS
        except SmartClientError as exc:
            # paho's loop (loop_forever, loop_start) retries a reconnect that raised OSError, after its delay
            raise ConnectionRefusedError(f"MQTT reconnect: {exc}") from exc
        return super().reconnect()

    def reconnect_to(self, dialled: Address, server_name: str | None, timeout: float) -> bool:
        """Connect again, to ``dialled`` (verifying ``server_name`` with TLS), with the CONNECT of the first
        connect (keepalive, clean start, properties), and drive the socket until the CONNACK; return whether
        a session was resumed.  :meth:`_before_reconnect` is not called: this is how it reconnects.

        :raises AuthenticationFailed, CertificateRejected, ConnectionFailed: see :func:`paho_errors`.
        """
        self.last_connack = None
        try:
            with paho_errors(dialled):
                self.aim_at(dialled, server_name)
                paho.Client.reconnect(self)
            return self.await_connack(timeout)
        except BaseException:
            self._sock_close()
            raise

    def stop_reconnecting(self) -> None:
        """Drop the connection, if any, and make paho's loop (``loop_forever``, ``loop_start``'s thread)
        return instead of reconnecting: paho marks a client without a socket disconnected."""
        self._sock_close()
        self.disconnect()

    def drop_connection(self) -> None:
        """Close the socket without DISCONNECT (``on_socket_close`` is called); paho may reconnect."""
        self._sock_close()

    def close_quietly(self) -> None:
        """DISCONNECT (flushed, if no loop thread runs), stop the loop thread, close the socket; never raises."""
        try:
            self.disconnect()
            if self._thread is None and self.socket() is not None:
                self.loop_write()  # flush the DISCONNECT
            self.loop_stop()
            self._sock_close()
        except Exception as exc:  # already broken
            log.debug("closing an MQTT client: %s", exc)

    # -- publishes held while a client hands over or reconnects -----------------------------------------
    def _holding_lock(self) -> threading.RLock:
        if self._held_lock is None:
            with _HOLD_LOCKS:
                if self._held_lock is None:
                    self._held_lock = threading.RLock()
        return self._held_lock

    def hold_publishes(self) -> None:
        """From now on, hold what :meth:`publish` is asked to send (any QoS), in order, until
        :meth:`release_publishes`: the client is about to hand over to a new token, or is reconnecting."""
        with self._holding_lock():
            if self._held_publishes is None:
                self._held_publishes = []

    @property
    def holding(self) -> int | None:
        """How many publishes are held (None: not holding)."""
        held = self._held_publishes
        return None if held is None else len(held)

    def release_publishes(self) -> int:
        """Send every held publish, in order, and stop holding; return how many.  Call it connected (on the
        loop's thread, e.g. from ``on_connect``): a publish made meanwhile on another thread waits for this."""
        with self._holding_lock():
            held, self._held_publishes = self._held_publishes, None
            for args, info in held or ():
                info.bind(super().publish(*args))
            return len(held or ())

    def fail_held(self, rc: MQTTErrorCode = MQTTErrorCode.MQTT_ERR_NO_CONN, why: BaseException | None = None, *,
                  unsent: bool = False) -> int:
        """Fail every held publish with ``rc`` and ``why`` and stop holding; with ``unsent`` (the client gave up),
        fail what paho has unsent or unacknowledged too: ``wait_for_publish`` raises instead of waiting for ever."""
        with self._holding_lock(), self._out_message_mutex:
            held, self._held_publishes = self._held_publishes or [], None
            out = list(self._out_messages.values()) if unsent else []
            if unsent:
                self._out_messages, self._inflight_messages = collections.OrderedDict(), 0
        for _, info in held:
            info.fail(rc, why)
        for message in out:
            message.info.rc = rc
            message.info._set_as_published()
        return len(held) + len(out)

    def publish(self, topic: str, payload: Any = None, qos: int = 0, retain: bool = False,
                properties: Properties | None = None) -> MQTTMessageInfo:
        """paho's ``publish``; while the client hands over to a new token or reconnects, the message is held and
        sent (in order) once it is connected again: the answer is then a :class:`HeldInfo`."""
        with self._holding_lock():
            if self._held_publishes is None and self.hold_while_down and self._sock is None:
                self._held_publishes = []
            if self._held_publishes is None:
                return super().publish(topic, payload, qos, retain, properties)
            info = HeldInfo()
            if len(self._held_publishes) >= MAX_HELD:
                info.fail(MQTTErrorCode.MQTT_ERR_QUEUE_SIZE)
            else:
                self._held_publishes.append(((topic, payload, qos, retain, properties), info))
            return info

    def disconnect(self, reasoncode: ReasonCode | None = None, properties: Properties | None = None) -> MQTTErrorCode:
        """paho's ``disconnect``: the client will not reconnect, so what it holds fails (``MQTT_ERR_NO_CONN``)."""
        self.hold_while_down = False
        self.fail_held()
        return super().disconnect(reasoncode, properties)

    def in_flight(self) -> int:
        """QoS 1 and 2 messages sent and not yet acknowledged (those queued behind paho's in-flight window are
        not: they were never sent)."""
        return int(self._inflight_messages)

    def say_goodbye(self, timeout: float = 1.0) -> None:
        """End the connection as the client's own choice, but not for good: write out what is queued (PUBACKs of
        messages received, say), send DISCONNECT (a persistent session is kept and delivers nothing more; what it
        delivered and was not acknowledged goes back to its queue), close the socket.  paho's ``on_disconnect`` is
        not called and paho does not take the client for disconnected: it is reconnected next."""
        try:
            self.flush(timeout)
            sock = self._sock
            if sock is not None:
                sock.send(_DISCONNECT)
        except OSError as exc:  # already broken: nothing to say goodbye on
            log.debug("MQTT client %s: goodbye: %s", self.client_id, exc)
        finally:
            self._sock_close()

    def flush(self, timeout: float = 1.0) -> None:
        """Write out what is queued (PUBACKs of messages received, say), reading nothing, for up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while self._sock is not None and self.want_write() and time.monotonic() < deadline:
            if self.loop_write() != paho.MQTT_ERR_SUCCESS:
                break

    def pump(self, timeout: float) -> MQTTErrorCode:
        """One turn of the network loop on this thread: wait up to ``timeout`` s, read and write what is ready."""
        return self._loop(timeout)

    def wake(self) -> None:
        """Wake the loop (``loop_start``'s thread), as a publish from another thread does."""
        pair = self._sockpairW
        if pair is not None:
            with contextlib.suppress(OSError):
                pair.send(b"0")

    def _loop_turn(self) -> float | None:
        """Called on the loop's thread at every turn of :meth:`_loop`: do what is due (a subclass's hand-over)
        and return the seconds until something is due next (None: nothing)."""
        return None

    # paho's network loop (loop_start, loop_forever, loop) waits with select(), which cannot watch a file
    # descriptor numbered 1024 or more: in a process with many files or sockets the client never gets
    # its CONNACK, silently (eclipse-paho/paho.mqtt.python#183, #238, #819).  The same loop, with poll().
    def _loop(self, timeout: float = 1.0) -> MQTTErrorCode:
        due = self._loop_turn()
        if due is not None:
            timeout = min(timeout, max(0.0, due))
        sock = self._sock
        if sock is None or not hasattr(select, "poll") or timeout < 0.0:
            return super()._loop(timeout)
        pending = sock.pending() if hasattr(sock, "pending") else 0
        poller = select.poll()
        poller.register(sock, select.POLLIN | (select.POLLOUT if self.want_write() else 0))
        wake = self._sockpairR
        if wake is not None:
            poller.register(wake, select.POLLIN)
        try:
            ready = dict(poller.poll(0 if pending else int(timeout * 1000)))
        except (OSError, ValueError, TypeError):
            return super()._loop(0.0)  # a closed socket: let paho set its state and say so
        events = ready.get(sock.fileno(), 0)
        if events & (select.POLLIN | select.POLLHUP | select.POLLERR) or pending > 0:
            rc = self.loop_read()
            if rc or self._sock is None:
                return rc
        write = bool(events & select.POLLOUT)
        if wake is not None and ready.get(wake.fileno(), 0) & select.POLLIN:
            write = True  # a publish() from another thread: send it now
            with contextlib.suppress(BlockingIOError):
                wake.recv(10000)
        if write:
            rc = self.loop_write()
            if rc or self._sock is None:
                return rc
        return self.loop_misc()


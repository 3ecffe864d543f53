"""How MQTT connections log in, and how a live one hands over to a refreshed token.

Every connect logs in through the one credentials seam (:mod:`smartclient.credentials`), asked before each connect
(:meth:`MqttCredentials.sign_in`): a password, the current OAuth2 token, or EXTERNAL (over TLS with a client
certificate: no user name and no password, the broker's ``mqtt.ssl_cert_login``); the current client certificate is
loaded into the TLS context before each connect, so a rotated one is used by the next.

RabbitMQ has no in-band re-authentication for MQTT (an MQTT 5 AUTH packet makes it close the connection) and ends a
connection when the token it logged in with expires (MQTT 5: DISCONNECT 0xA0 "Maximum connect time"; 3.1.1: the
socket closes), on 4.0.5 and 4.3.6 alike.  So with token credentials each client *hands over* to every new token
(:class:`HandsOver`), at its slot of a spread (:func:`~smartclient.core.relogin.handover_delay`), on its loop's
thread:

1. it *holds* what it is asked to publish (any QoS, in order; ``publish()`` answers a
   :class:`~smartclient.mqtt._paho.HeldInfo`);
2. it waits for the PUBACKs of the QoS 1 messages in flight (up to the connect timeout);
3. with a persistent session, it writes out the PUBACKs of what it received and reads nothing for
   :data:`SETTLE_GRACE`: RabbitMQ applies a quorum-queue session's acknowledgements at low priority, and a DISCONNECT
   right after them can return those messages to the queue first, to come again on the new connection (measured on
   4.3.6 and 4.0.5: one duplicate in about 30 hand-overs of a subscriber receiving 700 messages a second);
4. it says DISCONNECT (so the broker closes nothing; a persistent session keeps its queue, and what it had sent
   and was not acknowledged goes back to it);
5. it connects again with the new token, with the same client id, its own node first
   (:func:`~smartclient.core.relogin.handover_candidates`), as a placement;
6. it sends what it held.

Why not make-before-break (a second connection first): MQTT allows one connection per client id, so a second one with
the same id takes the first over (the broker closes it, and redelivers what that one was acknowledging: duplicates),
and a second id is another identity (its own session, ACLs on ``{client_id}``, what the management API lists).  The
drain above loses nothing and sends nothing twice; it costs one connect of publishing pause per token.

A new token the broker refuses at the hand-over (revoked, a key it does not trust): the client connects again with
the token it had, while that one is valid, logs :class:`~smartclient.TokenRefused` and counts it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from smartclient import credentials as signing
from smartclient._errors import AuthenticationFailed, SmartClientError, TokenRefused
from smartclient.core.relogin import refusal
from smartclient.credentials import CredentialsLike, ExternalLogin, TokenCredentials
from smartclient.mqtt._paho import PahoClient

__all__ = ["SETTLE_GRACE", "HandsOver", "LoginSent", "MqttCredentials"]

log = logging.getLogger(__name__)

#: seconds a client with a persistent session reads nothing between its last PUBACK and its DISCONNECT at a hand-over
SETTLE_GRACE = 0.1

#: a token and its expiry (unix time), as one connection logged in with it
LoginSent = tuple[str | None, float | None]


class MqttCredentials:
    """The credentials every connect of one placer logs in with, and its TLS context and client certificate."""

    def __init__(self, credentials: CredentialsLike, vhost: str, tls: Any, client_certificate: Any) -> None:
        self.credentials = credentials
        self.vhost = vhost
        self.tls = tls
        self.client_certificate = client_certificate

    def check(self, name: str) -> None:
        """Ask for a login now: a token provider that fails, or answers an expired token, raises here (and is not
        retried as a connection failure would be).

        :raises TokenProviderFailed, TokenExpired: see :func:`smartclient.credentials.login`."""
        signing.login(self.credentials, name)

    def sign_in(self, client: HandsOver, login: LoginSent | None = None) -> None:
        """Make the next connect of ``client`` log in with the current credentials (a token provider may be
        asked: this may block), or with ``login`` (the token it had, when a new one was refused), and present the
        current client certificate.

        :raises TokenProviderFailed: the provider failed (within its back-off it is not asked again).
        :raises TokenExpired: it answered a token already past its expiry.
        """
        creds = self.credentials
        signed = signing.login(creds, client.client_id)
        if signed.mechanism == "EXTERNAL":  # the certificate is the identity (mqtt.ssl_cert_login)
            client.username_pw_set(None)
            client.logged_in_with(None, None)
        else:
            token = creds.token if isinstance(creds, TokenCredentials) else None
            secret, expires_at = login or (signed.password, token.expires_at if token is not None else None)
            client.username_pw_set(signed.username if self.vhost == "/" else f"{self.vhost}:{signed.username}", secret)
            client.logged_in_with(secret, expires_at)
        signing.tls_context(self.tls, self.client_certificate)  # a rotated certificate: loaded now

    def has_newer(self, client: HandsOver) -> bool:
        """Whether the credentials hold a token other than the one ``client`` logged in with (a hand-over to the
        same token, one the broker refused and that was taken back, would only reconnect)."""
        creds = self.credentials
        held = creds.token if isinstance(creds, TokenCredentials) else None
        return held is None or held.value != client.login_sent[0]

    def refused(self, client: HandsOver, error: AuthenticationFailed) -> AuthenticationFailed:
        """``error`` (the broker refused ``client``'s login), said with what it sent (see
        :func:`~smartclient.core.relogin.refusal`).  The token credentials are told (every connection, and the
        management API's requests, go on with the token before it while that one is valid)."""
        creds = self.credentials
        secret = client.login_sent[0]
        if secret is not None:
            signing.refused_token(creds, secret)
        return refusal(error, time.time(), mechanism="EXTERNAL" if isinstance(creds, ExternalLogin) else "PLAIN",
                       provider=creds.name if isinstance(creds, TokenCredentials) else None,
                       expires_at=client.login_expires_at)



class Reconnects(Protocol):
    """What a client that hands over needs of its placer."""

    handovers: int
    token_refusals: int
    login: MqttCredentials

    def handover_drain(self) -> float: ...

    def handover_settle(self) -> float: ...

    def check_token(self) -> None: ...


class HandsOver(PahoClient):
    """A paho client that hands its connection over to a new token (see the module's text) when
    :meth:`hand_over_in` says, on its loop's thread: during ``loop_start``'s loop, or the application's ``loop()``
    calls.  A subclass says how it connects again (:meth:`_place_again`)."""

    handovers: int = 0  #: connections handed over to a new token
    token_refusals: int = 0  #: new tokens the broker refused at a hand-over (the one it had was kept)
    login_expires_at: float | None = None  #: when the token of the current connection expires (None: no token)
    _login_secret: str | None = None  # what the current connection logged in with (the fallback of a refusal)
    _handover_due: float | None = None  # monotonic time the next hand-over is due
    _turning: bool = False  # a hand-over is under way on the loop's thread
    _placing: bool = False  # a reconnect is placing the client (its loop turns wait for the CONNACK meanwhile)

    def logged_in_with(self, secret: str | None, expires_at: float | None) -> None:
        """Note the token the next connect sends, and its expiry."""
        self._login_secret, self.login_expires_at = secret, expires_at

    @property
    def login_sent(self) -> LoginSent:
        """The token the current connection logged in with, and its expiry (the fallback of a refused one)."""
        return self._login_secret, self.login_expires_at

    def hand_over_in(self, delay: float) -> None:
        """Hand the connection over to the current token in ``delay`` seconds."""
        self._handover_due = time.monotonic() + delay
        self.wake()

    def _handing_over(self) -> Reconnects:
        raise NotImplementedError

    def _place_again(self, *, handover: bool, fallback: LoginSent | None = None) -> None:
        """Connect again (a placement) with the current credentials; after a refused login at a hand-over, with
        ``fallback`` (see :meth:`fallback_after`).

        :raises SmartClientError: it gave up (the client stays disconnected)."""
        raise NotImplementedError

    def fallback_after(self, error: AuthenticationFailed, fallback: LoginSent | None) -> LoginSent:
        """What to log in with after the broker refused the new token at a hand-over: the token the client had,
        while it is valid (a :class:`TokenRefused`, logged and counted).

        :raises AuthenticationFailed: ``error``, when there is no such token."""
        if self._login_secret is not None:  # (a fleet's client is told its CONNACK here, not by a placement)
            signing.refused_token(self._handing_over().login.credentials, self._login_secret)
        if fallback is None or fallback[0] is None or fallback[1] is None or fallback[1] <= time.time() + 1:
            raise error
        self.token_refusals += 1
        self._handing_over().token_refusals += 1
        log.warning("MQTT client %s: %s; it goes on with the token it had, until that one expires", self.client_id,
                    TokenRefused(str(error), connection=self.client_id))
        return fallback

    def _loop_turn(self) -> float | None:
        due = self._handover_due
        if due is None or self._turning or self._placing:  # (not inside a reconnect's own turns: it logs in anew)
            return None
        left = due - time.monotonic()
        if left > 0:
            return left
        self._handover_due = None
        self._turning = True
        try:
            self._hand_over()
        except SmartClientError:
            pass  # logged, and the client's failure: it stays disconnected
        finally:
            self._turning = False
        return None

    def _hand_over(self) -> None:
        """Hold, drain, say goodbye, connect again with the new token, send what was held.  A connection lost on
        the way is left to the reconnect that paho's loop makes next (which logs in with the new token too)."""
        if self.socket() is None:
            return
        placer = self._handing_over()
        if not placer.login.has_newer(self):
            return  # the new token was refused (by another client's hand-over) and taken back
        placer.check_token()
        if not placer.login.has_newer(self):  # the management API refused it: no reconnect at all
            self.token_refusals += 1
            placer.token_refusals += 1
            log.warning("MQTT client %s: TokenRefused: the management API refused the new token; it goes on with the "
                        "token it had, until that one expires (and keeps its connection)", self.client_id)
            return
        self.hold_publishes()
        drain = placer.handover_drain()
        deadline = time.monotonic() + drain
        while self.in_flight() and self.socket() is not None and time.monotonic() < deadline:
            self.pump(0.05)
        if self.socket() is None:
            return
        if self.in_flight():
            log.warning("MQTT client %s: %d messages still unacknowledged after %.1f s: they are sent again after the "
                        "hand-over (at least once)", self.client_id, self.in_flight(), drain)
        settle = placer.handover_settle()
        if settle:
            self.flush()
            time.sleep(settle)  # this client's own loop thread: nothing else waits
        fallback = self.login_sent
        self.say_goodbye()
        self._place_again(handover=True, fallback=fallback)
        self.handovers += 1
        placer.handovers += 1

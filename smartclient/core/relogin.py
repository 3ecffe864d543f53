"""Logging in again: when and where a live MQTT connection hands over to a refreshed token, and what a login the
broker refused means.  Pure rules, no I/O, no clock of their own.

AMQP 0.9.1 and the stream protocol take a new token on the open connection (``connection.update-secret``, SASL
again).  MQTT cannot: RabbitMQ has no in-band re-authentication for MQTT (an MQTT 5 AUTH packet makes it close
the connection; measured on 4.0.5 and 4.3.6), and it ends an MQTT connection when the token it logged in with
expires (MQTT 5: DISCONNECT 0xA0 "Maximum connect time"; 3.1.1: the socket closes).  So each MQTT connection
logs in again with the new token, once the refresher has it and before its own token expires: a *hand-over*.

* :func:`handover_delay`: when.  The hand-overs of many connections (a fleet of thousands, or the clients of one
  Environment) are spread over the first ``share`` of the time their current token has left, each at its own
  slot (:func:`slot_of`, :func:`slot_of_name`), so that the broker never sees them all at once and each has the
  rest of that time to finish.
* :func:`handover_candidates`: where.  The node the connection is on first (a hand-over is no failover), then the
  others.
* :func:`refusal`: what a refused login means, said with what was sent (every wing maps the broker's refusal onto
  :class:`~smartclient.AuthenticationFailed`; this names the token's provider and expiry, or the certificate).
* :func:`certificate_alert`: whether a TLS failure is the broker refusing the client's certificate (an alert it
  sent about it), which every wing raises as :class:`~smartclient.CertificateRejected` and never retries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from smartclient._errors import AuthenticationFailed, TokenExpired
from smartclient.core.address import Address
from smartclient.core.broker_nodes import reconnect_candidates
from smartclient.core.tokens import describe_expiry
from smartclient.core.topology import Candidates, Role
from smartclient.core.validation import number, whole

__all__ = ["CERTIFICATE_ALERTS", "HANDOVER_SHARE", "certificate_alert", "handover_candidates", "handover_delay",
           "refusal", "slot_of", "slot_of_name"]

#: the TLS alerts a server sends about the client's certificate, as OpenSSL names them in its messages (``[SSL:
#: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca``): a certificate from a CA it does not trust, one it cannot
#: parse, expired, revoked, or none where it requires one (``fail_if_no_peer_cert``)
CERTIFICATE_ALERTS = ("alert unknown ca", "alert bad certificate", "alert certificate required",
                      "alert certificate unknown", "alert certificate expired", "alert certificate revoked",
                      "alert unsupported certificate")

#: the share of the time a connection's token has left over which the hand-overs are spread; the rest is theirs
#: to finish in (20 s tokens refreshed at 15 s: spread over 2.5 s; one-hour tokens: over 7.5 minutes)
HANDOVER_SHARE = 0.5


def slot_of(index: int, count: int) -> float:
    """Connection ``index`` of ``count`` (a fleet's member): its place in the spread, in [0, 1), evenly."""
    whole("count", count, low=1)
    whole("index", index, low=0, high=count - 1)
    return index / count


def slot_of_name(name: str) -> float:
    """A connection known only by its name (a client id): a place in [0, 1) that is the same in every process
    and spreads names evenly (a hash: ``sensor-1``, ``sensor-2``... land far apart), so that clients placed one by
    one need no common counter."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") / 2**64


def handover_delay(now: float, expires_at: float | None, slot: float, share: float = HANDOVER_SHARE) -> float:
    """Seconds from ``now`` until a connection whose token expires at ``expires_at`` (unix time; None: unknown,
    or a token that never expires) hands over to a new token, at ``slot`` of the spread: ``slot`` of the first
    ``share`` of the time left.  A token already expired, or an unknown expiry, hands over at once."""
    number("slot", slot, low=0, below=1)
    number("share", share, above=0, high=1)
    if expires_at is None:
        return 0.0
    return max(0.0, expires_at - now) * share * slot


def handover_candidates(nodes: Sequence[Address], own: Address | None, what: str = "token hand-over") -> Candidates:
    """Where a connection on ``own`` logs in again with a new token: ``own`` (tier 0), then the other nodes in
    turn from the next one (tier 1), should its node not answer: a reconnect's candidates
    (:func:`~smartclient.core.broker_nodes.reconnect_candidates`) the other way round.  With ``own`` not among
    ``nodes`` (or alone), any node.

    :raises ConfigurationError: no nodes.
    """
    moving_on = reconnect_candidates(nodes, own, what)
    return Candidates(what, Role.CONNECTION, tuple(reversed(moving_on.tiers)))

def refusal(error: AuthenticationFailed, now: float, *, mechanism: str, provider: str | None = None,
            expires_at: float | None = None) -> AuthenticationFailed:
    """What ``error`` (the broker refused a login) means, given what was sent: with a token from ``provider``
    expiring at ``expires_at``, :class:`TokenExpired` if that is past at ``now`` (the broker's clock may run
    ahead), else a refused token (revoked, a key it does not trust, no scope for the vhost); with ``EXTERNAL``, the
    certificate's identity; else ``error`` itself."""
    if provider is not None and expires_at is not None:
        expiry = describe_expiry(expires_at)
        if expires_at <= now:
            return TokenExpired(f"{error}: the token from {provider} expired at {expiry}", expires_at=expires_at,
                                provider=provider)
        return AuthenticationFailed(f"{error}: it refused the token from {provider} (valid until {expiry} by this "
                                    f"clock): revoked, signed by a key it does not trust, or without the scopes for "
                                    f"this vhost")
    if mechanism == "EXTERNAL":
        return AuthenticationFailed(f"{error}: it refused the client certificate's identity (SASL EXTERNAL): no "
                                    f"user named as the certificate says, or no EXTERNAL on this listener")
    return error


def certificate_alert(text: str) -> str | None:
    """The alert named in ``text`` (a TLS error's message, as a client library passed it on) if the server refused
    the client's certificate with it (:data:`CERTIFICATE_ALERTS`), else None."""
    lowered = text.lower().replace("_", " ")
    return next((alert for alert in CERTIFICATE_ALERTS if alert in lowered), None)

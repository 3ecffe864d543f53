"""Bearer tokens as values, and when to refresh them: pure rules, no I/O, no clock of their own.

A token provider (an OAuth2 client of the user's: Keycloak, Entra ID, UAA) may answer in any of the shapes
identity providers and their client libraries use; :func:`coerce_token` turns each into one :class:`Token`:

* a :class:`Token`;
* ``(token, expires_at)``: the token and its expiry as a unix time;
* a mapping with ``access_token`` and ``expires_at`` (unix time) or ``expires_in`` (seconds from ``now``), the
  shape of an OAuth2 token response (and of ``authlib``/``requests-oauthlib`` tokens);
* a JWT string alone: its expiry is its ``exp`` claim, read without verifying the signature (the broker
  verifies it; smartclient only needs to know when to refresh).

:func:`refresh_delay` is the schedule: at ``share`` of the token's lifetime, spread by ``jitter`` of it, so that
the connections of a fleet that got their tokens together do not all refresh in the same second.
"""

from __future__ import annotations

import base64
import binascii
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from smartclient._errors import SmartClientError, TokenProviderFailed
from smartclient.core.validation import number, text

__all__ = ["Token", "coerce_token", "describe_expiry", "jwt_expiry", "refresh_delay"]


@dataclass(frozen=True)
class Token:
    """A bearer token and its expiry (unix time); the token never appears in ``repr`` or ``str``."""

    value: str = field(repr=False)
    expires_at: float
    issued_at: float | None = None  #: when it was received (unix time), for its lifetime; None: unknown

    def __post_init__(self) -> None:
        text("Token.value", self.value, secret=True)
        number("Token.expires_at", self.expires_at, low=0, note="a unix time")
        number("Token.issued_at", self.issued_at, low=0, optional=True, note="a unix time")

    def __str__(self) -> str:
        return f"Token(expires {describe_expiry(self.expires_at)})"

    def lifetime(self, now: float) -> float:
        """Seconds from issue (or ``now``) to expiry."""
        return self.expires_at - (self.issued_at if self.issued_at is not None else now)


def describe_expiry(expires_at: float) -> str:
    """``2026-11-25T17:20:03Z``: an expiry as people read it in an error."""
    return datetime.fromtimestamp(expires_at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def jwt_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (unverified), or None if ``token`` is not a JWT with one."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeEncodeError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, int | float) and not isinstance(exp, bool):
        return float(exp)
    return None


def coerce_token(value: Any, now: float, source: str) -> Token:
    """``value`` (a provider's answer, in any shape listed above) as a :class:`Token` received at ``now``.

    :raises TokenProviderFailed: ``value`` is none of those shapes, or has no usable expiry."""
    def bad(why: str) -> TokenProviderFailed:
        return TokenProviderFailed(
            f"{source} returned {type(value).__name__}: {why}; a token provider returns a Token, "
            f"(token, expires_at), a mapping with access_token and expires_in or expires_at, or a JWT with an "
            f"exp claim", provider=source)

    token: Any
    expires_at: Any
    if isinstance(value, Token):
        token, expires_at = value.value, value.expires_at
    elif isinstance(value, tuple) and len(value) == 2:
        token, expires_at = value
    elif isinstance(value, Mapping):
        token = value.get("access_token")
        if "expires_at" in value:
            expires_at = value["expires_at"]
        elif "expires_in" in value:
            expires_in = value["expires_in"]
            if not isinstance(expires_in, int | float) or isinstance(expires_in, bool):
                raise bad(f"expires_in is {expires_in!r}, not a number of seconds")
            expires_at = now + expires_in
        else:
            expires_at = jwt_expiry(token) if isinstance(token, str) else None
    elif isinstance(value, str):
        token, expires_at = value, jwt_expiry(value)
        if expires_at is None:
            raise bad("a string that is not a JWT with an exp claim, so its expiry is unknown")
    else:
        raise bad("not a token")
    if not isinstance(token, str) or not token:
        raise bad("no token (an empty or missing access token)")
    if isinstance(expires_at, datetime):
        expires_at = expires_at.timestamp()
    if not isinstance(expires_at, int | float) or isinstance(expires_at, bool):
        raise bad(f"its expiry is {expires_at!r}, not a unix time")
    try:
        return Token(token, float(expires_at), now)
    except SmartClientError as exc:
        raise bad(str(exc)) from None


def refresh_delay(token: Token, now: float, share: float, jitter: float, rng: random.Random | None = None) -> float:
    """Seconds from ``now`` until ``token`` is refreshed: at ``share`` of its lifetime, spread by ``jitter`` of
    the lifetime either way, never later than 1 s before expiry (and never negative)."""
    lifetime = max(0.0, token.lifetime(now))
    start = token.issued_at if token.issued_at is not None else now
    at = start + lifetime * share
    if jitter:
        at += lifetime * (rng or random).uniform(-jitter, jitter)
    at = min(at, token.expires_at - min(1.0, lifetime / 10))
    return max(0.0, at - now)

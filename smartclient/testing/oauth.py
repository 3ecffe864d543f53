"""The locked bed's identity provider: RS256 JWTs the brokers trust, and the faults of a real one.

Every node runs ``rabbitmq_auth_backend_oauth2`` after the internal backend, with
``resource_server_id = rabbitmq`` and the public half of the bed's signing key
(:func:`ensure_signing_key`) as its only signing key.  So a client logs in with
any user name and a minted token as its password, over stream, AMQP 0.9.1 and
MQTT, while guest/guest keeps working for the open bed.

:class:`TokenAuthority` mints tokens; its faults are what an identity provider
does to a client in production: it refuses a subject (``revoke``: as its 401
would), it hands out tokens shorter-lived than asked (``expire_early``), and a
token signed by a key the broker no longer trusts (``mint(key="untrusted")``).
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smartclient._errors import ConfigurationError, PrerequisiteMissing, TestBedError

__all__ = [
    "DEFAULT_SCOPES",
    "RESOURCE_SERVER_ID",
    "SIGNING_KEY_ID",
    "TokenAuthority",
    "TokenProvider",
    "TokenRevoked",
    "ensure_signing_key",
    "oauth2_conf",
]

SIGNING_KEY_ID = "smartclient-testbed"
UNTRUSTED_KEY_ID = "smartclient-testbed-untrusted"
RESOURCE_SERVER_ID = "rabbitmq"
#: full rights on every vhost, and the management API's administrator tag
DEFAULT_SCOPES = (
    f"{RESOURCE_SERVER_ID}.read:*/*",
    f"{RESOURCE_SERVER_ID}.write:*/*",
    f"{RESOURCE_SERVER_ID}.configure:*/*",
    # topic permissions (vhost/exchange/routing key): without them the broker ends an MQTT connection on its
    # first publish, and refuses a topic exchange's bindings
    f"{RESOURCE_SERVER_ID}.read:*/*/*",
    f"{RESOURCE_SERVER_ID}.write:*/*/*",
    f"{RESOURCE_SERVER_ID}.tag:administrator",
)
PRIVATE_KEY_FILE = "oauth-signing.key"
PUBLIC_KEY_FILE = "oauth-signing.pem"


class TokenRevoked(TestBedError):
    """The bed's identity provider refuses to issue a token for this subject (:meth:`TokenAuthority.revoke`)."""


def oauth2_conf(key_file: Path) -> list[str]:
    """The ``rabbitmq.conf`` lines of the OAuth2 backend, ``key_file`` being the public key as the node sees it.
    (The same keys on 4.0.5 and 4.3.6; a node refuses to boot on a key its schema does not know.)"""
    return [
        "auth_backends.1 = rabbit_auth_backend_internal",
        "auth_backends.2 = rabbit_auth_backend_oauth2",
        f"auth_oauth2.resource_server_id = {RESOURCE_SERVER_ID}",
        "auth_oauth2.preferred_username_claims.1 = sub",
        f"auth_oauth2.signing_keys.{SIGNING_KEY_ID} = {key_file}",
        f"auth_oauth2.default_key = {SIGNING_KEY_ID}",
    ]


def _generate_rsa_pem() -> bytes:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
    except ImportError as exc:
        raise PrerequisiteMissing("the test bed's tokens need cryptography: pip install 'smartclient[testbed]'") \
            from exc
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _public_pem(private_pem: bytes) -> bytes:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(private_pem, password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def ensure_signing_key(directory: Path) -> Path:
    """Write the bed's RSA signing key pair into ``directory`` unless present; return the public key's file
    (PEM), which the nodes trust."""
    private, public = directory / PRIVATE_KEY_FILE, directory / PUBLIC_KEY_FILE
    if private.exists() and public.exists():
        return public
    directory.mkdir(parents=True, exist_ok=True)
    pem = _generate_rsa_pem()
    private.write_bytes(pem)
    private.chmod(0o600)
    public.write_bytes(_public_pem(pem))
    return public


class TokenProvider:
    """A token provider for a client: each call mints a fresh ``(token, expires_at)``; ``calls`` counts them
    (refused ones too).

    :raises TokenRevoked: the subject was revoked."""

    def __init__(self, authority: TokenAuthority, subject: str, lifetime: float) -> None:
        self.authority = authority
        self.subject = subject
        self.lifetime = lifetime
        self.calls = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TokenProvider(subject={self.subject!r}, lifetime={self.lifetime:g}, calls={self.calls})"

    def __call__(self) -> tuple[str, float]:
        with self._lock:
            self.calls += 1
        return self.authority.mint(self.subject, self.lifetime)


class TokenAuthority:
    """Mints RS256 JWTs for the bed's resource server ``rabbitmq``, with the faults of an identity provider.

    A token carries ``sub`` (the broker's user name), ``aud: [rabbitmq]``, the scopes, ``iat``, ``exp`` (whole
    seconds, rounded up) and a unique ``jti``.  Thread-safe: providers may be called from client threads.
    """

    def __init__(self, private_key_pem: bytes, *, key_id: str = SIGNING_KEY_ID,
                 audience: str = RESOURCE_SERVER_ID, clock: Callable[[], float] = time.time) -> None:
        self._keys: dict[str, tuple[str, bytes]] = {"trusted": (key_id, private_key_pem)}
        self.audience = audience
        self._clock = clock
        self._lock = threading.Lock()
        self._revoked: set[str] = set()
        self._early: float | None = None

    @classmethod
    def from_directory(cls, directory: Path) -> TokenAuthority:
        """The authority whose key the bed's nodes trust (:func:`ensure_signing_key` in ``directory``)."""
        ensure_signing_key(directory)
        return cls((directory / PRIVATE_KEY_FILE).read_bytes())

    def __repr__(self) -> str:
        return f"TokenAuthority(audience={self.audience!r}, revoked={sorted(self._revoked)})"

    def _key(self, name: str | None) -> tuple[str, bytes]:
        name = name or "trusted"
        with self._lock:
            if name == "untrusted" and name not in self._keys:
                self._keys[name] = (UNTRUSTED_KEY_ID, _generate_rsa_pem())
            if name not in self._keys:
                raise ConfigurationError(f"unknown signing key {name!r}: use None (trusted) or 'untrusted'")
            return self._keys[name]

    def mint(self, subject: str = "smartclient-test", lifetime: float = 20.0, scopes: list[str] | None = None,
             *, key: str | None = None) -> tuple[str, float]:
        """A signed token for ``subject`` and its expiry (unix time): ``lifetime`` s from now (or the
        ``expire_early`` fault's), ``scopes`` (default :data:`DEFAULT_SCOPES`).  ``key="untrusted"`` signs with a
        key the broker does not trust, as a token from a revoked key looks to it.

        :raises TokenRevoked: ``subject`` was revoked (:meth:`revoke`)."""
        try:
            import jwt
        except ImportError as exc:
            raise PrerequisiteMissing("the test bed's tokens need PyJWT: pip install 'smartclient[testbed]'") \
                from exc
        with self._lock:
            if subject in self._revoked:
                raise TokenRevoked(f"the test bed's identity provider refuses {subject!r}: revoked (401)")
            if self._early is not None:
                lifetime = self._early
        key_id, pem = self._key(key)
        now = self._clock()
        expires_at = math.ceil(now + lifetime)
        claims: dict[str, Any] = {
            "sub": subject, "aud": [self.audience], "iat": int(now), "exp": expires_at,
            "jti": uuid.uuid4().hex, "scope": " ".join(DEFAULT_SCOPES if scopes is None else scopes),
        }
        token = jwt.encode(claims, pem, algorithm="RS256", headers={"kid": key_id})
        return token, float(expires_at)

    def provider(self, subject: str = "smartclient-test", lifetime: float = 20.0) -> TokenProvider:
        """A callable that mints a fresh token for ``subject`` on every call and counts its calls."""
        return TokenProvider(self, subject, lifetime)

    # -- faults --------------------------------------------------------------------------
    def revoke(self, subject: str) -> None:
        """Refuse to issue tokens for ``subject`` from now on (its tokens already issued stay valid)."""
        with self._lock:
            self._revoked.add(subject)

    def expire_early(self, seconds: float) -> None:
        """Tokens issued from now on expire ``seconds`` after issue, whatever lifetime was asked."""
        with self._lock:
            self._early = seconds

    def restore(self) -> None:
        """Undo :meth:`revoke` and :meth:`expire_early`."""
        with self._lock:
            self._revoked.clear()
            self._early = None

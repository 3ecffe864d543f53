"""How every connection of smartclient logs in, and how a token it logged in with is kept fresh: the one
credentials seam of every wing (stream, AMQP 0.9.1, MQTT), as :mod:`smartclient.resolution` is the one
resolution seam.

Three ways to log in, one per value an Environment's ``credentials=`` takes:

* :class:`~smartclient.Credentials`: a user name and password (SASL PLAIN);
* :class:`TokenCredentials`: OAuth2 bearer tokens from a provider (``rabbitmq_auth_backend_oauth2``); the
  token is the password, asked for again before it expires and handed to **every live connection** that
  logged in with it (each wing updates its connections in its own way: the stream protocol's SASL exchange
  again, AMQP 0.9.1's ``connection.update-secret``, MQTT's make-before-break reconnect);
* :data:`EXTERNAL`: the client certificate (``client_certificate=``) is the identity (SASL EXTERNAL, through
  ``rabbitmq_auth_mechanism_ssl``); an Environment with a certificate and no credentials uses it.

A certificate is loaded into the TLS context before each connection (:func:`tls_context`) when it changed, so
a rotated certificate is used by the next connection with no restart.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import logging
import os
import ssl
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConfigurationError,
    ConnectionFailed,
    SmartClientError,
    TokenExpired,
    TokenProviderFailed,
    TokenRefused,
)
from smartclient.core.retry import Backoff
from smartclient.core.settings import ClientCertificate, Credentials
from smartclient.core.tokens import Token, coerce_token, describe_expiry, refresh_delay
from smartclient.core.validation import function, instance, number, text

__all__ = ["EXTERNAL", "ExternalLogin", "Login", "Refreshes", "RefusedLogins", "TokenCredentials", "acting_alone",
           "after_refusal", "alogin", "alone", "current_certificate", "current_is", "login", "refused_token",
           "tls_context", "watch"]

log = logging.getLogger(__name__)

#: the back-off between calls of a token provider that failed: 1 s, doubling, at most 30 s, spread by a fifth
PROVIDER_BACKOFF = Backoff(1.0, 2.0, 30.0, 0.2)

#: A token this close to its expiry (seconds) is not handed to a new connection: it could expire on the way.
EXPIRY_MARGIN = 1.0


@dataclass(frozen=True)
class Login:
    """What one connection sends: the SASL mechanism, the user and the secret (never in ``repr``)."""

    mechanism: str
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class ExternalLogin:
    """Log in as the client certificate's identity (SASL EXTERNAL): the broker takes the user from the
    certificate (``ssl_cert_login_from``), so nothing secret is sent."""

    username: str = ""

    def __post_init__(self) -> None:
        text("ExternalLogin.username", self.username, empty=True)

    def __str__(self) -> str:
        return "EXTERNAL (the client certificate)"


#: the login of an Environment with a client certificate and no credentials
EXTERNAL = ExternalLogin()


class TokenCredentials:
    """OAuth2 bearer tokens from ``provider``, refreshed before they expire on every live connection.

    :param provider: a function (sync or async, no arguments) that answers a token: a
        :class:`~smartclient.core.tokens.Token`, ``(token, expires_at)``, an OAuth2 token response (a mapping
        with ``access_token`` and ``expires_in`` or ``expires_at``), or a JWT string (its ``exp`` claim).
    :param username: the user name sent beside the token (RabbitMQ's OAuth2 backend takes the user from the
        token; some brokers want a name all the same).
    :param refresh_at: when to refresh, as a share of the token's lifetime (0.75: a one-hour token is
        refreshed after 45 minutes).
    :param jitter: spread of the refresh time, as a share of the lifetime either way, so that the clients of a
        fleet that got their tokens together do not all refresh in the same second.
    :param retry: the back-off between calls of a provider that failed: nothing calls it sooner (the last
        error is raised again instead), so an identity provider that is down sees no storm.
    :param name: the provider's name in errors and logs (default: the function's qualified name).

    One value is one token: every wing and connection of an Environment (and of any client given the same
    value) shares it, and a refresh asks the provider once for all of them.
    """

    mechanism = "PLAIN"

    def __init__(self, provider: Callable[[], Any], *, username: str = "", refresh_at: float = 0.75,
                 jitter: float = 0.1, retry: Backoff = PROVIDER_BACKOFF, name: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        function("TokenCredentials.provider", provider, takes="() -> token and expiry", optional=False)
        text("TokenCredentials.username", username, empty=True)
        number("TokenCredentials.refresh_at", refresh_at, above=0, high=1, note="a share of the lifetime")
        number("TokenCredentials.jitter", jitter, low=0, note="a share of the lifetime")
        if refresh_at - jitter <= 0 or refresh_at + jitter >= 1:
            raise ConfigurationError(
                f"TokenCredentials: refresh_at={refresh_at} with jitter={jitter} could refresh at or past the "
                f"token's expiry or at once; keep refresh_at - jitter > 0 and refresh_at + jitter < 1")
        instance("TokenCredentials.retry", retry, Backoff)
        text("TokenCredentials.name", name, optional=True)
        function("TokenCredentials.clock", clock, takes="() -> unix time", optional=False)
        self.provider = provider
        self.username = username
        self.refresh_at = refresh_at
        self.jitter = jitter
        self.retry = retry
        self.name = name or getattr(provider, "__qualname__", None) or type(provider).__name__
        self._clock = clock
        self._lock = threading.Lock()
        self._token: Token | None = None
        self._previous: Token | None = None  # the token held before the current one (taken back if it is refused)
        self._refused: list[str] = []  # tokens the broker refused, the latest last (a few)
        self._refresh_due = 0.0
        self._failures = 0
        self._next_try = 0.0
        self._last_error: TokenProviderFailed | TokenExpired | TokenRefused | None = None
        self._watchers: dict[int, tuple[str, Callable[[str], Any]]] = {}
        self._watch_ids = 0
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.provider_calls = 0  #: times the provider was asked
        self.refreshes = 0  #: tokens handed to the live connections by the refresher
        self.failures = 0  #: provider calls that failed
        self.refusals = 0  #: tokens the broker refused (see :meth:`refused`)

    def __repr__(self) -> str:
        return f"TokenCredentials(provider={self.name}, username={self.username!r})"

    @property
    def token(self) -> Token | None:
        """The current token (None before the first connection asked for one)."""
        return self._token

    # -- the token a connection logs in with --------------------------------------------------------------
    def current(self, connection: str = "") -> str:
        """A token valid for at least :data:`EXPIRY_MARGIN` seconds, for ``connection`` (named in errors):
        the one held, or a new one once it is due for refresh (or when none is held).

        :raises TokenProviderFailed: the provider failed (now, or within its back-off: it is not asked
            again sooner) and no valid token is held.
        :raises TokenExpired: the provider answered a token that is already past its expiry.
        """
        with self._lock:
            now = self._clock()
            held = self._token
            if now < self._refresh_due and self._usable(held, now):
                assert held is not None
                return held.value
            try:
                return self._fetch(now, connection).value
            except (TokenProviderFailed, TokenExpired, TokenRefused):
                if self._usable(held, now):
                    assert held is not None
                    return held.value  # still valid: the refresher tries again on its back-off
                raise

    async def acurrent(self, connection: str = "") -> str:
        """:meth:`current` from async code: at once while the token held is fresh, else on a worker thread
        (the provider may block)."""
        held = self._token
        if held is not None and self._clock() < self._refresh_due and held.value not in self._refused:
            return held.value
        return await asyncio.to_thread(self.current, connection)

    def _fetch(self, now: float, connection: str) -> Token:
        """Ask the provider (the caller holds the lock); on failure, raise and hold it back for the back-off."""
        if self._last_error is not None and now < self._next_try:
            raise self._again(connection)
        self.provider_calls += 1
        try:
            answer = self.provider()
            if inspect.isawaitable(answer):
                answer = _run(answer)
            token = coerce_token(answer, self._clock(), f"token provider {self.name}")
        except Exception as exc:
            self.failures += 1
            self._failures += 1
            self._next_try = now + self.retry.delay(self._failures)
            if isinstance(exc, TokenProviderFailed):
                self._last_error = exc
                log.warning("%s; asking again in %.1f s", exc, self._next_try - now)
                raise
            error = TokenProviderFailed(
                f"token provider {self.name} failed{_for(connection)}: {type(exc).__name__}: {exc}",
                provider=self.name, connection=connection)
            self._last_error = error
            log.warning("%s; asking again in %.1f s", error, self._next_try - now)
            raise error from exc
        if token.value in self._refused:
            self.failures += 1
            self._failures += 1
            self._next_try = now + self.retry.delay(self._failures)
            refused = TokenRefused(
                f"token provider {self.name} answered again a token the broker refused{_for(connection)}",
                connection=connection)
            self._last_error = refused
            log.warning("%s; asking again in %.1f s", refused, self._next_try - now)
            raise refused
        if token.expires_at - EXPIRY_MARGIN <= self._clock():
            self.failures += 1
            self._failures += 1
            self._next_try = now + self.retry.delay(self._failures)
            expired = TokenExpired(
                f"token provider {self.name} answered a token that expired at {describe_expiry(token.expires_at)} "
                f"({self._clock() - token.expires_at:.0f} s ago){_for(connection)}: a token must be valid when a "
                f"connection logs in with it", expires_at=token.expires_at, provider=self.name)
            self._last_error = expired  # held back on the back-off like any failure: asked again no sooner
            log.warning("%s; asking again in %.1f s", expired, self._next_try - now)
            raise expired
        self._failures = 0
        self._last_error = None
        self._previous, self._token = self._token, token
        self._refresh_due = now + refresh_delay(token, now, self.refresh_at, self.jitter)
        return token

    def refused(self, token: str) -> bool:
        """The broker refused ``token`` (a login, or a new token on a live connection): it is not handed out again.
        When it is the current token and the one before it is still valid, that one is current again (every
        connection, the management API's requests too, goes on with it until it expires) and the provider is asked
        again on the back-off; a provider that answers a refused token again fails (:class:`TokenRefused`).

        :returns: whether a valid token other than ``token`` is current now (a login may be tried again with it).
        """
        with self._lock:
            now = self._clock()
            if token not in self._refused:
                self._refused = [*self._refused[-7:], token]
                self.refusals += 1
            held, previous = self._token, self._previous
            if held is None or held.value != token:  # taken back already (or never held): is the one held good?
                return self._usable(held, now)
            if not self._usable(previous, now):
                self._failures += 1
                self._next_try = now + self.retry.delay(self._failures)
                self._last_error = TokenRefused(
                    f"the broker refused the token from {self.name} (valid until {describe_expiry(held.expires_at)}), "
                    f"and no token before it is still valid: the provider is asked again in "
                    f"{self._next_try - now:.1f} s", connection="")
                return False
            assert previous is not None
            # the one before it, until it nears its expiry; the provider is asked again halfway there (not on the
            # provider's back-off: each token a stream connection is handed and refuses costs that connection)
            left = previous.expires_at - EXPIRY_MARGIN - now
            self._token, self._previous = previous, None
            self._refresh_due = now + min(left, max(self.retry.delay(1), left / 2))
            log.warning("the broker refused the new token of token provider %s: every connection goes on with the "
                        "one before it, until it expires at %s; the provider is asked again in %.1f s", self.name,
                        describe_expiry(previous.expires_at), self._refresh_due - now)
            self._wake.set()
            return True

    def _usable(self, token: Token | None, now: float) -> bool:
        return token is not None and token.value not in self._refused and token.expires_at - EXPIRY_MARGIN > now

    def _again(self, connection: str) -> TokenProviderFailed | TokenExpired | TokenRefused:
        last = self._last_error
        assert last is not None
        if isinstance(last, TokenExpired | TokenRefused):
            return last  # the same expired token: its type and expiry say it all
        error = TokenProviderFailed(
            f"token provider {self.name} failed{_for(connection)} and is not asked again before its back-off "
            f"ends in {max(0.0, self._next_try - self._clock()):.1f} s: {last}", provider=self.name,
            connection=connection)
        error.__cause__ = last
        return error

    # -- live connections --------------------------------------------------------------------------------
    def watch(self, name: str, on_refresh: Callable[[str], Any]) -> Callable[[], None]:
        """Call ``on_refresh(token)`` with every new token until the returned function is called; ``name``
        names the watcher (a wing, or a connection) in logs.  The first watcher starts the refresher."""
        with self._lock:
            self._watch_ids += 1
            key = self._watch_ids
            self._watchers[key] = (name, on_refresh)
            if self._thread is None or not self._thread.is_alive():
                self._closed = False
                self._thread = threading.Thread(target=self._refresher, name=f"smartclient-token-{self.name}",
                                                daemon=True)
                self._thread.start()
            self._wake.set()

        def unwatch() -> None:
            with self._lock:
                self._watchers.pop(key, None)
        return unwatch

    def close(self) -> None:
        """Stop the refresher (a new watcher starts it again)."""
        self._closed = True
        self._wake.set()

    def _refresher(self) -> None:
        while not self._closed:
            with self._lock:
                if not self._watchers:
                    self._thread = None
                    return
                now = self._clock()
                if self._last_error is not None:  # first: a failing provider is asked on its back-off only
                    wait = max(0.0, self._next_try - now)
                elif self._token is None:
                    wait = 0.0
                else:
                    wait = max(0.0, self._refresh_due - now)
            if wait > 0:
                self._wake.clear()
                self._wake.wait(wait)
                continue
            try:
                with self._lock:
                    previous = self._token
                    token = self._fetch(self._clock(), "") if (
                        previous is None or self._clock() >= self._refresh_due) else previous
            except SmartClientError:
                continue  # logged; tried again on the back-off
            if token is previous:
                continue
            self.refreshes += 1
            for name, on_refresh in list(self._watchers.values()):
                try:
                    on_refresh(token.value)
                except Exception:
                    log.exception("handing a new token from %s to %s failed", self.name, name)


def _for(connection: str) -> str:
    return f" for connection {connection}" if connection else ""


def _run(awaitable: Any) -> Any:
    """An async provider's answer, from sync code: on an event loop of its own for the call (on a worker thread
    when the asking thread runs one: a sync placer called inside ``async with Environment``).  A provider that
    keeps a loop-bound client (an ``httpx.AsyncClient``) must make it per call, or be a sync function."""
    from smartclient.resolution import run_sync

    return run_sync(awaitable)


# -- one login, whatever the credentials -----------------------------------------------------------------------
CredentialsLike = Credentials | TokenCredentials | ExternalLogin


def login(credentials: CredentialsLike, connection: str = "") -> Login:
    """What ``connection`` logs in with now (a token provider may be asked: this may block)."""
    if isinstance(credentials, TokenCredentials):
        return Login("PLAIN", credentials.username, credentials.current(connection))
    if isinstance(credentials, ExternalLogin):
        return Login("EXTERNAL", credentials.username, "")
    return Login("PLAIN", credentials.username, credentials.password)


async def alogin(credentials: CredentialsLike, connection: str = "") -> Login:
    """:func:`login` from async code, never blocking the event loop."""
    if isinstance(credentials, TokenCredentials):
        return Login("PLAIN", credentials.username, await credentials.acurrent(connection))
    return login(credentials, connection)


def refused_token(credentials: CredentialsLike, token: str) -> bool:
    """The broker refused ``token`` (a new token on a live connection, or a login): tell the token credentials
    (:meth:`TokenCredentials.refused`).  Whether a valid token other than it is current now."""
    return isinstance(credentials, TokenCredentials) and bool(token) and credentials.refused(token)


def current_is(credentials: CredentialsLike, token: str) -> bool:
    """Whether ``token`` is the token held now (not taken back after a refusal, nor refreshed since)."""
    held = credentials.token if isinstance(credentials, TokenCredentials) else None
    return held is not None and held.value == token


def after_refusal(credentials: CredentialsLike, signed: Login, error: BaseException) -> BaseException:
    """What a dial raises after its login ``signed`` failed with ``error``: ``error`` itself; but when the broker
    refused a token and the token before it is current again (still valid), a :class:`ConnectionFailed` that is
    no refusal, so that the placement's next attempt logs in with that token."""
    if isinstance(error, AuthenticationFailed) and refused_token(credentials, signed.password):
        again = ConnectionFailed(f"{error}; the token before it is still valid: the next attempt logs in with it")
        again.__cause__ = error
        return again
    return error


def watch(credentials: CredentialsLike, name: str, on_refresh: Callable[[str], Any]) -> Callable[[], None] | None:
    """Hand every new token of ``credentials`` to ``on_refresh`` (None: these credentials never change)."""
    if isinstance(credentials, TokenCredentials):
        return credentials.watch(name, on_refresh)
    return None


class Refreshes:
    """One holder's watch of its credentials' new tokens (a connector's, a placer's, a fleet's): :meth:`start`
    hands each new token to ``on_refresh`` (once, however often it is called; nothing with static credentials),
    :meth:`stop` ends it.  Thread-safe."""

    def __init__(self, name: str, on_refresh: Callable[[str], Any]) -> None:
        self.name, self.on_refresh = name, on_refresh
        self._lock = threading.Lock()
        self._unwatch: Callable[[], None] | None = None

    def start(self, credentials: CredentialsLike) -> None:
        with self._lock:
            if self._unwatch is None:
                self._unwatch = watch(credentials, self.name, self.on_refresh)

    def stop(self) -> None:
        with self._lock:
            unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()


# -- client certificates ---------------------------------------------------------------------------------------
CertificateLike = ClientCertificate | Callable[[], ClientCertificate]
_LOADED: weakref.WeakKeyDictionary[ssl.SSLContext, tuple[Any, ...]] = weakref.WeakKeyDictionary()
_LOADING = threading.Lock()


def tls_context(context: ssl.SSLContext | None, certificate: CertificateLike | None) -> ssl.SSLContext | None:
    """``context`` with the current client certificate loaded (when it changed: other paths, or the files
    rewritten), for the next connection; connections already open keep the one they presented.

    :raises ConfigurationError: no TLS context to present it in, or the provider answered no certificate.
    :raises CertificateRejected: the files cannot be loaded (missing, not matching, wrong password).
    """
    if certificate is None:
        return context
    if context is None:
        raise ConfigurationError("a client certificate needs TLS: give the Environment tls= as well")
    current = current_certificate(certificate)
    assert current is not None
    key_file = current.key_file if current.key_file is not None else current.cert_file
    stamp = (os.fspath(current.cert_file), os.fspath(key_file), _mtime(current.cert_file), _mtime(key_file))
    with _LOADING:
        if _LOADED.get(context) != stamp:
            from smartclient._errors import CertificateRejected

            try:
                context.load_cert_chain(current.cert_file, key_file, current.password)
            except (OSError, ssl.SSLError) as exc:
                raise CertificateRejected(
                    f"the client certificate {os.fspath(current.cert_file)} (key {os.fspath(key_file)}) cannot be "
                    f"loaded: {exc}") from exc
            _LOADED[context] = stamp
    return context


def current_certificate(certificate: CertificateLike | None) -> ClientCertificate | None:
    """The client certificate to present now: ``certificate``, or what its provider answers (a rotated one).

    :raises ConfigurationError: the provider answered no certificate."""
    if certificate is None:
        return None
    current = certificate() if callable(certificate) and not isinstance(certificate, ClientCertificate) else certificate
    if not isinstance(current, ClientCertificate):
        raise ConfigurationError(
            f"the client certificate provider returned {type(current).__name__}, not a ClientCertificate")
    return current


def _mtime(path: Any) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


# -- refused logins ----------------------------------------------------------------------------------------------
_ALONE: contextvars.ContextVar[bool] = contextvars.ContextVar("smartclient_acting_alone", default=False)


def acting_alone() -> None:
    """Mark the rest of this task (and the tasks it starts) as work smartclient does on its own, not asked by the
    application: a recovery, a reconnect.  Such work does not dial again with a login the broker refused
    (:class:`RefusedLogins`)."""
    _ALONE.set(True)


def alone() -> bool:
    """Whether this code runs in work smartclient does on its own (:func:`acting_alone`)."""
    return _ALONE.get()


#: logins :class:`RefusedLogins` remembers as taken (a token and the one before it, while a refresh goes round)
GOOD_LOGINS = 4


class RefusedLogins:
    """The last login one connector or placer saw refused (credentials, a token, a client certificate), so that
    what smartclient dials on its own never dials with it again: a refusal is the same on every node and at every
    try.  A login that changed (a new token, another certificate, a rotated file) is dialled as usual, and so is
    anything the application asks for itself (it may know that the broker has changed its mind)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refused: tuple[str, SmartClientError] | None = None
        self._good: tuple[str, ...] = ()  # the last logins a connection logged in with (newest last)

    @staticmethod
    def key(signed: Login, certificate: CertificateLike | None = None) -> str:
        """A digest of what a connection presents: the login, and the client certificate's files as they are now."""
        parts = [signed.mechanism, signed.username, signed.password]
        current = current_certificate(certificate) if certificate is not None else None
        if current is not None:
            key_file = current.key_file if current.key_file is not None else current.cert_file
            parts += [os.fspath(current.cert_file), str(_mtime(current.cert_file)), os.fspath(key_file),
                      str(_mtime(key_file))]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def check(self, key: str) -> None:
        """Before a dial with the login ``key``.

        :raises AuthenticationFailed: (or :class:`CertificateRejected`) the refusal of this very login, when the
            dial is one smartclient makes on its own (:func:`acting_alone`); nothing is dialled."""
        with self._lock:
            refused = self._refused
        if refused is not None and refused[0] == key and alone():
            raise refused[1]

    def note(self, key: str, error: BaseException) -> None:
        """A dial with the login ``key`` failed with ``error``: remembered if the broker refused the login (an
        :class:`AuthenticationFailed` or :class:`CertificateRejected`; anything else says nothing of the login)."""
        if isinstance(error, AuthenticationFailed | CertificateRejected):
            with self._lock:
                self._refused = (key, error)

    def accepted(self, key: str | None = None) -> None:
        """A connection logged in (with the login ``key``, when given: see :meth:`tried`): whatever was refused
        before may log in again."""
        with self._lock:
            self._refused = None
        if key is not None:
            self.taken(key)

    def taken(self, key: str) -> None:
        """The broker took the login ``key`` (a connection logged in with it, or took its token as an update)."""
        with self._lock:
            if key not in self._good:
                self._good = (*self._good[-(GOOD_LOGINS - 1):], key)

    def tried(self, key: str) -> bool:
        """Whether a connection has logged in with the login ``key`` (one of the last :data:`GOOD_LOGINS`)."""
        return key in self._good

"""Small frozen settings: credentials, connection options, telemetry, entry-point URIs, pool limits.  Validated on
construction.  The one settings object every wing of an Environment is handed is
:class:`smartclient.options.ClientSettings`, above the credentials and the resolvers it holds."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from smartclient._errors import ConfigurationError
from smartclient.core.address import Address
from smartclient.core.validation import flag, number, provider, refuse, text, whole

__all__ = ["ClientCertificate", "ConnectionOptions", "Credentials", "PoolLimits", "StreamURI",
           "Telemetry", "parse_stream_uri"]

STREAM_PORT = 5552
STREAM_TLS_PORT = 5551
SCHEMES = {"rabbitmq-stream": False, "rabbitmq-stream+tls": True}


@dataclass(frozen=True)
class Credentials:
    """User and password; the password never appears in ``repr`` or ``str``."""

    username: str = "guest"
    password: str = field(default="guest", repr=False)

    def __post_init__(self) -> None:
        text("Credentials.username", self.username)
        text("Credentials.password", self.password, empty=True, secret=True)

    def __str__(self) -> str:
        return f"{self.username}:***"


@dataclass(frozen=True)
class ClientCertificate:
    """A client certificate for mutual TLS (and SASL EXTERNAL): the PEM certificate (chain) file, its key
    file (None: in the certificate file) and the key's password (never in ``repr``)."""

    cert_file: str | os.PathLike[str]
    key_file: str | os.PathLike[str] | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name, value, optional in (("cert_file", self.cert_file, False), ("key_file", self.key_file, True)):
            if not (value is None and optional) and not isinstance(value, str | os.PathLike):
                refuse(f"ClientCertificate.{name}", "a file path", value)
        text("ClientCertificate.password", self.password, empty=True, optional=True, secret=True)


@dataclass(frozen=True)
class PoolLimits:
    """How connections are shared and kept.

    :param max_streams_per_connection: publishers (or subscriptions) on one connection, at most.  An
        Environment's producers share one connection per node, and so do its consumers, up to this many
        each; then another connection to that node is opened.
    :param idle_timeout: seconds an unused connection (one that landed on an unwanted node, or whose
        producers and consumers all closed) is kept for another placement on its node before it is closed.
    :param max_parked_per_node: such connections kept per node, at most.
    """

    max_streams_per_connection: int = 200
    idle_timeout: float = 5.0
    max_parked_per_node: int = 4

    def __post_init__(self) -> None:
        # (200: rstream.constants.MAX_ITEM_ALLOWED)
        whole("PoolLimits.max_streams_per_connection", self.max_streams_per_connection, low=1, high=200)
        number("PoolLimits.idle_timeout", self.idle_timeout, low=0, note="seconds")
        whole("PoolLimits.max_parked_per_node", self.max_parked_per_node, low=0)


@dataclass(frozen=True)
class ConnectionOptions:
    """How an Environment's connections are opened: the name they carry (the management UI shows it, with a
    number per connection), the frame max and heartbeat they negotiate, and how long a stream's cached
    topology is trusted without an event that invalidates it.

    :param name: the connections' name prefix (``smartclient-7``).
    :param frame_max: bytes; the largest frame (so message) a connection carries.
    :param heartbeat: seconds between heartbeats; 0: off.
    :param topology_max_age: seconds a cached topology is trusted.
    :param dead_after: seconds within which a connection whose link went silent (one way or both, through a load
        balancer too) is found dead, in every wing, not after two heartbeats: stream heartbeats at a fifth of it,
        MQTT pings and AMQP 0.9.1 questions at a third, AMQP 1.0's idle timeout at two fifths, a silence watch on
        each, and TCP keepalive and ``TCP_USER_TIMEOUT`` on every socket.
        A busy peer, or one that holds back a sender (back-pressure), still acknowledges, and is not taken for
        dead.  0: off (the heartbeat alone).  See ``docs/reliability.md``, "Partitions".
    """

    name: str = "smartclient"
    frame_max: int = 1024 * 1024
    heartbeat: int = 60
    topology_max_age: float = 60.0
    dead_after: float = 10.0

    def __post_init__(self) -> None:
        text("ConnectionOptions.name", self.name)
        whole("ConnectionOptions.frame_max", self.frame_max, low=8192, high=2**31 - 1, note="bytes")
        whole("ConnectionOptions.heartbeat", self.heartbeat, low=0, high=3600, note="seconds; 0: off")
        number("ConnectionOptions.topology_max_age", self.topology_max_age, above=0, note="seconds")
        number("ConnectionOptions.dead_after", self.dead_after, low=0, high=3600, note="seconds; 0: off")
        if 0 < self.dead_after < 4:  # the silence limits need room for a live idle peer's heartbeats and answers
            raise ConfigurationError(f"ConnectionOptions.dead_after must be 0 (off) or at least 4 seconds, "
                                     f"not {self.dead_after!r}")


@dataclass(frozen=True)
class Telemetry:
    """Where an Environment's metrics and spans go (see ``docs/observability.md``; without ``smartclient[otel]``
    nothing is recorded).

    :param meter_provider: an OpenTelemetry ``MeterProvider`` (default: the global one).
    :param tracer_provider: an OpenTelemetry ``TracerProvider`` (default: the global one, if set).
    :param trace_context: each message carries its W3C trace context, linking consumer to producer spans (costly).
    """

    meter_provider: Any = None
    tracer_provider: Any = None
    trace_context: bool = False

    def __post_init__(self) -> None:
        provider("Telemetry.meter_provider", self.meter_provider, method="get_meter", kind="MeterProvider")
        provider("Telemetry.tracer_provider", self.tracer_provider, method="get_tracer", kind="TracerProvider")
        flag("Telemetry.trace_context", self.trace_context)


@dataclass(frozen=True)
class StreamURI:
    """One parsed entry point."""

    address: Address
    tls: bool
    credentials: Credentials | None
    vhost: str | None

    def __repr__(self) -> str:
        scheme = "rabbitmq-stream+tls" if self.tls else "rabbitmq-stream"
        user = f"{self.credentials}@" if self.credentials else ""
        return f"StreamURI('{scheme}://{user}{self.address}/{self.vhost or ''}')"


def parse_stream_uri(uri: str) -> StreamURI:
    """Parse ``rabbitmq-stream[+tls]://[user:password@]host[:port][/vhost]``.

    The vhost is the URL-decoded path (``/%2F`` or an empty path is the default vhost ``/``).

    :raises ConfigurationError: unsupported scheme, a user without a password, a bad port, extra path.
    """
    text("uri", uri, note="a stream URI: rabbitmq-stream[+tls]://...")
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"malformed stream URI {_redact(uri)!r}: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise ConfigurationError(
            f"unsupported URI scheme {parts.scheme!r} in {_redact(uri)!r}; use rabbitmq-stream:// or "
            f"rabbitmq-stream+tls://"
        )
    tls = SCHEMES[parts.scheme]
    if not parts.hostname:
        raise ConfigurationError(f"stream URI {_redact(uri)!r} has no host")
    credentials = None
    if parts.username is not None:
        if parts.password is None:
            raise ConfigurationError(
                f"stream URI {_redact(uri)!r} names user {unquote(parts.username)!r} without a password"
            )
        credentials = Credentials(unquote(parts.username), unquote(parts.password))
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if "/" in path:
        raise ConfigurationError(f"stream URI {_redact(uri)!r} has a path with more than a vhost; encode '/' as %2F")
    vhost = unquote(path) if path else None
    if parts.query or parts.fragment:
        raise ConfigurationError(f"stream URI {_redact(uri)!r} has a query or fragment, which are not supported")
    address = Address(parts.hostname, port or (STREAM_TLS_PORT if tls else STREAM_PORT))
    return StreamURI(address, tls, credentials, vhost)


def _redact(uri: str) -> str:
    """The URI with its password replaced by ***, for error messages."""
    try:
        parts = urlsplit(uri)
        if parts.password is None:
            return uri
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return parts._replace(netloc=netloc).geturl()
    except ValueError:
        return "<unparseable URI>"


def parse_entry_points(items: list[str | Address]) -> list[StreamURI]:
    """Each entry point as a :class:`StreamURI`: a ``rabbitmq-stream[+tls]://`` URI, ``host:port`` or an Address.

    :raises ConfigurationError: none given, or one is malformed.
    """
    if not items:
        raise ConfigurationError("no entry point given")
    uris = []
    for item in items:
        if not isinstance(item, str | Address):
            refuse("entry_points", "a URI, 'host:port' or an Address, or a list of them, or an SrvDiscovery", item)
        if isinstance(item, Address):
            uris.append(StreamURI(item, False, None, None))
        elif "://" in item:
            uris.append(parse_stream_uri(item))
        else:
            uris.append(StreamURI(Address.parse(item, default_port=5552), False, None, None))
    return uris


"""Options as values, and what the options every client of smartclient shares take.

* :class:`ClientSettings`: the one settings object an Environment hands every wing (credentials, vhost, TLS, the
  resolver and the allow-list, the retry policy, how connections are opened), typed all the way.
* :class:`ProducerOptions` and :class:`ConsumerOptions`: how a stream producer or consumer is made, each a frozen
  value that checks itself once (httpx's ``Timeout`` and ``Limits`` are the model).  ``env.producer(...)`` and
  ``env.consumer(...)`` take the common ones as keywords and build the value; it travels typed to the stream seam.
  A new option touches its value, its one use and the seam.
* :data:`CLIENT_OPTIONS`: the checks of the arguments the Environment's methods and the AMQP and MQTT placers
  share by name (:func:`smartclient.core.validation.checked`): credentials, vhost, TLS, the resolver and the
  allow-list, the retry policy, the management API, where to connect.
"""

from __future__ import annotations

import datetime
import inspect
import ssl
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from smartclient._errors import ConfigurationError
from smartclient.core.address import Address
from smartclient.core.amqp_data import check_encoding
from smartclient.core.batching import BatchingPolicy
from smartclient.core.filters import StreamFilter
from smartclient.core.flow import ConsumerFlow
from smartclient.core.offsets import OffsetSpec, OffsetTracking
from smartclient.core.retry import RetryPolicy
from smartclient.core.settings import ClientCertificate, ConnectionOptions, Credentials, StreamURI, parse_entry_points
from smartclient.core.validation import (
    Check,
    flag,
    function,
    instance,
    number,
    refuse,
    resolver,
    text,
    whole,
)
from smartclient.credentials import EXTERNAL, ExternalLogin, TokenCredentials
from smartclient.management import ManagementClient

if TYPE_CHECKING:
    from resolvers import AllowList, ResolverLike, SrvDiscovery

__all__ = ["CLIENT_OPTIONS", "ClientSettings", "ConsumerOptions", "OnError", "ProducerOptions", "check_on_error",
           "client_settings", "entry_points", "given_options", "management", "settings"]


@dataclass(frozen=True)
class ClientSettings:
    """The one settings object an Environment hands every wing, whatever its protocol: credentials, vhost, TLS
    (and the name it verifies, when given), the resolver, the allow-list, the retry policy, and how connections
    are opened (name, frame max, heartbeat).  The stream connector, and the AMQP and MQTT placers, are built
    from it instead of from a pile of keyword arguments."""

    credentials: Credentials | TokenCredentials | ExternalLogin = field(default_factory=Credentials)
    vhost: str = "/"
    tls: ssl.SSLContext | None = None
    tls_server_name: str | None = None  # overrides the name TLS verifies (see smartclient.core.tls_names)
    resolver: ResolverLike | None = None  # None: resolvers.Identity
    allow: AllowList | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    connection: ConnectionOptions = field(default_factory=ConnectionOptions)
    #: a ClientCertificate, or a function answering the current one (loaded before each connection)
    client_certificate: ClientCertificate | Callable[[], ClientCertificate] | None = None

    @property
    def frame_max(self) -> int:
        return self.connection.frame_max

    @property
    def heartbeat(self) -> int:
        return self.connection.heartbeat

    @property
    def dead_after(self) -> float:
        return self.connection.dead_after

    @property
    def connection_name(self) -> str:
        return self.connection.name


def client_settings(entry_points: str | Address | Sequence[str | Address] | SrvDiscovery, given: ClientSettings, *,
                    credentials_given: bool = True, vhost_given: bool = True
                    ) -> tuple[ClientSettings, tuple[Address, ...], SrvDiscovery | None]:
    """The one :class:`ClientSettings` of an Environment (``given``, as its arguments made it), with its entry points
    (addresses, or an SRV discovery): the URIs' user, password and vhost where none was given, TLS for a ``+tls``
    URI, EXTERNAL for a client certificate with no credentials anywhere.

    :raises ConfigurationError: URIs that disagree on credentials or vhost, or a client certificate without TLS."""
    from resolvers import Identity, SrvDiscovery

    srv: SrvDiscovery | None = None
    uris: list[StreamURI] = []
    if isinstance(entry_points, SrvDiscovery):
        srv = entry_points
    else:
        uris = parse_entry_points([entry_points] if isinstance(entry_points, str | Address) else list(entry_points))
    creds = {u.credentials for u in uris if u.credentials}
    vhosts = {u.vhost for u in uris if u.vhost is not None}
    if len(creds) > 1 and not credentials_given:
        raise ConfigurationError("the entry-point URIs carry different credentials; pass credentials=")
    if len(vhosts) > 1 and not vhost_given:
        raise ConfigurationError(f"the entry-point URIs name different vhosts {sorted(vhosts)}; pass vhost=")
    tls = given.tls if given.tls is not None or not any(u.tls for u in uris) else ssl.create_default_context()
    if given.client_certificate is not None and tls is None:
        raise ConfigurationError("client_certificate= needs TLS: give tls= (an ssl.SSLContext) as well")
    credentials = given.credentials if credentials_given else next(
        iter(creds), EXTERNAL if given.client_certificate is not None else Credentials())
    settings = replace(given, credentials=credentials, tls=tls,
                       vhost=given.vhost if vhost_given else next(iter(vhosts), "/"),
                       resolver=given.resolver if given.resolver is not None else Identity())
    return settings, tuple(u.address for u in uris), srv


OnError = Literal["stop", "skip"] | Callable[[Exception, Any], str]
"""What a consumer does when its callback raises: ``"stop"``, ``"skip"``, or a function ``(exception, context or
chunk) -> "skip" | "stop"`` (see :class:`ConsumerOptions`)."""


def check_on_error(on_error: Any, where: str) -> OnError:
    """``on_error`` as given, if it is one: ``"stop"``, ``"skip"`` or a callable.
    :raises ConfigurationError: anything else (before any I/O)."""
    if on_error in ("stop", "skip") or callable(on_error):
        return on_error  # type: ignore[no-any-return]
    raise ConfigurationError(f"on_error of {where} must be 'stop', 'skip' or a function (exception, context) -> "
                             f"'skip' | 'stop', not {on_error!r}")


@dataclass(frozen=True)
class ProducerOptions:
    """How a stream producer is made (``env.producer(stream, options=...)``, or its keywords).

    :param name: the producer's name, for deduplication (unique per stream; the same on every partition of a
        super stream).
    :param filter_value: returns the filter value of a message (its body, as given to ``send``), for consumers with a
        :class:`StreamFilter`; None for a message without one.
    :param batching: how ``send()`` batches (None: the Environment's :class:`BatchingPolicy`).
    :param encoding: ``"amqp"`` (default): each ``bytes`` body goes as an AMQP 1.0 message of one data section (5 to
        8 bytes more), which every client reads; ``"raw"``: the body alone, which only stream clients read.
    :raises ConfigurationError: any of them malformed, naming it.
    """

    name: str | None = None
    filter_value: Callable[[Any], str | None] | None = None
    batching: BatchingPolicy | None = None
    encoding: str = "amqp"

    def __post_init__(self) -> None:
        text("ProducerOptions.name", self.name, optional=True)
        function("ProducerOptions.filter_value", self.filter_value, takes="message -> filter value")
        instance("ProducerOptions.batching", self.batching, BatchingPolicy)
        check_encoding(self.encoding, "ProducerOptions")


@dataclass(frozen=True)
class ConsumerOptions:
    """How a stream consumer is made (``env.consumer(stream, callback, options=...)``, or its keywords).

    :param offset: where it starts: an :class:`OffsetSpec`, or ``"first"``, ``"last"``, ``"next"`` (default), an
        absolute offset, a ``datetime`` or an interval such as ``"1h"`` (kept as the :class:`OffsetSpec` it means).
    :param name: the consumer's name: needed for offset tracking and single active consumer.
    :param single_active: one instance of ``name`` receives at a time; another takes over on failure.
    :param on_update: for a single active consumer, called with ``(is_active, consumer)`` when it becomes active
        (or not); returns where to resume.  Default: after the stored offset, else ``offset``.
    :param tracking: store the offset on the server automatically (see :class:`OffsetTracking`).
    :param filter: only messages with these filter values (see :class:`StreamFilter`).
    :param flow: when credit is granted, so how many chunks wait in memory (see :class:`ConsumerFlow`).
    :param on_error: when the callback raises: ``"stop"`` there (``consumer.failure``: :class:`CallbackFailed`; a
        tracked offset never passes it), ``"skip"`` it (``consumer.callback_errors``), or a function
        ``(exception, context or chunk) -> "skip" | "stop"``.
    :raises ConfigurationError: any of them malformed, or tracking or single active without a name.
    """

    offset: OffsetSpec = field(default_factory=OffsetSpec.next)
    name: str | None = None
    single_active: bool = False
    on_update: Callable[[bool, Any], Awaitable[OffsetSpec] | OffsetSpec] | None = None
    tracking: OffsetTracking | None = None
    filter: StreamFilter | None = None
    flow: ConsumerFlow | None = None
    on_error: OnError = "stop"

    def __init__(self, offset: OffsetSpec | str | int | datetime.datetime = "next", *, name: str | None = None,
                 single_active: bool = False,
                 on_update: Callable[[bool, Any], Awaitable[OffsetSpec] | OffsetSpec] | None = None,
                 tracking: OffsetTracking | None = None, filter: StreamFilter | None = None,
                 flow: ConsumerFlow | None = None, on_error: OnError = "stop") -> None:
        text("ConsumerOptions.name", name, optional=True)
        flag("ConsumerOptions.single_active", single_active)
        function("ConsumerOptions.on_update", on_update, takes="(is_active, consumer) -> OffsetSpec")
        instance("ConsumerOptions.tracking", tracking, OffsetTracking)
        instance("ConsumerOptions.filter", filter, StreamFilter)
        instance("ConsumerOptions.flow", flow, ConsumerFlow)
        check_on_error(on_error, "ConsumerOptions")
        if (single_active or tracking is not None) and not name:
            raise ConfigurationError("ConsumerOptions: a consumer with single_active or offset tracking needs a name")
        values = {"offset": OffsetSpec.parse(offset), "name": name, "single_active": single_active,
                  "on_update": on_update, "tracking": tracking, "filter": filter, "flow": flow, "on_error": on_error}
        for key, value in values.items():
            object.__setattr__(self, key, value)


def settings(kind: type | tuple[type, ...], *, optional: bool = True) -> Check:
    """The check of an option that takes a ``kind`` (a settings object: a dict is refused with what to write)."""
    return partial(instance, kind=kind, optional=optional)


def entry_points(name: str, value: Any, *, optional: bool = True) -> None:
    """A URI, ``host:port`` or an Address, a list of them, or an SRV discovery (with ``discover()``)."""
    if (value is None and optional) or isinstance(value, str | Address) or callable(getattr(value, "discover", None)):
        return
    if isinstance(value, Collection) and not isinstance(value, Mapping | bytes) and all(
            isinstance(item, str | Address) for item in value):
        return
    refuse(name, "a URI, 'host:port' or an Address, a list of them, or an SrvDiscovery"
                 f"{' or None' if optional else ''}", value)


def management(name: str, value: Any, *, optional: bool = True) -> None:
    """A :class:`ManagementClient`, or a stand-in with its ``get(path)`` (tests have some)."""
    if (value is None and optional) or isinstance(value, ManagementClient) or (
            callable(getattr(value, "get", None)) and not isinstance(value, Mapping)):
        return
    refuse(name, f"a ManagementClient{' or None' if optional else ''}", value)


def _allow_list(name: str, value: Any) -> None:
    from resolvers import AllowList

    instance(name, value, AllowList)


def _client_certificate(name: str, value: Any) -> None:
    """A :class:`ClientCertificate`, or a function answering the current one."""
    if value is None or isinstance(value, ClientCertificate) or callable(value):
        return
    refuse(name, "a ClientCertificate, or a function answering the current one, or None", value)


def _subscriptions(name: str, value: Any) -> None:
    """``[("sensors/#", 1), ...]``: topic filters, each with its QoS."""
    if isinstance(value, Collection) and not isinstance(value, str | bytes | Mapping) and all(
            isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str) and item[1] in (0, 1, 2)
            and not isinstance(item[1], bool) for item in value):
        return
    refuse(name, "a list of (topic filter, QoS 0, 1 or 2) pairs", value)


CLIENT_OPTIONS: dict[str, Check | None] = {
    "username": partial(text, optional=True),
    "password": partial(text, empty=True, optional=True, secret=True),
    "credentials": settings((Credentials, TokenCredentials, ExternalLogin)),
    "client_certificate": _client_certificate,
    "vhost": partial(text, optional=True),
    "tls": settings(ssl.SSLContext),
    "tls_server_name": partial(text, optional=True),
    "resolver": resolver,
    "allow": _allow_list,
    "retry": settings(RetryPolicy, optional=False),
    "settings": settings(ClientSettings),
    "management": management,
    "connection_name": partial(text, optional=True),
    "entry_points": entry_points,
    "identify_timeout": partial(number, above=0, note="seconds"),
    "node": partial(text, optional=True),
    "client_id": partial(text, empty=True, optional=True),
    "subscriptions": _subscriptions,
    "setup": partial(function, takes="client"),
    "start": flag,
    "heartbeat": partial(whole, low=0, high=65535, note="seconds; 0: off"),
}


V = TypeVar("V", ProducerOptions, ConsumerOptions)


def given_options(kind: type[V], options: V | None, **keywords: Any) -> V:
    """``options`` (a ``kind``), or the value the keywords make, once (a factory's short form: each keyword left at
    its default is not given); both given is an error naming the keywords."""
    if options is None:
        return kind(**keywords)
    instance("options", options, kind, optional=False)
    defaults = inspect.signature(kind).parameters
    given = sorted(k for k, v in keywords.items() if v is not defaults[k].default and v != defaults[k].default)
    if given:
        raise ConfigurationError(f"give {kind.__name__} as options= or as keywords, not both: {given}")
    return options

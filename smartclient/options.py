"""What the options every client of smartclient shares take, by name: credentials, vhost, TLS, the resolver and
the allow-list, the retry policy, the management API, where to connect.  The Environment
(:mod:`smartclient.stream.options`) and the AMQP and MQTT placers check what they are given by this table
(:func:`smartclient.core.validation.checked`), each adding the options of its own; the kinds of value are
:mod:`smartclient.core.validation`'s.
"""

from __future__ import annotations

import ssl
from collections.abc import Collection, Mapping
from functools import partial
from typing import Any

from smartclient.core.address import Address
from smartclient.core.retry import RetryPolicy
from smartclient.core.settings import ClientCertificate, ClientSettings, Credentials
from smartclient.core.validation import Check, flag, function, instance, number, refuse, resolver, text, whole
from smartclient.credentials import ExternalLogin, TokenCredentials
from smartclient.management import ManagementClient

__all__ = ["CLIENT_OPTIONS", "entry_points", "management", "settings"]


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

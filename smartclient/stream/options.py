"""What each option of the :class:`~smartclient.Environment` takes, by name: the table its constructor and every
public method check what they are given by, before anything else (so before any I/O).

An option means the same in every method that takes it (``stream``, ``name``, ``flow``...); a method whose option
differs has an entry of its own (``"stored_offset.name"``: a name is needed there).  The kinds of value are
:mod:`smartclient.core.validation`'s; the consumer's handler and ``on_error`` are checked with the handler
(:func:`smartclient.stream.consumer.consumer_handler`).
"""

from __future__ import annotations

import ssl
from collections.abc import Collection, Mapping
from functools import partial
from typing import Any

from smartclient.core.address import Address
from smartclient.core.batching import BatchingPolicy
from smartclient.core.filters import StreamFilter
from smartclient.core.flow import ConsumerFlow
from smartclient.core.offsets import OffsetSpec, OffsetTracking
from smartclient.core.recovery import RecoveryPolicy
from smartclient.core.retry import RetryPolicy
from smartclient.core.settings import PoolLimits
from smartclient.core.stream_arguments import StreamArguments, validate_stream_name
from smartclient.core.topology import PlacementPolicy, Role
from smartclient.core.validation import (
    Check,
    choice,
    flag,
    function,
    instance,
    number,
    provider,
    refuse,
    resolver,
    text,
    texts,
    whole,
)
from smartclient.management import ManagementClient

__all__ = ["ENVIRONMENT_OPTIONS"]


def _stream(name: str, value: Any) -> None:
    validate_stream_name(value, name)


def _optional_stream(name: str, value: Any) -> None:
    if value is not None:
        validate_stream_name(value, name)


def _entry_points(name: str, value: Any, *, optional: bool = False) -> None:
    """A URI, ``host:port`` or an Address, a list of them, or an SrvDiscovery (checked one by one later)."""
    from resolvers import SrvDiscovery

    if (value is None and optional) or isinstance(value, str | Address | SrvDiscovery):
        return
    if isinstance(value, Collection) and not isinstance(value, Mapping | bytes) and all(
            isinstance(item, str | Address) for item in value):
        return
    refuse(name, "a URI, 'host:port' or an Address, a list of them, or an SrvDiscovery"
                 f"{' or None' if optional else ''}", value)


def _allow_list(name: str, value: Any) -> None:
    from resolvers import AllowList

    instance(name, value, AllowList)


def _mqtt_options(name: str, value: Any) -> None:
    from smartclient.mqtt.placement import MqttOptions

    instance(name, value, MqttOptions)


def _subscriptions(name: str, value: Any) -> None:
    """``[("sensors/#", 1), ...]``: topic filters, each with its QoS."""
    if isinstance(value, Collection) and not isinstance(value, str | bytes | Mapping) and all(
            isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str) and item[1] in (0, 1, 2)
            and not isinstance(item[1], bool) for item in value):
        return
    refuse(name, "a list of (topic filter, QoS 0, 1 or 2) pairs", value)


def _offset(name: str, value: Any) -> None:
    OffsetSpec.parse(value)


def _arguments(name: str, value: Any) -> None:
    StreamArguments.coerce(value)


def _settings(kind: type | tuple[type, ...], *, optional: bool = True) -> Check:
    return partial(instance, kind=kind, optional=optional)


ENVIRONMENT_OPTIONS: dict[str, Check | None] = {
    # Environment(...)
    "__init__.entry_points": _entry_points,
    "username": partial(text, optional=True),
    "password": partial(text, empty=True, optional=True),
    "vhost": partial(text, optional=True),
    "__init__.tls": _settings(ssl.SSLContext),
    "resolver": resolver,
    "placement": _settings(PlacementPolicy, optional=False),
    "retry": _settings(RetryPolicy, optional=False),
    "allow": _allow_list,
    "pool": _settings(PoolLimits, optional=False),
    "topology_max_age": partial(number, above=0, note="seconds"),
    "connection_name": text,
    "frame_max": partial(whole, low=8192, high=2**31 - 1, note="bytes"),
    "heartbeat": partial(whole, low=0, high=3600, note="seconds; 0: off"),
    "__init__.batching": _settings(BatchingPolicy, optional=False),
    "recovery": _settings(RecoveryPolicy, optional=False),
    "management": _settings(ManagementClient),
    "tls_server_name": partial(text, optional=True),
    "meter_provider": partial(provider, method="get_meter", kind="MeterProvider"),
    "tracer_provider": partial(provider, method="get_tracer", kind="TracerProvider"),
    "trace_context": flag,
    # streams, producers and consumers
    "stream": _stream,
    "invalidate.stream": _optional_stream,
    "super_stream": _stream,
    "role": _settings(Role, optional=False),
    "name": partial(text, optional=True),
    "stored_offset.name": text,
    "batching": _settings(BatchingPolicy),
    "filter_value": partial(function, takes="message -> filter value"),
    "key": partial(function, takes="message -> routing key"),
    "routing": partial(choice, choices=("hash", "key")),
    "routing_key": partial(text, empty=True),
    "offset": _offset,
    "single_active": flag,
    "on_update": partial(function, takes="(is_active, consumer) -> OffsetSpec"),
    "tracking": _settings(OffsetTracking),
    "filter": _settings(StreamFilter),
    "flow": _settings(ConsumerFlow),
    "arguments": _arguments,
    "exists_ok": flag,
    "missing_ok": flag,
    "partitions": partial(whole, low=1, optional=True),
    "binding_keys": partial(texts, optional=True),
    # AMQP 0.9.1 and MQTT
    "node": partial(text, optional=True),
    "invalidate.node": _settings(Address),
    "via": _settings((str, Address)),
    "entry_points": partial(_entry_points, optional=True),
    "options": _mqtt_options,
    "mqtt_placer.tls": _settings((ssl.SSLContext, bool)),
    "client_id": partial(text, empty=True, optional=True),
    "subscriptions": _subscriptions,
    "setup": partial(function, takes="client"),
    "start": flag,
    "size": partial(whole, low=1),
}

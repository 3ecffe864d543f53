"""``Environment``: the one face over every wing.

An Environment is the stream wing's :class:`~smartclient.stream.environment.StreamEnvironment` (producers,
consumers, super streams, streams' topology and placement), and hands the same settings (credentials, vhost, TLS,
resolver, allow-list, retry policy, management API) to its siblings: the AMQP 0.9.1 wing
(:mod:`smartclient.amqp`), the AMQP 1.0 wing (:mod:`smartclient.amqp10`) and the MQTT wing
(:mod:`smartclient.mqtt`), each imported only when first used.  The
wings import none of each other, and none of them imports this module::

    smartclient.environment  (this face)
        ├── smartclient.stream   (rstream)
        ├── smartclient.amqp     (pika)
        ├── smartclient.amqp10   (rabbitmq-amqp-python-client)
        ├── smartclient.mqtt     (paho-mqtt)
        └── smartclient.federation  (this cluster as one broker of a topology: federated_broker)
"""

from __future__ import annotations

import ssl
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from smartclient._errors import ConfigurationError
from smartclient.core.validation import Check, checked, instance, text, whole
from smartclient.credentials import ExternalLogin
from smartclient.options import settings
from smartclient.stream.environment import StreamEnvironment
from smartclient.stream.options import ENVIRONMENT_OPTIONS

if TYPE_CHECKING:
    from smartclient.amqp.placement import AmqpPlacer, PlacedConnection
    from smartclient.amqp10.placement import Amqp10Placer
    from smartclient.federation.topology import FederatedBroker
    from smartclient.mqtt.fleet import MqttFleet
    from smartclient.mqtt.placement import MqttOptions, MqttPlacer, PlacedMqttClient

__all__ = ["Environment"]


def _mqtt_options(name: str, value: Any) -> None:
    from smartclient.mqtt.placement import MqttOptions

    instance(name, value, MqttOptions)


#: the stream wing's options, and those of the AMQP and MQTT methods
OPTIONS: dict[str, Check | None] = {
    **ENVIRONMENT_OPTIONS,
    "options": _mqtt_options,
    "mqtt_placer.tls": settings((ssl.SSLContext, bool)),
    "size": partial(whole, low=1),
    "federated_broker.name": text,
    "amqp_uri": text,
}


@checked(OPTIONS)  # every option of every method, when given, before the method runs
class Environment(StreamEnvironment):
    """Connections to a RabbitMQ cluster, each placed on the right node: stream producers on the leader,
    consumers on replicas (see :class:`~smartclient.stream.environment.StreamEnvironment` for the arguments and
    every stream method), AMQP 0.9.1 connections and MQTT clients on the nodes asked for, all through the same
    resolver.  A :class:`resolvers.LoadBalancer` resolver with a listener per protocol (``amqp=``, ``mqtt=``,
    ``mqtt_tls=``) sends each protocol's connections through its listener, and each one is checked.

    Every wing logs in with the Environment's ``credentials=`` (a password, OAuth2 tokens from a provider, or
    EXTERNAL with ``client_certificate=``).  With tokens, each wing keeps its live connections on the current token:
    stream connections and AMQP connections take it on the open connection, MQTT clients hand over to it (see
    ``docs/amqp.md`` and ``docs/mqtt.md``); :meth:`close` stops that for every wing.

    Use it as ``async with Environment(...) as env:``; bad arguments raise :class:`ConfigurationError` before any I/O.
    """

    _amqp: AmqpPlacer | None = None
    _amqp10: Amqp10Placer | None = None
    _mqtt: weakref.WeakSet[MqttPlacer] | None = None

    async def close(self) -> None:
        """Close every producer, consumer and stream connection, and stop handing new tokens to the AMQP connections
        and MQTT clients (they are the application's to close; each lasts until its token expires)."""
        if self._amqp is not None:
            self._amqp.close()
        if self._amqp10 is not None:
            self._amqp10.close()
        for placer in list(self._mqtt or ()):
            placer.close()
        await super().close()

    # -- AMQP 0.9.1 (pika) ------------------------------------------------------------------------
    def amqp_placer(self) -> AmqpPlacer:
        """The :class:`AmqpPlacer` of this Environment (its credentials, client certificate, vhost, resolver,
        allow-list and retry policy); the nodes' ``amqp/ssl`` listeners when the Environment uses TLS; through the
        load balancer's AMQP listener when the resolver is one (``LoadBalancer(..., amqp=PORT)``).  With token
        credentials every connection it handed out takes each new token (``connection.update-secret``).

        :raises ConfigurationError: no management API was given (AMQP needs it to find nodes), or the
            resolver is a load balancer without an AMQP listener.
        """
        self._check_open()
        from smartclient.amqp.placement import AmqpPlacer

        if self.management is None:
            raise ConfigurationError(
                "AMQP placement needs the management API (it lists the nodes' AMQP listeners and says which node "
                "a connection reached): Environment(..., management=ManagementClient(url, user, password))"
            )
        if self._amqp is None:
            self._amqp = self._measure(AmqpPlacer(self.management, settings=self.settings))
        return self._amqp

    def amqp_connection(self, node: str | None = None) -> PlacedConnection:
        """A pika ``BlockingConnection`` on ``node`` (full name or short name; any node if None), through the
        resolver (or the load balancer's AMQP listener), checked with the management API.

        :raises NoCandidateNode: no such node.  :raises NodeUnreachable: the LB never reached it.
        :raises AuthenticationFailed: refused credentials (:class:`TokenExpired` for a token past its expiry).
        :raises TokenProviderFailed: the token provider failed (it is asked again only after its back-off).
        """
        return self.amqp_placer().connect(node)

    # -- AMQP 1.0 (rabbitmq-amqp-python-client) --------------------------------------------------------
    def amqp10_placer(self) -> Amqp10Placer:
        """The :class:`~smartclient.amqp10.placement.Amqp10Placer` of this Environment (its credentials, client
        certificate, TLS, vhost, resolver, allow-list and retry policy; the management API, if given, for the nodes'
        listeners): through the load balancer's AMQP listener when the resolver is one (``LoadBalancer(...,
        amqp=PORT, amqp_tls=PORT)``), each connection checked by the node its Open frame names.  With tokens, each
        new one is handed to its live connections (``PUT /auth/tokens``, RabbitMQ 4.1+).  Needs the ``[amqp10]``
        extra."""
        self._check_open()
        from smartclient.amqp10.placement import Amqp10Placer

        if self._amqp10 is None:
            self._amqp10 = self._measure(Amqp10Placer(
                self.management, settings=self.settings, recovery=self.recovery,
                tracer_provider=self.telemetry.tracer_provider))
        return self._amqp10

    # -- MQTT (paho-mqtt) --------------------------------------------------------------------------
    def mqtt_placer(
        self,
        *,
        entry_points: Any = None,
        options: MqttOptions | None = None,
        tls: ssl.SSLContext | bool | None = None,
    ) -> MqttPlacer:
        """An :class:`MqttPlacer` with this Environment's credentials, client certificate, vhost, resolver,
        allow-list, retry policy and TLS name rules; through the load balancer's MQTT listener when the resolver is
        one (``LoadBalancer(..., mqtt=PORT, mqtt_tls=PORT)``), every client checked.  With token credentials its
        clients hand over to each new token (:mod:`smartclient.mqtt.handover`).

        :param entry_points: MQTT listeners (``host:port``, ``mqtt://host:port``) or a
            :class:`resolvers.SrvDiscovery` (``_mqtt._tcp.<domain>``), instead of the management API's list.
        :param tls: None: TLS if this Environment uses TLS (the nodes' ``mqtt/ssl`` listeners); False: no
            TLS; or an ``ssl.SSLContext``.
        :raises ConfigurationError: no way to find the nodes (no management API, no entry points, no load
            balancer), or the resolver is a load balancer without a listener for MQTT (or MQTT over TLS), or
            EXTERNAL (a client certificate) without TLS.
        """
        self._check_open()
        from smartclient.mqtt.placement import MqttOptions, MqttPlacer

        context = self.settings.tls if tls is None or tls is True else (tls or None)
        if tls is True and context is None:
            context = ssl.create_default_context()
        if context is None and isinstance(self.settings.credentials, ExternalLogin):
            raise ConfigurationError("MQTT with a client certificate as the identity (EXTERNAL) needs TLS: leave "
                                     "mqtt_placer(tls=) out, or give an ssl.SSLContext")
        certificate = self.settings.client_certificate if context is not None else None
        placer = self._measure(MqttPlacer(self.management, settings=replace(
            self.settings, tls=context, client_certificate=certificate), entry_points=entry_points,
            options=options if options is not None else MqttOptions()))
        if self._mqtt is None:
            self._mqtt = weakref.WeakSet()
        self._mqtt.add(placer)
        return placer

    def mqtt_client(
        self,
        client_id: str | None = None,
        node: str | None = None,
        *,
        entry_points: Any = None,
        options: MqttOptions | None = None,
        subscriptions: Sequence[tuple[str, int]] = (),
        setup: Callable[[PlacedMqttClient], None] | None = None,
        start: bool = True,
    ) -> PlacedMqttClient:
        """A connected paho client (:class:`PlacedMqttClient`) on ``node`` (any node if None), that fails
        over to the next node when its connection drops.  See :meth:`mqtt_placer` and
        :meth:`MqttPlacer.connect`.

        :raises NoCandidateNode: no such node.  :raises NodeUnreachable: the LB never reached it.
        :raises AuthenticationFailed: refused credentials (:class:`TokenExpired` for a token past its expiry).
        :raises TokenProviderFailed: the token provider failed.  :raises ConnectionFailed: no node answered.
        """
        placer = self.mqtt_placer(entry_points=entry_points, options=options)
        return placer.connect(client_id, node, subscriptions=subscriptions, setup=setup, start=start)

    def mqtt_fleet(self, size: int, *, entry_points: Any = None, options: MqttOptions | None = None,
                   **fleet: Any) -> MqttFleet:
        """An unstarted :class:`MqttFleet` of ``size`` connections (``with env.mqtt_fleet(1000) as fleet:``)."""
        from smartclient.mqtt.fleet import MqttFleet

        return MqttFleet(self.mqtt_placer(entry_points=entry_points, options=options), size, **fleet)

    # -- federation --------------------------------------------------------------------------------
    def federated_broker(self, name: str, amqp_uri: str) -> FederatedBroker:
        """This Environment's cluster as one broker of a federation topology (:mod:`smartclient.federation`): its
        management API and that API's credentials, and its vhost, come from the Environment; ``amqp_uri`` is how
        the *other* brokers reach this one's AMQP listener for their links, which only they can say.

        :raises ConfigurationError: no management API was given, or a bad name or URI (before any I/O).
        """
        self._check_open()
        from smartclient.federation.topology import FederatedBroker

        if self.management is None:
            raise ConfigurationError("a federated broker needs the management API (federation is set up through "
                                     "it): Environment(..., management=ManagementClient(url, user, password))")
        signed_in = self.management.credentials
        return FederatedBroker(name, self.management.base_url, amqp_uri, signed_in.username, signed_in.password,
                               self.settings.vhost)

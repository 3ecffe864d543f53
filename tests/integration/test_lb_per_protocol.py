"""One LoadBalancer value names the load balancer for every protocol: AMQP and MQTT connections go through
its listeners (issue 16)."""

from __future__ import annotations

import uuid
import warnings

import pytest

from resolvers import LoadBalancer
from smartclient import Address, ConfigurationError, Environment
from smartclient.testing import TestBed


def _lb(bed: TestBed, **listeners: int) -> LoadBalancer:
    host, port = bed.lb("stream")
    return LoadBalancer(Address(host, port), **listeners)


async def test_amqp_and_mqtt_go_through_the_load_balancers_listeners(rabbitmq_testbed: TestBed) -> None:
    bed = rabbitmq_testbed
    lb = _lb(bed, amqp=bed.lb("amqp")[1], mqtt=bed.lb("mqtt")[1])
    node = bed.nodes[1]
    async with Environment(bed.stream_uri(*bed.lb("stream")), resolver=lb, management=bed.management()) as env:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # the new way warns about nothing
            amqp = env.amqp_connection(node.name)
            try:
                assert amqp.node == node.name and amqp.dialled == Address(*bed.lb("amqp"))
            finally:
                amqp.close()
            client = env.mqtt_client(f"lb-{uuid.uuid4().hex[:6]}", node.name)
            try:
                assert client.node == node.name
            finally:
                client.disconnect()
                client.loop_stop()


async def test_a_load_balancer_without_the_protocols_listener_is_a_typed_error(rabbitmq_testbed: TestBed) -> None:
    bed = rabbitmq_testbed
    async with Environment(bed.stream_uri(*bed.lb("stream")), resolver=_lb(bed),
                           management=bed.management()) as env:
        with pytest.raises(ConfigurationError, match=r"no amqp listener: LoadBalancer\(\.\.\., amqp=PORT\)"):
            env.amqp_connection()
        with pytest.raises(ConfigurationError, match=r"no mqtt listener"):
            env.mqtt_client("nobody")

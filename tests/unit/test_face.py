"""The face composes its wings (issue 54): no wing in the Environment's ancestry, each wing a part built from the
one ClientSettings, the common calls kept on the face, and option values built once from the short keywords."""

from __future__ import annotations

import asyncio

import pytest

from resolvers import LoadBalancer
from smartclient import (
    ConfigurationError,
    ConsumerFlow,
    ConsumerOptions,
    Environment,
    OffsetSpec,
    ProducerOptions,
)
from smartclient.options import given_options
from smartclient.stream.wing import StreamWing


def test_no_wing_is_in_the_faces_ancestry() -> None:
    wings = ("smartclient.stream", "smartclient.amqp", "smartclient.amqp10", "smartclient.mqtt")
    assert [c for c in Environment.__mro__ if c.__module__.startswith(wings)] == []
    assert Environment.__mro__ == (Environment, object)


def test_every_wing_is_a_part_built_from_the_one_settings() -> None:
    from smartclient.management import ManagementClient

    env = Environment("rabbitmq-stream://app:pw@lb:5552/", resolver=LoadBalancer("lb:5552", mqtt=1883),
                      management=ManagementClient("http://lb:15672", "app", "pw"))  # (nothing is asked of it here)
    assert isinstance(env.streams, StreamWing) and env.streams.settings is env.settings
    assert env.mqtt.resolution.lb is not None and env.mqtt is env.mqtt  # one default MQTT placer
    assert env.settings.credentials.username == "app"


def test_the_short_keywords_build_the_value_once_and_not_beside_one() -> None:
    assert given_options(ProducerOptions, None, name="w", filter_value=None, batching=None, encoding="raw") == \
        ProducerOptions(name="w", encoding="raw")
    given = ConsumerOptions("first", name="c", flow=ConsumerFlow())
    assert given_options(ConsumerOptions, given, offset="next", name=None, single_active=False, on_update=None,
                         tracking=None, filter=None, flow=None, on_error="stop") is given
    assert given.offset == OffsetSpec.parse("first")
    with pytest.raises(ConfigurationError, match=r"ProducerOptions as options= or as keywords, not both: \['name'\]"):
        given_options(ProducerOptions, ProducerOptions(), name="w", filter_value=None, batching=None, encoding="amqp")
    with pytest.raises(ConfigurationError, match="single_active or offset tracking needs a name"):
        ConsumerOptions(single_active=True)
    with pytest.raises(ConfigurationError, match=r"ConsumerOptions\.flow"):
        ConsumerOptions(flow=3)  # type: ignore[arg-type]

    async def scenario() -> None:  # through the face: checked before any I/O (nothing listens there)
        env = Environment("rabbitmq-stream://guest:guest@127.0.0.1:1/")
        with pytest.raises(ConfigurationError, match=r"ConsumerOptions\.name"):
            await env.consumer("s", lambda m, c: None, name=7)  # type: ignore[arg-type]

    asyncio.run(scenario())

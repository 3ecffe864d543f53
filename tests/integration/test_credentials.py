"""Credentials never appear in logs, reprs, exception messages or the placement table."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest

from resolvers import LoadBalancer
from smartclient import Address, Environment, SmartClientError
from smartclient.testing import TestBed

PASSWORD = "Sup3r-s3cret-" + uuid.uuid4().hex[:6]


@pytest.fixture
def app_user(rabbitmq_testbed: TestBed) -> Iterator[str]:
    user = f"app-{uuid.uuid4().hex[:6]}"
    with rabbitmq_testbed.management() as api:
        api.put(f"/api/users/{user}", {"password": PASSWORD, "tags": ""})
        api.put(f"/api/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"})
    yield user
    with rabbitmq_testbed.management() as api:
        api.delete(f"/api/users/{user}")


async def test_password_never_leaks(rabbitmq_testbed: TestBed, app_user: str, rabbitmq_unique_name: str,
                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    host, port = rabbitmq_testbed.lb("stream")
    uri = f"rabbitmq-stream://{app_user}:{PASSWORD}@{host}:{port}/"
    texts: list[str] = []
    async with Environment(uri, resolver=LoadBalancer(Address(host, port))) as env:
        await env.create_stream(rabbitmq_unique_name)
        producer = await env.producer(rabbitmq_unique_name, name="writer")
        consumer = await env.consumer(rabbitmq_unique_name, lambda m, c: None)
        await producer.send_wait(b"x")
        texts += [repr(env), repr(env.settings), repr(producer), repr(consumer), str(env.settings.credentials)]
        texts += [record.row() for record in env.placements()]
        texts += [repr(record) for record in env.placements()]
        await env.delete_stream(rabbitmq_unique_name)
    for wrong in (f"rabbitmq-stream://{app_user}:{PASSWORD}@{host}:{port}/no-such-vhost",
                  f"rabbitmq-stream://{app_user}:{PASSWORD}x@{host}:{port}/",
                  f"rabbitmq-stream://{app_user}:{PASSWORD}@{host}:{port}/a/b"):
        with pytest.raises(SmartClientError) as info:
            async with Environment(wrong, resolver=LoadBalancer(Address(host, port))):
                pass
        texts.append(str(info.value))
        texts.append(repr(info.value))
    texts += [record.getMessage() for record in caplog.records]
    assert texts and not [t for t in texts if PASSWORD in t]

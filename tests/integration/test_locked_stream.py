"""Streams on the locked test bed: typed errors for tokens that cannot be had, are refused or are past their
expiry, and SASL EXTERNAL with a client certificate (rotated too).  The two-minute soak of 20 s tokens runs streams,
AMQP and MQTT together: tests/integration/test_locked_amqp_mqtt.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from smartclient import (
    AuthenticationFailed,
    ClientCertificate,
    Environment,
    TokenCredentials,
    TokenExpired,
    TokenProviderFailed,
)
from smartclient.core.retry import Backoff
from smartclient.testing import TestBed
from smartclient.testing.oauth import TokenAuthority
from smartclient.testing.streams import delete_streams

from ..conftest import wait_until


def entry(bed: TestBed) -> str:
    node = bed.nodes[0]
    return f"rabbitmq-stream://{node.host}:{node.stream_port}/"


def tls_entry(bed: TestBed) -> str:
    node = bed.nodes[0]
    return f"rabbitmq-stream+tls://{node.host}:{node.stream_tls_port}/"


async def test_a_revoked_subject_gives_a_typed_error_and_no_retry_storm(
        rabbitmq_testbed: TestBed, rabbitmq_tokens: TokenAuthority, rabbitmq_unique_name: str) -> None:
    subject = f"revoked-{rabbitmq_unique_name}"
    provider = rabbitmq_tokens.provider(subject, lifetime=6.0)
    credentials = TokenCredentials(provider, refresh_at=0.5, jitter=0.05, retry=Backoff(0.5, 2.0, 4.0))
    async with Environment(entry(rabbitmq_testbed), credentials=credentials) as env:
        await env.create_stream(rabbitmq_unique_name)
        try:
            producer = await env.producer(rabbitmq_unique_name)
            await producer.send(b"before")
            rabbitmq_tokens.revoke(subject)
            calls = provider.calls
            window = 12.0
            await asyncio.sleep(window)  # a window, not a wait: how often the provider is asked in it is the point
            asked = provider.calls - calls
            # 0.5, 1, 2, 4, 4 s apart: at most 6 in 12 s (a storm would be thousands)
            assert 1 <= asked <= 6, f"the provider was asked {asked} times in {window:.0f} s"
            assert credentials.failures >= asked
            # a new connection gets the typed error at once, naming the provider and the connection
            with pytest.raises(TokenProviderFailed, match="TokenRevoked") as info:
                async with Environment(entry(rabbitmq_testbed), credentials=credentials) as other:
                    await other.producer(rabbitmq_unique_name)
            assert info.value.provider == credentials.name
        finally:
            rabbitmq_tokens.restore()
    await delete_streams(rabbitmq_testbed, rabbitmq_unique_name)  # as guest: the revoked subject cannot


async def test_a_token_the_broker_refuses_is_typed_on_connect_and_on_a_live_connection(
        rabbitmq_testbed: TestBed, rabbitmq_tokens: TokenAuthority) -> None:
    untrusted = TokenCredentials(lambda: rabbitmq_tokens.mint(lifetime=60, key="untrusted"))
    with pytest.raises(AuthenticationFailed, match="refused the credentials"):
        async with Environment(entry(rabbitmq_testbed), credentials=untrusted):
            pass
    # a live connection handed a refused token keeps its old one and says so
    keys = iter(["trusted", "untrusted", "untrusted", "untrusted"])

    def provider() -> tuple[str, float]:
        key = next(keys, "untrusted")
        return rabbitmq_tokens.mint(lifetime=4.0, key=None if key == "trusted" else key)

    credentials = TokenCredentials(provider, refresh_at=0.5, jitter=0.05)
    async with Environment(entry(rabbitmq_testbed), credentials=credentials) as env:
        # the locator connection opened with the first token
        await wait_until(lambda: env.streams.connector.secret_failures >= 1, 15,
                         "a refused token on the live connection")
        assert env.streams.connector.secret_updates == 0


async def test_an_expired_token_at_connect_time_names_its_expiry(
        rabbitmq_testbed: TestBed, rabbitmq_tokens: TokenAuthority) -> None:
    rabbitmq_tokens.expire_early(-30)  # the identity provider hands out tokens that expired 30 s ago
    credentials = TokenCredentials(rabbitmq_tokens.provider(lifetime=20.0), name="the bed's IdP")
    with pytest.raises(TokenExpired, match=r"the bed's IdP answered a token that expired at \d{4}-\d\d-\d\dT.*Z "
                                           r"\(\d+ s ago\)") as info:
        async with Environment(entry(rabbitmq_testbed), credentials=credentials):
            pass
    assert info.value.expires_at is not None and info.value.expires_at < time.time()


async def test_external_with_a_client_certificate_and_a_rotated_one_on_the_next_connection(
        rabbitmq_testbed: TestBed, rabbitmq_unique_name: str) -> None:
    bed: Any = rabbitmq_testbed
    issued = bed.client_certificate()
    current = {"cert": ClientCertificate(issued.cert_file, issued.key_file)}
    context = bed.tls_context()
    async with Environment(tls_entry(bed), tls=context, client_certificate=lambda: current["cert"]) as env:
        await env.create_stream(rabbitmq_unique_name)
        try:
            producer = await env.producer(rabbitmq_unique_name)
            await producer.send(b"by certificate")

            def users() -> set[str]:
                with bed.management() as api:
                    return {c["user"] for c in api.get("/api/stream/connections")}

            await wait_until(lambda: issued.common_name in users(), 15, "the connection listed as its certificate's")
            rotated = bed.rotate_client_certificate(issued.common_name)
            assert rotated.cert_file != issued.cert_file
            issued.cert_file.unlink()  # the old certificate is gone: only the rotated one can open a connection
            issued.key_file.unlink()
            current["cert"] = ClientCertificate(rotated.cert_file, rotated.key_file)
            consumer_got: list[bytes] = []

            async def on_message(message: bytes, context: Any) -> None:
                consumer_got.append(bytes(message))

            await env.consumer(rabbitmq_unique_name, on_message, offset="first")  # a new connection (a replica)
            await wait_until(lambda: consumer_got == [b"by certificate"], 10, "the message, read by certificate")
        finally:
            await env.delete_stream(rabbitmq_unique_name, missing_ok=True)


async def test_a_client_certificate_without_tls_is_refused_before_any_io(rabbitmq_testbed: TestBed) -> None:
    from smartclient import ConfigurationError

    with pytest.raises(ConfigurationError, match="needs TLS"):
        Environment(entry(rabbitmq_testbed), client_certificate=ClientCertificate("client.pem"))



def test_the_management_api_takes_the_current_token(rabbitmq_testbed: TestBed, rabbitmq_tokens: TokenAuthority) -> None:
    from smartclient.management import ManagementClient

    provider = rabbitmq_tokens.provider(lifetime=20.0)
    url = rabbitmq_testbed.nodes[0].management_url
    with ManagementClient(url, credentials=TokenCredentials(provider)) as api:
        assert api.get("/api/overview")["cluster_name"]
        assert api.get("/api/whoami")["name"] == "smartclient-test"
    assert provider.calls == 1  # one token for both requests

"""Refusals end (issue 53): on the locked bed, through the round-robin load balancer, credentials that turn bad
stop every stream handle typed, fail what it had pending, and dial no storm; a client certificate the broker does
not trust is the same :class:`CertificateRejected` on every wing, raised at once; a management call signed with a
refused token says the refusal; an MQTT ``setup=`` goes only on the client the application receives."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from resolvers import LoadBalancer
from smartclient import (
    Address,
    AuthenticationFailed,
    CertificateRejected,
    ClientCertificate,
    Environment,
    HandleClosed,
    PublishFailed,
    RecoveryFailed,
    TokenCredentials,
    TokenExpired,
)
from smartclient.testing import TestBed
from smartclient.testing.oauth import DEFAULT_SCOPES, RESOURCE_SERVER_ID, TokenAuthority
from smartclient.testing.streams import delete_streams

from ..conftest import wait_until, wait_until_sync

LIFETIME = 12.0  #: the issue's tokens: 12 s, refreshed at about 9 s
#: topic rights too, for MQTT (the bed's default scopes have none: the broker closes a connection that publishes)
SCOPES = [*DEFAULT_SCOPES, f"{RESOURCE_SERVER_ID}.read:*/*/*", f"{RESOURCE_SERVER_ID}.write:*/*/*"]


class TurningBad:
    """A token provider that answers good 12 s tokens until :meth:`turn` (then expired ones, or ones signed by a key
    the broker does not trust); ``turned_at`` is when it turned (monotonic)."""

    def __init__(self, tokens: TokenAuthority, how: str) -> None:
        self.tokens, self.how = tokens, how
        self.turned_at: float | None = None

    def turn(self) -> None:
        self.turned_at = time.monotonic()

    def __call__(self) -> tuple[str, float]:
        if self.turned_at is None:
            return self.tokens.mint("refusals", LIFETIME, SCOPES)
        if self.how == "expired":
            return self.tokens.mint("refusals", -30.0, SCOPES)
        return self.tokens.mint("refusals", 60.0, SCOPES, key="untrusted")


def lb_environment(bed: TestBed, credentials: Any = None, **more: Any) -> Environment:
    host, port = bed.lb("stream")
    more.setdefault("resolver", LoadBalancer(Address(host, port)))
    return Environment(bed.stream_uri(host, port), credentials=credentials, **more)


def record_dials(connector: Any, provider: TurningBad) -> list[str]:
    """What each dial from now on was for, and how it ended, in seconds after the provider turned (shown when a
    test finds more than it allows)."""
    dials: list[str] = []
    dial_once = connector._dial_once

    async def recorded(target: Any, name: str, *args: Any) -> Any:
        began = time.monotonic() - (provider.turned_at or 0.0)
        try:
            conn = await dial_once(target, name, *args)
        except BaseException as exc:
            dials.append(f"{name} at {began:.2f} s: {type(exc).__name__}")
            raise
        dials.append(f"{name} at {began:.2f} s: {conn.node}")
        return conn

    connector._dial_once = recorded
    return dials


def chain(error: BaseException | None) -> list[BaseException]:
    found = []
    while error is not None:
        found.append(error)
        error = error.__cause__
    return found


@pytest.mark.parametrize("how", ["expired", "untrusted"])
async def test_stream_handles_whose_tokens_turn_bad_stop_typed_fail_what_is_pending_and_dial_no_storm(
        rabbitmq_testbed: TestBed, rabbitmq_tokens: TokenAuthority, rabbitmq_unique_name: str, how: str) -> None:
    stream, other = rabbitmq_unique_name, f"{rabbitmq_unique_name}-super"
    provider = TurningBad(rabbitmq_tokens, how)
    credentials = TokenCredentials(provider, name="turning-idp")
    refusal = TokenExpired if how == "expired" else AuthenticationFailed
    try:
        async with lb_environment(rabbitmq_testbed, credentials) as env:
            await env.create_stream(stream)
            await env.create_super_stream(other, partitions=2)
            producer = await env.producer(stream)
            consumer = await env.consumer(stream, lambda message, context: None, offset="first")
            partitioned = await env.super_stream_producer(other, routing="hash", key=lambda body: body.decode())
            await wait_until(lambda: credentials.refreshes >= 1, 3 * LIFETIME, "one token refresh")
            provider.turn()
            held = credentials.token
            assert held is not None
            opened = env.streams.connector.opened
            dials = record_dials(env.streams.connector, provider)
            pending: list[asyncio.Future[Any]] = []
            sent_at: list[float] = []
            while producer.failure is None and time.monotonic() - provider.turned_at < 40:  # type: ignore[operator]
                pending.append(await producer.submit(b"x"))
                sent_at.append(time.time())
                await asyncio.sleep(0.05)
            await wait_until(lambda: consumer.failure is not None and all(
                p.failure is not None for p in partitioned.producers.values()), 10, "the consumer and every partition "
                "to stop")
            took = time.monotonic() - provider.turned_at  # type: ignore[operator]
            assert took < 30, f"the handles stopped {took:.1f} s after the provider turned"
            for handle in (producer, consumer, *partitioned.producers.values()):
                assert isinstance(handle.failure, RecoveryFailed) and "refused" in str(handle.failure)
                assert isinstance(handle.failure.cause, refusal), handle.failure  # named: the refusal itself
                assert type(handle.failure.cause).__name__ in str(handle.failure)
            # every message ends confirmed (before the loss) or failed with the handle's failure, none unanswered
            outcomes = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 5)
            failed = [o for o in outcomes if isinstance(o, PublishFailed)]
            assert all(producer.failure in chain(o) for o in failed), failed[:1]
            assert all(isinstance(o, PublishFailed) or o.confirmed for o in outcomes), outcomes[-1]
            if how == "untrusted":
                # the refused token was taken back: the handles went on with the one they had until it expired, and
                # every message sent until 1.5 s before that is confirmed
                assert credentials.refusals >= 1
                early = [o for o, at in zip(outcomes, sent_at, strict=True) if at < held.expires_at - 1.5]
                assert early and all(not isinstance(o, BaseException) and o.confirmed for o in early), (
                    f"{sum(isinstance(o, BaseException) for o in early)} of {len(early)} messages sent before the "
                    f"old token's expiry failed")
                assert producer.failure is not None and producer.failure.cause is not None
            with pytest.raises((PublishFailed, HandleClosed)):
                await producer.send_wait(b"after")
            # a metadata read, and the locator it needs, say the refusal at once (no "no answer in 3 s")
            env.streams.invalidate()
            with pytest.raises(refusal):
                await asyncio.wait_for(env.topology(stream), 5)
            dialled = env.streams.connector.opened - opened
            print(f"{how}: {dialled} connections dialled after the provider turned: {dials}")
            assert dialled <= 3, f"{dialled} connections dialled after the provider turned: {dials}"
            quiet = env.streams.connector.opened
            await asyncio.sleep(5)  # a window, not a wait: nothing may be dialled in it
            assert env.streams.connector.opened == quiet
    finally:
        await delete_streams(rabbitmq_testbed, stream, f"{other}-0", f"{other}-1")
        async with lb_environment(rabbitmq_testbed) as env:  # as guest
            await env.delete_super_stream(other, missing_ok=True)


# -- a client certificate the broker does not trust ---------------------------------------------------------------
@pytest.fixture(scope="module")
def rogue_certificate(tmp_path_factory: pytest.TempPathFactory) -> ClientCertificate:
    """A client certificate from a CA the bed does not trust."""
    import trustme

    directory: Path = tmp_path_factory.mktemp("rogue")
    issued = trustme.CA().issue_cert("rogue@clients.smartclient.test", common_name="rogue")
    (directory / "rogue.key").write_bytes(issued.private_key_pem.bytes())
    (directory / "rogue.pem").write_bytes(b"".join(p.bytes() for p in issued.cert_chain_pems))
    return ClientCertificate(directory / "rogue.pem", directory / "rogue.key")


@pytest.mark.parametrize("through", ["direct", "lb"])
async def test_an_untrusted_client_certificate_is_certificate_rejected_on_every_wing_at_once(
        rabbitmq_testbed: TestBed, rogue_certificate: ClientCertificate, through: str) -> None:
    bed = rabbitmq_testbed
    node = bed.nodes[0]
    host, port = bed.lb("stream_tls") if through == "lb" else (node.host, node.stream_tls_port)
    resolver = LoadBalancer(Address(host, port), mqtt_tls=Address(*bed.lb("mqtt_tls"))) if through == "lb" else None
    began = time.monotonic()
    with pytest.raises(CertificateRejected, match="refused the client certificate"):
        async with Environment(f"rabbitmq-stream+tls://{host}:{port}/", tls=bed.tls_context(),
                               client_certificate=rogue_certificate, resolver=resolver):
            pass
    assert time.monotonic() - began < 5
    env = Environment(f"rabbitmq-stream+tls://{host}:{port}/", management=bed.management(), tls=bed.tls_context(),
                      client_certificate=rogue_certificate, resolver=resolver)  # (its stream wing not started)
    try:
        mqtt = env.mqtt_placer()
        wings: dict[str, tuple[Any, Any]] = {
            "mqtt": (mqtt, lambda: mqtt.connect(f"rogue-{uuid.uuid4().hex[:6]}", node.short))}
        if through == "direct":  # (the bed's LB has no AMQPS listener)
            wings["amqp"] = (env.amqp, lambda: env.amqp_connection(node.short))
        for wing, (placer, connect) in wings.items():
            opened, began = placer.opened, time.monotonic()
            with pytest.raises(CertificateRejected, match="refused the client certificate"):
                await asyncio.to_thread(connect)
            assert time.monotonic() - began < 5, wing
            assert placer.opened - opened == 1, f"{wing}: not retried on another node"
    finally:
        await env.close()


# -- a management call signed with a refused token --------------------------------------------------------------
def test_a_management_call_with_a_refused_token_says_the_refusal(rabbitmq_testbed: TestBed,
                                                                  rabbitmq_tokens: TokenAuthority) -> None:
    from smartclient.management import ManagementClient

    node = rabbitmq_testbed.nodes[0]
    untrusted = TokenCredentials(lambda: rabbitmq_tokens.mint("x", 60.0, key="untrusted"), name="rogue-idp")
    with ManagementClient(node.management_url, credentials=untrusted) as api, \
            pytest.raises(AuthenticationFailed, match="refused the token from rogue-idp"):
        api.overview()
    expired = TokenCredentials(lambda: rabbitmq_tokens.mint("x", 3.0), name="late-idp")
    with ManagementClient(node.management_url, credentials=expired) as api:
        api.overview()  # valid now
        rabbitmq_tokens.expire_early(-30)
        try:
            wait_until_sync(lambda: time.time() > expired.token.expires_at + 1, 10, "the token's expiry")  # type: ignore[union-attr]
            with pytest.raises(AuthenticationFailed):  # a token past its expiry: refused, typed (TokenExpired)
                api.overview()
        finally:
            rabbitmq_tokens.restore()


# -- setup= only on the client the application receives ------------------------------------------------------------
async def test_mqtt_setup_goes_only_on_the_client_placed(rabbitmq_testbed: TestBed) -> None:
    bed = rabbitmq_testbed
    events: list[tuple[str, int]] = []

    def setup(client: Any) -> None:
        events.append(("setup", id(client)))
        client.on_connect = lambda c, u, flags, reason, props: events.append(("connect", id(c)))
        client.on_disconnect = lambda c, u, flags, reason, props: events.append(("disconnect", id(c)))

    async with lb_environment(bed, management=bed.management(), resolver=LoadBalancer(
            Address(*bed.lb("stream")), mqtt=Address(*bed.lb("mqtt")))) as env:
        placer = env.mqtt_placer()
        for node in bed.nodes:  # through a round-robin LB: most placements dial more than once
            opened = placer.opened
            client = await asyncio.to_thread(placer.connect, f"setup-{uuid.uuid4().hex[:6]}", node.short,
                                             setup=setup)
            kept = id(client)
            try:
                await wait_until(lambda: ("connect", kept) in events, 5,  # noqa: B023  (awaited here)
                                 "on_connect of the client kept")
                assert [e for e in events if e[1] != kept] == [], (placer.opened - opened, events)
                assert events.count(("setup", kept)) == 1 and events.count(("connect", kept)) == 1
            finally:
                client.disconnect()
                client.loop_stop()
            events.clear()

"""Placement through the test bed's SNI ingress (HAProxy ``req.ssl_sni``, one TLS port per protocol): each
connection sends its node's name and lands there on the first try, streams, AMQP and MQTT alike; a node whose
route is down falls through to the next candidate; a misrouted route is a typed error naming the SNI name, and a
misroute past TLS is caught by the node check (issue 31)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from smartclient import (
    Address,
    CertificateRejected,
    Misrouted,
    PlacementError,
    RetryPolicy,
    Role,
)
from smartclient.stream.resolve_offset import KEY as RESOLVE_KEY
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams, stream_members

from .conftest import sni_environment

QUICK = RetryPolicy(max_attempts=4, max_time=10.0, backoff_initial=0.05, backoff_max=0.2)


def sessions(bed: TestBed, protocol: str) -> dict[str, int]:
    return bed.sni_sessions(protocol)


def short(node: Address) -> str:
    """``rabbit-2`` for the stream node ``rabbit-2.smartclient.test:port``."""
    return node.host.split(".")[0]


def added(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}


@contextmanager
def hostnames(bed: TestBed) -> Iterator[None]:
    """The nodes advertise ``rabbit-N.smartclient.test`` (their stream TLS names) meanwhile, so the SNI rule of a
    stream target tells the nodes apart (they advertise ``localhost`` otherwise)."""
    bed.advertise_hostnames(True)
    try:
        yield
    finally:
        bed.advertise_hostnames(False)


async def test_streams_land_on_their_node_on_the_first_try(rabbitmq_faulty_testbed: TestBed) -> None:
    bed = rabbitmq_faulty_testbed
    streams = [f"sni-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    for i, stream in enumerate(streams):
        await create_stream_led_by(bed, stream, i)
    try:
        with hostnames(bed):
            before = sessions(bed, "stream")
            async with sni_environment(bed) as env:
                for stream in streams:
                    producer = await env.producer(stream)
                    consumers = [await env.consumer(stream, lambda m, c: None) for _ in range(2)]
                    leader, replicas = stream_members(bed, stream)  # (their plain stream listeners)
                    assert producer.node is not None and producer.node.host == leader.host
                    assert {c.node.host for c in consumers if c.node} == {r.host for r in replicas}
                    await producer.send_wait(b"through the ingress")
                records = env.placements()
                # and the metadata connection, and the second one where 4.3 resolves a consumer's start offset
                resolves = RESOLVE_KEY in await env.streams.command_versions()
                needed = len({(r.role, r.node) for r in records}) + 1 + resolves
                connector = env.streams.connector
                # (a dial still opening after hedge_after gets a second one beside it: a loaded CI machine's did)
                assert needed == 7 + resolves and not connector.mismatches  # 0 wrong
                assert connector.opened == needed + connector.hedged, (connector.opened, needed, connector.hedged)
                assert {c.client.server_hostname for c in env.streams.connector.connections} == \
                    {f"rabbit-{i}.smartclient.test" for i in (1, 2, 3)}
                assert {c.dialled for c in env.streams.connector.connections} == {Address(*bed.sni("stream"))}
            took = added(before, sessions(bed, "stream"))
        opened = needed + connector.hedged
        assert took["frontend"] == opened  # LB sessions == connections the handles need (and hedges): none wasted
        assert sum(n for key, n in took.items() if key != "frontend") == opened
        assert {r.role for r in records} == {Role.PRODUCER, Role.CONSUMER}
    finally:
        await delete_streams(bed, *streams)


async def test_amqp_and_mqtt_land_on_their_node_on_the_first_try(rabbitmq_testbed: TestBed) -> None:
    bed = rabbitmq_testbed
    async with sni_environment(bed) as env:
        before = {p: sessions(bed, p) for p in ("amqp", "mqtt")}
        handles: list[Any] = []
        try:
            for node in bed.nodes:
                connection = env.amqp_connection(node.short)
                handles.append(connection)
                assert (connection.node, connection.attempts) == (node.name, 1)
                assert connection.dialled == Address(*bed.sni("amqp"))
                client = env.mqtt_client(f"sni-{uuid.uuid4().hex[:6]}", node.name)
                handles.append(client)
                assert (client.node, client.attempts) == (node.name, 1)
            for protocol in ("amqp", "mqtt"):
                took = added(before[protocol], sessions(bed, protocol))
                assert took == {"frontend": 3, **{n.short: 1 for n in bed.nodes}}, protocol  # LB sessions == handles
            assert env.amqp.misrouted == env.mqtt_placer().misrouted == 0
        finally:
            for handle in handles:
                if hasattr(handle, "loop_stop"):
                    handle.disconnect()
                    handle.loop_stop()
                else:
                    handle.close()


async def test_a_node_whose_route_is_down_falls_through(rabbitmq_faulty_testbed: TestBed) -> None:
    bed = rabbitmq_faulty_testbed
    first = bed.nodes[0]
    stream = f"sni-down-{uuid.uuid4().hex[:6]}"
    await create_stream_led_by(bed, stream, 2)  # its replicas: rabbit-1 and rabbit-2
    try:
        async with sni_environment(bed, retry=QUICK) as env:
            bed.sni_route_down(first.short, "amqp")
            connection = env.amqp_connection()  # any node: rabbit-1 first, then the next
            try:
                assert connection.node == bed.nodes[1].name and connection.attempts == 2
            finally:
                connection.close()
            with pytest.raises(PlacementError, match=r"sent the SNI name 'rabbit-1\.smartclient\.test' for node "
                                                     r"rabbit-1@localhost: the ingress may have no route to it"):
                env.amqp_connection(first.short)
            bed.sni_route_down(first.short, "mqtt")
            client = env.mqtt_client(f"sni-{uuid.uuid4().hex[:6]}")
            try:
                assert client.node == bed.nodes[1].name and client.attempts == 2
            finally:
                client.disconnect()
                client.loop_stop()
            with hostnames(bed):
                down, other = (await env.streams.candidates(stream, Role.CONSUMER)).tiers[0]  # the replicas, in turn
                # the second metadata connection (a consumer's start offset is resolved there), opened now
                assert await env.stored_offset(stream, "nobody") is None
                bed.sni_route_down(short(down), "stream")
                opened = env.streams.connector.opened
                consumer = await env.consumer(stream, lambda m, c: None)
                assert consumer.node == other and env.streams.connector.opened == opened + 2  # one failed, one landed
                assert not env.streams.connector.mismatches
    finally:
        await delete_streams(bed, stream)


async def test_a_misrouted_route_is_a_typed_error_naming_the_sni_name(rabbitmq_faulty_testbed: TestBed) -> None:
    """Each node's certificate names only itself: a misroute fails TLS first, never retried elsewhere."""
    bed = rabbitmq_faulty_testbed
    stream = f"sni-mis-{uuid.uuid4().hex[:6]}"
    await create_stream_led_by(bed, stream, 1)
    expected = r"'rabbit-2\.smartclient\.test'.*the ingress may have misrouted it"
    try:
        async with sni_environment(bed, retry=QUICK) as env:
            for protocol in ("amqp", "mqtt", "stream"):
                bed.sni_misroute("rabbit-2", "rabbit-3", protocol)
            with pytest.raises(CertificateRejected, match=expected):
                env.amqp_connection("rabbit-2")
            with pytest.raises(CertificateRejected, match=expected):
                env.mqtt_client(f"sni-{uuid.uuid4().hex[:6]}", "rabbit-2")
            with hostnames(bed), pytest.raises(CertificateRejected, match=expected):
                await env.producer(stream)  # its leader is rabbit-2
    finally:
        await delete_streams(bed, stream)


async def test_a_misroute_past_tls_is_caught_by_the_node_check(rabbitmq_faulty_testbed: TestBed) -> None:
    """A certificate that names every node (a wildcard) lets a misroute through TLS; here a context that checks
    the chain but not the name does the same.  The node each connection reports then catches it: closed, counted,
    never used as the node it reached, and the next candidate tried."""
    bed = rabbitmq_faulty_testbed
    lenient = bed.tls_context()
    lenient.check_hostname = False
    stream = f"sni-check-{uuid.uuid4().hex[:6]}"
    await create_stream_led_by(bed, stream, 2)  # replicas on rabbit-1 and rabbit-2
    try:
        async with sni_environment(bed, tls=lenient, retry=QUICK) as env:
            bed.sni_misroute("rabbit-2", "rabbit-3", "amqp")
            with pytest.raises(PlacementError, match="misrouted") as caught:
                env.amqp_connection("rabbit-2")
            cause = caught.value.__cause__
            assert isinstance(cause, Misrouted)
            assert "'rabbit-2.smartclient.test' for node rabbit-2@localhost" in str(cause)
            assert "reached node rabbit-3@localhost" in str(cause)
            assert env.amqp.misrouted == len(caught.value.attempts) == QUICK.max_attempts
            with hostnames(bed):
                # the replicas, in turn
                misrouted, other = (await env.streams.candidates(stream, Role.CONSUMER)).tiers[0]
                bed.sni_misroute(short(misrouted), "rabbit-3", "stream")  # its route reaches the leader
                consumer = await env.consumer(stream, lambda m, c: None)
                assert consumer.node == other  # the next candidate, not the leader it reached
                assert env.streams.connector.mismatches == {"misrouted": 1}  # closed: nothing parked as the leader
                assert len(env.streams.connector.parking) == 0
    finally:
        await delete_streams(bed, stream)

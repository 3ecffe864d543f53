"""TLS verifies the name the user meant: the advertised node name behind a remap, the LB's name through
the LB; a certificate that does not match fails closed."""

from __future__ import annotations

import pytest

from resolvers import Chain, DnsResolver, LoadBalancer
from smartclient import Address, CertificateRejected, Environment
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams


def _tls_uri(bed: TestBed, host: str, port: int) -> str:
    return bed.stream_uri(host, port).replace("rabbitmq-stream://", "rabbitmq-stream+tls://")


async def test_remapped_container_names_are_verified_not_the_ip(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    await create_stream_led_by(bed, rabbitmq_unique_name, 1)
    bed.advertise_hostnames(True)
    try:
        node = bed.nodes[0]
        dns = DnsResolver([bed.dns_address[0]], port=bed.dns_address[1])
        async with Environment(_tls_uri(bed, node.host, node.stream_tls_port), tls=bed.tls_context(),
                               resolver=dns) as env:
            producer = await env.producer(rabbitmq_unique_name)
            consumer = await env.consumer(rabbitmq_unique_name, lambda m, c: None)
            await producer.send_wait(b"over TLS")
            assert producer.node == Address("rabbit-2.smartclient.test", bed.nodes[1].stream_tls_port)
            placed = [c for c in env.connector.connections if c.node == producer.node]
            assert placed and all(c.dialled.host == "127.0.0.1" for c in placed)
            assert {c.client.server_hostname for c in placed} == {"rabbit-2.smartclient.test"}
            assert consumer.node is not None and consumer.node.host.endswith(".smartclient.test")
    finally:
        await delete_streams(bed, rabbitmq_unique_name)


async def test_through_the_lb_tls_verifies_the_lb_name(rabbitmq_testbed: TestBed, rabbitmq_unique_name: str) -> None:
    await create_stream_led_by(rabbitmq_testbed, rabbitmq_unique_name, 2)
    host, port = rabbitmq_testbed.lb("stream_tls")
    dns = DnsResolver([rabbitmq_testbed.dns_address[0]], port=rabbitmq_testbed.dns_address[1])
    resolver = Chain(LoadBalancer(Address("lb.smartclient.test", port)), dns)
    try:
        async with Environment(_tls_uri(rabbitmq_testbed, "lb.smartclient.test", port),
                               tls=rabbitmq_testbed.tls_context(),
                               resolver=resolver) as env:
            producer = await env.producer(rabbitmq_unique_name)
            assert producer.node == Address("localhost", rabbitmq_testbed.nodes[2].stream_tls_port)
            assert {c.client.server_hostname for c in env.connector.connections} == {"lb.smartclient.test"}
            assert {c.dialled for c in env.connector.connections} == {Address(host, port)}
    finally:
        await delete_streams(rabbitmq_testbed, rabbitmq_unique_name)


async def test_a_certificate_that_does_not_match_fails_closed(rabbitmq_testbed: TestBed) -> None:
    node = rabbitmq_testbed.nodes[0]
    with pytest.raises(CertificateRejected, match="certificate verify failed"):  # typed, and not retried
        async with Environment(_tls_uri(rabbitmq_testbed, node.host, node.stream_tls_port),
                               tls=rabbitmq_testbed.tls_context(),
                               tls_server_name="rabbit-9.smartclient.test"):
            pass

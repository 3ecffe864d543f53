"""The AMQP 1.0 wing on the locked test bed (issue 34): over TLS through the SNI ingress, each connection on the
node it named at the first try; SASL EXTERNAL with a client certificate, a rotated one used by the next connection;
tokens of 6 s renewed on the live publisher's, consumer's and look-up connections (``PUT /auth/tokens``, RabbitMQ
4.1+) with no reconnect and nothing lost."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from smartclient import ClientCertificate, Environment, RetryPolicy, TokenCredentials
from smartclient.testing import TestBed
from smartclient.testing.oauth import DEFAULT_SCOPES, TokenAuthority

from .conftest import wait_until_sync
from .test_sni_placement import bed_name, router

pytest.importorskip("rabbitmq_amqp_python_client", reason="the [amqp10] extra (rabbitmq-amqp-python-client) is not "
                    "installed")

from .test_amqp10 import queue  # noqa: F401  (the fixture: a quorum queue of its own)

#: a token's lifetime: refreshed at about 4.5 s, so a 14 s run hands over two or three of them
LIFETIME = 6.0
RUN = 14.0


def amqp10_rows(bed: TestBed) -> dict[str, dict[str, Any]]:
    """The management API's AMQP 1.0 connections, by container id."""
    with bed.management() as api:
        return {str(row.get("container_id")): row for row in api.get("/api/connections")
                if "1-0" in str(row.get("protocol"))}


def row_of(bed: TestBed, name: str) -> dict[str, Any]:
    found: dict[str, Any] = wait_until_sync(lambda: amqp10_rows(bed).get(name), 15,
                                            f"the management API to list {name}", interval=0.25)
    return found


def test_over_tls_through_the_sni_ingress_each_connection_lands_on_its_node_at_the_first_try(
        rabbitmq_testbed: TestBed) -> None:
    bed = rabbitmq_testbed
    before = bed.sni_sessions("amqp")
    entry = bed.stream_uri(bed_name(bed.nodes[0].name), bed.nodes[0].stream_tls_port)
    env = Environment(entry.replace("rabbitmq-stream://", "rabbitmq-stream+tls://"), resolver=router(bed),
                      tls=bed.tls_context(), management=bed.management(), retry=RetryPolicy())
    placer = env.amqp10_placer()
    placed = []
    try:
        for node in reversed(bed.nodes):
            placed.append(placer.connect(node.short))
        assert [p.node for p in placed] == [n.name for n in reversed(bed.nodes)]
        assert all(p.attempts == 1 for p in placed) and placer.misrouted == 0
        assert {p.dialled for p in placed} == {placer.resolution.listener}  # every one through the ingress
        for p in placed:
            row = row_of(bed, p.name)
            assert row["ssl"] and row["node"] == p.node
        after = bed.sni_sessions("amqp")
        assert sum(after.values()) - sum(before.values()) >= len(bed.nodes)
    finally:
        for p in placed:
            p.close()
        placer.close()


def test_external_with_a_client_certificate_and_a_rotated_one_on_the_next_connection(
        rabbitmq_testbed: TestBed, rabbitmq_client_certificate: Any, queue: str) -> None:
    bed = rabbitmq_testbed
    current = [rabbitmq_client_certificate]

    def certificate() -> ClientCertificate:  # asked before each connection
        return ClientCertificate(current[0].cert_file, current[0].key_file)

    node = bed.nodes[1]
    entry = f"rabbitmq-stream+tls://{node.host}:{node.stream_tls_port}/"
    env = Environment(entry, tls=bed.tls_context(), client_certificate=certificate, management=bed.management())
    placer = env.amqp10_placer()  # no credentials: EXTERNAL, the certificate is the identity
    subjects = []
    try:
        for rotation in range(2):
            with placer.connect(node.short) as placed:
                assert placed.dialled.port == node.port("amqp_tls")
                row = row_of(bed, placed.name)
                assert row["user"] == current[0].common_name and row["auth_mechanism"] == "EXTERNAL" and row["ssl"]
                subjects.append(row["peer_cert_subject"])
            with placer.publisher(queue) as publisher:  # and it may work: its user's permissions
                publisher.publish(b"from the certificate")
            if rotation == 0:
                current[0] = bed.rotate_client_certificate()
        assert subjects[0] != subjects[1]
    finally:
        placer.close()


def test_tokens_are_renewed_on_the_live_connections_with_no_reconnect_and_nothing_lost(
        rabbitmq_testbed: TestBed, rabbitmq_tokens: TokenAuthority, queue: str) -> None:
    bed = rabbitmq_testbed
    if tuple(int(x) for x in bed.rabbitmq_version().split(".")[:2]) < (4, 1):
        pytest.skip(f"RabbitMQ {bed.rabbitmq_version()} takes no token on a live AMQP 1.0 connection (4.1+)")
    calls = [0]

    def provider() -> tuple[str, float]:
        calls[0] += 1
        return rabbitmq_tokens.mint("amqp10-renewed", LIFETIME, list(DEFAULT_SCOPES))

    node = bed.nodes[0]
    env = Environment(f"rabbitmq-stream://{node.host}:{node.stream_port}/", management=bed.management(),
                      credentials=TokenCredentials(provider, name="amqp10-idp"))
    placer = env.amqp10_placer()
    got: list[bytes] = []
    lock = threading.Lock()

    def on_message(message: Any, accept: Any) -> None:
        with lock:
            got.append(bytes(message.body))
        accept()

    sent = 0
    consumer = placer.consumer(queue, on_message)
    publisher = placer.publisher(queue)
    try:
        first = (publisher.placed, consumer.placed)
        ends = time.monotonic() + RUN
        while time.monotonic() < ends:
            publisher.publish(f"m{sent}".encode())
            sent += 1
            time.sleep(0.05)
        wait_until_sync(lambda: len(set(got)) >= sent, 20, f"the consumer to get all {sent} messages")
        assert (publisher.placed, consumer.placed) == first, "a connection was replaced"
        assert publisher.recoveries == consumer.recoveries == 0 and consumer.failure is None
        assert placer.token_failures == 0
        # every new token reached both connections (the consumer's on its own thread, woken for it)
        renewed = calls[0] - 1
        assert renewed >= 2, f"{calls[0]} tokens in {RUN} s of {LIFETIME} s tokens"
        assert publisher.placed.token_updates >= renewed - 1 and consumer.placed is not None
        wait_until_sync(lambda: consumer.placed is not None and consumer.placed.token_updates >= renewed, 10,
                        "the consumer's connection to take every token")
        assert set(got) == {f"m{i}".encode() for i in range(sent)}
    finally:
        publisher.close()
        consumer.close()
        placer.close()

"""The AMQP 1.0 wing on the locked test bed (issue 34): over TLS through the SNI ingress, each connection on the
node it named at the first try; SASL EXTERNAL with a client certificate, a rotated one used by the next connection.
Tokens renewed on live AMQP 1.0 connections: the two-minute token soak, tests/integration/test_locked_amqp_mqtt.py."""

from __future__ import annotations

from typing import Any

import pytest

from smartclient import ClientCertificate, Environment
from smartclient.testing import TestBed

from ..conftest import wait_until_sync
from .conftest import sni_environment

pytest.importorskip("rabbitmq_amqp_python_client", reason="the [amqp10] extra (rabbitmq-amqp-python-client) is not "
                    "installed")


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
    env = sni_environment(bed)
    placer = env.amqp10
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
    placer = env.amqp10  # no credentials: EXTERNAL, the certificate is the identity
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

"""MQTT with paho against the test bed: placed clients (direct, DNS SRV, load balancer, TLS), failover
with a persistent session, fleets spread over the nodes from one thread, and MQTT → stream ingestion."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from resolvers import DnsResolver, LoadBalancer, SrvDiscovery
from smartclient import (
    AuthenticationFailed,
    CertificateRejected,
    ClientSettings,
    ConfigurationError,
    Environment,
    NodeUnreachable,
    RetryPolicy,
    StreamNotFound,
)
from smartclient.core.settings import Credentials
from smartclient.management import ManagementClient
from smartclient.mqtt._paho import HeldInfo
from smartclient.mqtt.fleet import MqttFleet
from smartclient.mqtt.ingest import bind_mqtt_topics, mqtt_bindings, unbind_mqtt_topics
from smartclient.mqtt.placement import MqttOptions, MqttPlacer, PlacedMqttClient
from smartclient.stream.codec import decode_amqp
from smartclient.testing import TestBed

from ..conftest import wait_until, wait_until_sync
from .conftest import load_example


@pytest.fixture
def api(rabbitmq_testbed: TestBed) -> Iterator[ManagementClient]:
    with rabbitmq_testbed.management() as client:
        yield client


def lb(bed: TestBed, balance: str = "roundrobin") -> LoadBalancer:
    """A resolver sending every MQTT client through the test bed's MQTT listener ``balance``."""
    host, port = bed.lb("mqtt", balance)
    return LoadBalancer(f"{host}:{port}", mqtt=port)


def dns(bed: TestBed) -> DnsResolver:
    return DnsResolver([bed.dns_address[0]], port=bed.dns_address[1])


def close(*clients: PlacedMqttClient) -> None:
    for client in clients:
        client.disconnect()
        client.loop_stop()


def collector(into: list[Any]) -> Callable[[PlacedMqttClient], None]:
    def setup(client: PlacedMqttClient) -> None:
        client.on_message = lambda c, u, message: into.append(message.payload)

    return setup


def until_routed(publisher: PlacedMqttClient, topic: str, got: list[int], timeout: float = 10.0) -> None:
    """Publish probes (-1) until the subscriber gets one, then forget them.  RabbitMQ 4.0.5 acknowledges a
    SUBSCRIBE some tens of milliseconds before publishes from other connections are routed to it (they
    get PUBACK reason code 16, no matching subscribers): a test must not count on that window.  A last
    probe (-2) follows: one publisher, one topic, so once it is in, every probe routed before it is too."""

    def probed() -> bool:
        publisher.publish(topic, b"-1", qos=1).wait_for_publish(5)
        return -1 in got

    wait_until_sync(probed, timeout, f"a subscription to {topic} to become routable", interval=0.02)
    publisher.publish(topic, b"-2", qos=1).wait_for_publish(5)
    wait_until_sync(lambda: -2 in got, timeout, f"the last probe on {topic}", interval=0.02)
    got[:] = [g for g in got if g >= 0]


# -- placed clients -------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [5, "3.1.1"])
def test_a_client_sits_on_the_node_it_was_asked_for_directly_and_through_the_lb(
    rabbitmq_testbed: TestBed, api: ManagementClient, protocol: int | str
) -> None:
    options = MqttOptions(protocol=protocol)
    direct = MqttPlacer(api, options=options)
    via_lb = MqttPlacer(api, settings=ClientSettings(resolver=lb(rabbitmq_testbed)), options=options)
    for placer in (direct, via_lb):
        for node in (rabbitmq_testbed.nodes[0], rabbitmq_testbed.nodes[2]):
            client_id = f"placed-{uuid.uuid4().hex[:8]}"
            client = placer.connect(client_id, node.short)
            try:
                assert client.node == node.name
                # the truth, independently: the management API's view of this very client
                assert direct.node_of(client_id) == node.name
                if placer is via_lb:
                    assert client.dialled == lb(rabbitmq_testbed).address_for("mqtt")
                else:
                    assert client.dialled.port == node.port("mqtt")
            finally:
                close(client)


def test_a_client_finds_the_cluster_through_dns_srv(rabbitmq_testbed: TestBed, api: ManagementClient) -> None:
    srv = SrvDiscovery("_mqtt._tcp.smartclient.test", nameservers=[rabbitmq_testbed.dns_address[0]],
                       port=rabbitmq_testbed.dns_address[1])
    # without the management API: the first SRV target that answers
    anywhere = MqttPlacer(settings=ClientSettings(resolver=dns(rabbitmq_testbed)), entry_points=srv).connect()
    try:
        assert anywhere.is_connected() and anywhere.node is None
        assert anywhere.target.host.endswith(".smartclient.test") and anywhere.dialled.host == "127.0.0.1"
    finally:
        close(anywhere)
    # with it: every SRV target identified, and the client placed on the one asked for
    placer = MqttPlacer(api, settings=ClientSettings(resolver=dns(rabbitmq_testbed)), entry_points=srv)
    assert sorted(n.name for n in placer.nodes()) == sorted(n.name for n in rabbitmq_testbed.nodes)
    client = placer.connect(f"srv-{uuid.uuid4().hex[:6]}", rabbitmq_testbed.nodes[1].short)
    try:
        assert client.node == rabbitmq_testbed.nodes[1].name == placer.node_of(client.client_id)
    finally:
        close(client)


def test_environment_mqtt_client_uses_the_environments_settings(
    rabbitmq_testbed: TestBed, api: ManagementClient
) -> None:
    node = rabbitmq_testbed.nodes[0]
    got: list[bytes] = []
    env = Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port), management=api)
    sub = env.mqtt_client(f"env-sub-{uuid.uuid4().hex[:6]}", rabbitmq_testbed.nodes[2].short,
                          subscriptions=[("env/+/x", 1)], setup=collector(got))
    pub = MqttPlacer(api, settings=ClientSettings(resolver=lb(rabbitmq_testbed))).connect()
    try:
        assert sub.node == rabbitmq_testbed.nodes[2].name
        # (4.0.5 acknowledges a SUBSCRIBE a moment before other nodes' publishes are routed to it: see until_routed)
        wait_until_sync(lambda: pub.publish("env/p/x", b"probe", qos=1).wait_for_publish(5) or b"probe" in got, 10,
                        "the subscription to route", interval=0.05)
        pub.publish("env/a/x", b"across nodes", qos=1).wait_for_publish(10)
        wait_until_sync(lambda: [m for m in got if m != b"probe"] == [b"across nodes"], 20, "the message across nodes")
    finally:
        close(sub, pub)
    from resolvers import LoadBalancer
    from smartclient import Address

    stream_lb = Environment("127.0.0.1:1", resolver=LoadBalancer(Address("127.0.0.1", 1)), management=api)
    with pytest.raises(ConfigurationError, match=r"no mqtt listener: LoadBalancer\(\.\.\., mqtt=PORT\)"):
        stream_lb.mqtt_client()


def test_tls_verifies_the_advertised_name_behind_a_remap_and_fails_closed(
    rabbitmq_testbed: TestBed, api: ManagementClient
) -> None:
    node = rabbitmq_testbed.nodes[1]
    target = f"{node.short}.smartclient.test:{node.port('mqtt_tls')}"
    placer = MqttPlacer(settings=ClientSettings(resolver=dns(rabbitmq_testbed), tls=rabbitmq_testbed.tls_context()),
                        entry_points=[target])
    client = placer.connect()
    try:
        assert client.is_connected() and client.dialled.host == "127.0.0.1"
        assert client.socket().server_hostname == f"{node.short}.smartclient.test"  # verified, not the IP dialled
    finally:
        close(client)
    wrong = MqttPlacer(settings=ClientSettings(resolver=dns(rabbitmq_testbed), tls=rabbitmq_testbed.tls_context(),
                                               tls_server_name="rabbit-9.smartclient.test"),
                       entry_points=[target])
    with pytest.raises(CertificateRejected, match=r"not valid for 'rabbit-9\.smartclient\.test'"):
        wrong.connect()
    import ssl

    with pytest.raises(ConfigurationError, match="does not turn TLS verification off"):
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        MqttPlacer(settings=ClientSettings(tls=insecure), entry_points=[target]).connect()


def test_tls_through_the_lb_verifies_the_lb_name_and_checks_the_node(
    rabbitmq_testbed: TestBed, api: ManagementClient
) -> None:
    host, port = rabbitmq_testbed.lb("mqtt_tls")
    placer = MqttPlacer(api,
                        settings=ClientSettings(resolver=LoadBalancer(f"localhost:{port}", mqtt_tls=port),
                                                tls=rabbitmq_testbed.tls_context()))
    client = placer.connect(f"tls-lb-{uuid.uuid4().hex[:6]}", rabbitmq_testbed.nodes[2].short)
    try:
        assert client.node == rabbitmq_testbed.nodes[2].name == placer.node_of(client.client_id)
        assert client.socket().server_hostname == "localhost"  # the name dialled (the LB's), not a node's
    finally:
        close(client)
    wrong = MqttPlacer(api,
                       settings=ClientSettings(resolver=LoadBalancer(f"{host}:{port}", mqtt_tls=port),
                                               tls=rabbitmq_testbed.tls_context(),
                                               tls_server_name="rabbit-9.smartclient.test"))
    with pytest.raises(CertificateRejected, match=r"not valid for 'rabbit-9\.smartclient\.test'"):
        wrong.connect(f"tls-bad-{uuid.uuid4().hex[:6]}", rabbitmq_testbed.nodes[0].short)
    assert wrong.opened == 1  # not retried: another node would not change the name


def test_bad_credentials_are_a_typed_error_not_retried(rabbitmq_testbed: TestBed, api: ManagementClient) -> None:
    placer = MqttPlacer(api, settings=ClientSettings(credentials=Credentials("guest", "not-the-password")))
    started = time.monotonic()
    with pytest.raises(AuthenticationFailed, match="refused the client"):
        placer.connect(f"bad-{uuid.uuid4().hex[:6]}", rabbitmq_testbed.nodes[0].short)
    assert placer.opened == 1 and time.monotonic() - started < 10


def test_a_client_keeps_working_with_file_descriptors_above_1024(
    rabbitmq_testbed: TestBed, api: ManagementClient
) -> None:
    """paho's own loop uses select(), which cannot watch fd >= 1024 (paho.mqtt.python#183, #819)."""
    fds: list[int] = []

    def fill() -> None:  # take every free number up to past 1100, holes left by earlier tests included
        while True:
            fds.append(os.open("/dev/null", os.O_RDONLY))
            if fds[-1] > 1100:
                return

    fill()
    got: list[bytes] = []
    try:
        topic = f"fd/{uuid.uuid4().hex[:6]}"
        for _ in range(3):  # another thread of this process may free a low number meanwhile: fill it, retry
            client = MqttPlacer(api).connect(f"fd-{uuid.uuid4().hex[:6]}", subscriptions=[(topic, 1)],
                                             setup=collector(got))
            if client.socket().fileno() >= 1024:
                break
            close(client)
            fill()
        try:
            assert client.socket().fileno() >= 1024
            def seen() -> bool:  # publish until routed: SUBACK comes a little early (see docs/mqtt.md)
                client.publish(topic, b"seen", qos=1).wait_for_publish(10)
                return bool(got)

            wait_until_sync(seen, 10, "the subscription to become routable")
            assert set(got) == {b"seen"}
        finally:
            close(client)
    finally:
        for fd in fds:
            os.close(fd)


# -- failover ------------------------------------------------------------------------------------------
@pytest.mark.faults
def test_killed_node_the_client_fails_over_and_its_persistent_qos1_subscription_keeps_receiving(
    rabbitmq_faulty_testbed: TestBed, api: ManagementClient
) -> None:
    bed = rabbitmq_faulty_testbed
    got: list[int] = []
    sub_id = f"fo-{uuid.uuid4().hex[:6]}"
    session = MqttOptions(protocol=5, clean_start=False, session_expiry=600)
    sub = MqttPlacer(api, options=session).connect(
        sub_id, bed.nodes[2].short, subscriptions=[(f"fo/{sub_id}", 1)],
        setup=lambda c: setattr(c, "on_message", lambda cl, u, m: got.append(int(m.payload))))
    pub = MqttPlacer(api).connect(f"fo-pub-{uuid.uuid4().hex[:6]}", bed.nodes[0].short)
    sent = 0

    def publish(count: int) -> None:
        nonlocal sent
        for _ in range(count):
            pub.publish(f"fo/{sub_id}", str(sent), qos=1).wait_for_publish(10)
            sent += 1

    try:
        until_routed(pub, f"fo/{sub_id}", got)
        publish(100)
        wait_until_sync(lambda: len(got) >= 100, 20, lambda: f"100 messages ({len(got)} in)")
        bed.kill_node(bed.nodes[2].name)
        publish(200)  # while the subscriber is down or moving: its quorum queue keeps them
        # A message the queue had handed to the subscriber on the killed node comes back only after the quorum
        # queue's consumer_disconnected_timeout: 60 s by default from RabbitMQ 4.3 (rabbit_fifo holds a
        # suspected-down consumer's messages in case its node returns), 5 s on the test bed; 4.0 returned it
        # at once.
        wait_until_sync(lambda: len(set(got)) >= sent, 90, lambda: f"{sent} messages ({len(set(got))} in)")
        assert sorted(set(got)) == list(range(sent))
        # the reconnect kept the first node that answered; its name comes from the listing a moment later
        wait_until_sync(lambda: sub.node is not None, 15, "the node it reconnected to, from the listing")
        assert sub.failovers >= 1 and sub.node in (bed.nodes[0].name, bed.nodes[1].name)
        assert sub.last_connack == (True, 0)  # the session was resumed, not recreated
        assert api.get(f"/api/queues/%2F/mqtt-subscription-{sub_id}qos1")["type"] == "quorum"
    finally:
        close(sub, pub)
        forget_session(api, sub_id)


def forget_session(api: ManagementClient, client_id: str) -> None:
    """Connect once more with a clean start, so the persistent session (and its queue) goes."""
    close(MqttPlacer(api, options=MqttOptions(clean_start=True)).connect(client_id))


@pytest.mark.faults
def test_stopped_app_behind_the_lb_the_3_1_1_client_reconnects_through_the_lb(
    rabbitmq_faulty_testbed: TestBed, api: ManagementClient
) -> None:
    bed = rabbitmq_faulty_testbed
    got: list[int] = []
    sub_id = f"fo311-{uuid.uuid4().hex[:6]}"
    placer = MqttPlacer(api, settings=ClientSettings(resolver=lb(bed)),
                        options=MqttOptions(protocol="3.1.1", clean_start=False))
    sub = placer.connect(sub_id, bed.nodes[1].short, subscriptions=[(f"fo311/{sub_id}", 1)],
                         setup=lambda c: setattr(c, "on_message", lambda cl, u, m: got.append(int(m.payload))))
    pub = MqttPlacer(api).connect(f"fo311-pub-{uuid.uuid4().hex[:6]}", bed.nodes[0].short)
    try:
        until_routed(pub, f"fo311/{sub_id}", got)
        for i in range(50):
            pub.publish(f"fo311/{sub_id}", str(i), qos=1).wait_for_publish(10)
        wait_until_sync(lambda: len(got) >= 50, 20, lambda: f"50 messages ({len(got)} in)")
        bed.stop_app(bed.nodes[1].name)
        for i in range(50, 150):
            pub.publish(f"fo311/{sub_id}", str(i), qos=1).wait_for_publish(10)
        wait_until_sync(lambda: set(got) >= set(range(150)), 30, lambda: f"150 messages ({len(set(got))} in)")
        assert sub.failovers >= 1 and sub.dialled == lb(bed).address_for("mqtt")
        # the reconnect kept the first node that answered (not the stopped one: it answers nothing), named by the
        # management API a moment later
        wait_until_sync(lambda: sub.node is not None, 15, "the node it reconnected to, from the listing")
        assert sub.node in (bed.nodes[0].name, bed.nodes[2].name)
    finally:
        bed.start_app(bed.nodes[1].name)
        close(sub, pub)
        forget_session(api, sub_id)


# -- fleets ---------------------------------------------------------------------------------------------
def test_a_fleet_of_1000_spreads_evenly_from_one_thread_and_carries_qos0_and_qos1(
    rabbitmq_testbed: TestBed, api: ManagementClient
) -> None:
    received: list[tuple[int, bytes, int]] = []
    threads_before = threading.active_count()
    placer = MqttPlacer(api)
    fleet = MqttFleet(placer, 1000, client_id_prefix=f"f-{uuid.uuid4().hex[:6]}",
                      on_message=lambda i, m: received.append((i, m.payload, m.qos)))
    with fleet:  # connects them all
        counts = fleet.per_node()
        assert sum(counts.values()) == 1000 and max(counts.values()) / min(counts.values()) <= 1.05
        assert threading.active_count() - threads_before == 1  # one loop thread, not one per client
        # the truth, independently (the management API lists connections after its next statistics round)
        ids = [c.client_id for c in fleet]
        truth: dict[str, str] = {}
        wait_until_sync(lambda: len(truth.update(placer.nodes_of(ids)) or truth) == 1000, 15,
                        lambda: f"the management API to list the fleet ({len(truth)} of 1000)")
        assert all(truth[m.client.client_id] == m.node for m in fleet.members)
        fleet.subscribe(10, "fleet/q1", qos=1)
        fleet.subscribe(20, "fleet/q0", qos=0)
        # SUBACK comes a little before the subscription is routable (see until_routed): probe each topic until
        # its subscriber has a probe; the probes are left out of what is checked below

        def routable(publisher: int, topic: str, qos: int, subscriber: int) -> None:
            def probed() -> bool:
                fleet.publish(publisher, topic, b"probe", qos=qos)
                return any(i == subscriber and p == b"probe" for i, p, _ in list(received))

            wait_until_sync(probed, 10, f"the subscription of member {subscriber} to {topic} to become routable")

        def messages() -> list[tuple[int, bytes, int]]:
            return [m for m in list(received) if m[1] != b"probe"]

        routable(500, "fleet/q1", 1, 10)
        routable(900, "fleet/q0", 0, 20)
        infos = [fleet.publish(i, "fleet/q1", f"{i}".encode(), qos=1) for i in range(500, 520)]
        for info in infos:
            info.wait_for_publish(10)
        fleet.publish(900, "fleet/q0", b"zero", qos=0)
        wait_until_sync(lambda: len(messages()) >= 21, 20, lambda: f"21 messages ({len(messages())} in)")
        got = messages()
        assert sorted(int(p) for i, p, q in got if i == 10) == list(range(500, 520))
        assert all(q == 1 for i, _, q in got if i == 10)
        assert (20, b"zero", 0) in got
        with pytest.raises(ConfigurationError, match="QoS 0 or 1"):
            fleet.publish(1, "fleet/q1", b"x", qos=2)


def test_a_fleet_through_an_uneven_lb_is_rebalanced_with_node_checks(
    rabbitmq_testbed: TestBed, api: ManagementClient
) -> None:
    # random(1): lands unevenly
    placer = MqttPlacer(api, settings=ClientSettings(resolver=lb(rabbitmq_testbed, "random1")))
    with MqttFleet(placer, 1000, client_id_prefix=f"flb-{uuid.uuid4().hex[:6]}") as fleet:
        counts = fleet.per_node()
        assert sum(counts.values()) == 1000 and max(counts.values()) / min(counts.values()) <= 1.05
        truth = placer.nodes_of([c.client_id for c in fleet])
        assert len(truth) == 1000
        assert all(truth[m.client.client_id] == m.node for m in fleet.members)


def test_a_fleet_behind_a_sticky_lb_says_so(rabbitmq_testbed: TestBed, api: ManagementClient) -> None:
    # every connection from 127.0.0.1 to one node; the core's sticky rule judges each moved client's placement
    # (a landing per rebalance round: a window of 2 says so on the third round)
    placer = MqttPlacer(api,
                        settings=ClientSettings(resolver=lb(rabbitmq_testbed, "source"),
                                                retry=RetryPolicy(sticky_window=2)))
    fleet = MqttFleet(placer, 30, client_id_prefix=f"fst-{uuid.uuid4().hex[:6]}")
    with pytest.raises(NodeUnreachable, match="never routes to a candidate"):
        fleet.start()
    assert fleet.connected == 0  # closed on the way out


@pytest.mark.faults
def test_a_fleet_moves_off_a_killed_node(rabbitmq_faulty_testbed: TestBed, api: ManagementClient) -> None:
    bed = rabbitmq_faulty_testbed
    with MqttFleet(MqttPlacer(api), 300, client_id_prefix=f"fk-{uuid.uuid4().hex[:6]}") as fleet:
        bed.kill_node(bed.nodes[1].name)
        wait_until_sync(lambda: fleet.disconnects >= 100, 20, lambda: f"100 disconnects ({fleet.disconnects})")
        # QoS 1 from every client while a third of them reconnect: held and sent once connected, never failed
        # (paho's own publish raises or answers "no connection" then: 528 to 735 per 10-minute nemesis run)
        infos = [fleet.publish(i, f"fk/{i}", b"during the reconnect", qos=1) for i in range(300)]
        wait_until_sync(lambda: fleet.connected == 300, 30, lambda: f"300 connected ({fleet.connected})")
        wait_until_sync(lambda: all(info.is_published() for info in infos), 30,
                        lambda: f"every QoS 1 publish acknowledged ({sum(i.is_published() for i in infos)} of 300)")
        assert all(info.rc == 0 for info in infos)
        assert sum(isinstance(info, HeldInfo) for info in infos) >= 50  # those of the reconnecting clients were held
        counts = fleet.per_node()
        assert bed.nodes[1].name not in counts and sum(counts.values()) == 300


# -- ingestion ------------------------------------------------------------------------------------------
async def test_devices_publishing_over_mqtt_land_in_a_stream_exactly_once(
    rabbitmq_testbed: TestBed, api: ManagementClient, rabbitmq_unique_name: str
) -> None:
    node = rabbitmq_testbed.nodes[0]
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port), management=api) as env:
        await env.create_stream(rabbitmq_unique_name)
        try:
            assert bind_mqtt_topics(api, rabbitmq_unique_name, ["ingest/+/temp"]) == ["ingest.*.temp"]
            assert bind_mqtt_topics(api, rabbitmq_unique_name, "ingest/+/temp") == ["ingest.*.temp"]  # again: no-op
            assert mqtt_bindings(api, rabbitmq_unique_name) == {"ingest.*.temp"}
            with MqttFleet(MqttPlacer(api), 30, client_id_prefix=f"dev-{uuid.uuid4().hex[:6]}") as devices:
                infos = [devices.publish(d, f"ingest/d{d}/temp", json.dumps({"d": d, "n": n}), qos=1)
                         for n in range(20) for d in range(30)]
                devices.publish(0, "ingest/d0/humidity", b"not bound", qos=1).wait_for_publish(10)
                await asyncio.to_thread(lambda: [i.wait_for_publish(10) for i in infos])
            got: list[tuple[bytes, str | None]] = []
            consumer = await env.consumer(rabbitmq_unique_name, lambda m, c: got.append(decode_amqp(bytes(m))),
                                          offset="first")
            await wait_until(lambda: len(got) >= 600, 20, lambda: f"600 messages ({len(got)} in)")
            # a window, not a wait: a message beyond the 600 (a duplicate) has no condition to wait for, it
            # would arrive now, and the exact count below would fail
            await asyncio.sleep(0.3)
            assert consumer.node != (await env.topology(rabbitmq_unique_name)).leader  # read from a replica
            await consumer.close()
            keys = [(json.loads(b)["d"], json.loads(b)["n"]) for b, _ in got]
            assert len(keys) == 600 and set(keys) == {(d, n) for d in range(30) for n in range(20)}
            assert {k for _, k in got} == {f"ingest.d{d}.temp" for d in range(30)}
            unbind_mqtt_topics(api, rabbitmq_unique_name, ["ingest/+/temp"])
            assert mqtt_bindings(api, rabbitmq_unique_name) == set()
        finally:
            await env.delete_stream(rabbitmq_unique_name)


def test_binding_input_is_checked(rabbitmq_testbed: TestBed, api: ManagementClient) -> None:
    with pytest.raises(StreamNotFound, match="create it before binding"):
        bind_mqtt_topics(api, f"no-such-{uuid.uuid4().hex[:6]}", ["a/b"])
    with pytest.raises(ConfigurationError, match="'#' must be the whole last level"):
        bind_mqtt_topics(api, "whatever", ["a/#/b"])


@pytest.mark.spark
async def test_iot_example_devices_to_stream_to_spark_to_stream(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, api: ManagementClient, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    example = load_example("iot_ingest")
    host, port = rabbitmq_testbed.lb("stream")
    uri = rabbitmq_testbed.stream_uri(host, port)
    readings, averages = f"{rabbitmq_unique_name}-r", f"{rabbitmq_unique_name}-a"
    await example.setup(uri, api, readings, averages)
    try:
        per_node = await asyncio.to_thread(example.run_devices, uri, api, "{}:{}".format(*rabbitmq_testbed.lb("mqtt")),
                                           rabbitmq_unique_name,
                                           30, 10)
        assert sorted(per_node.values()) == [10, 10, 10]
        await asyncio.to_thread(example.aggregate, rabbitmq_spark, uri, readings, averages, rabbitmq_unique_name,
                                str(tmp_path / "cp"))
        got = await example.read_stream(uri, api, readings, 300, amqp=True)
        sums = await example.read_stream(uri, api, averages, 30, amqp=False)
        assert example.check(got, sums, 30, 10)
        assert {s["device"] for s in sums} == {f"{rabbitmq_unique_name}-{d}" for d in range(30)}
        # the same query again from its checkpoint writes nothing more
        await asyncio.to_thread(example.aggregate, rabbitmq_spark, uri, readings, averages, rabbitmq_unique_name,
                                str(tmp_path / "cp"))
        assert len(await example.read_stream(uri, api, averages, 31, amqp=False, timeout=3)) == 30
    finally:
        async with Environment(uri, management=api) as env:
            for stream in (readings, averages):
                await env.delete_stream(stream)

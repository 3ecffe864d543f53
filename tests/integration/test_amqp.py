"""AMQP 0.9.1 against the test bed: node-placed connections (direct and through HAProxy), RPC over the
local random exchange, and streams over AMQP."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest

from resolvers import LoadBalancer
from smartclient import Address, ClientSettings, ConfigurationError, Environment, NoCandidateNode, NoRpcServer
from smartclient.amqp.placement import AmqpPlacer
from smartclient.amqp.rpc import RpcClient, RpcServer, coverage
from smartclient.amqp.streams import AmqpStreamConsumer, StreamDelivery, declare_stream, stream_members, stream_qos
from smartclient.testing import TestBed

from ..conftest import wait_until_sync


@pytest.fixture
def amqp_lb_placer(rabbitmq_testbed: TestBed) -> Iterator[AmqpPlacer]:
    host, port = rabbitmq_testbed.lb("amqp")
    with rabbitmq_testbed.management() as api:
        yield AmqpPlacer(api,
                         settings=ClientSettings(resolver=LoadBalancer(Address(host, port), amqp=Address(host, port))))


def node_names(bed: TestBed) -> list[str]:
    return [n.name for n in bed.nodes]


def test_the_nodes_and_their_amqp_listeners_come_from_the_management_api(
    rabbitmq_testbed: TestBed, placer: AmqpPlacer
) -> None:
    nodes = placer.nodes()
    assert [n.name for n in nodes] == sorted(node_names(rabbitmq_testbed))
    for node in rabbitmq_testbed.nodes:
        listed = next(n for n in nodes if n.name == node.name)
        assert listed.address("amqp").port == node.port("amqp")


@pytest.mark.parametrize("mode", ["direct", "load balancer"])
def test_a_placed_connection_sits_on_the_node_it_was_asked_for(
    rabbitmq_testbed: TestBed, placer: AmqpPlacer, amqp_lb_placer: AmqpPlacer, mode: str
) -> None:
    chosen = amqp_lb_placer if mode == "load balancer" else placer
    for node in rabbitmq_testbed.nodes:
        with chosen.connect(node.short) as placed:
            assert placed.node == node.name
            # the truth, independently: the management API's view of this very connection
            assert placer.node_of(placed.name) == node.name
            assert placed.connection.is_open
            if mode == "load balancer":
                assert placed.dialled == Address(*rabbitmq_testbed.lb("amqp"))


def test_unknown_node_is_a_typed_error(placer: AmqpPlacer) -> None:
    with pytest.raises(NoCandidateNode, match="no node named 'rabbit-9'"):
        placer.connect("rabbit-9")


async def test_environment_gives_amqp_connections_and_refuses_a_stream_lb_without_an_amqp_listener(
    rabbitmq_testbed: TestBed
) -> None:
    host, port = rabbitmq_testbed.lb()
    with rabbitmq_testbed.management() as api:
        async with Environment(rabbitmq_testbed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port)),
                               management=api) as env:
            with pytest.raises(ConfigurationError, match=r"no amqp listener: LoadBalancer\(\.\.\., amqp=PORT\)"):
                env.amqp_connection(rabbitmq_testbed.nodes[1].short)
        _amqp_host, amqp_port = rabbitmq_testbed.lb("amqp")
        async with Environment(rabbitmq_testbed.stream_uri(host, port), management=api,
                               resolver=LoadBalancer(Address(host, port), amqp=amqp_port)) as env:
            with env.amqp_connection(rabbitmq_testbed.nodes[1].short) as placed:
                assert placed.node == rabbitmq_testbed.nodes[1].name
    async with Environment(rabbitmq_testbed.stream_uri(host, port)) as env:
        with pytest.raises(ConfigurationError, match="management API"):
            env.amqp_connection()


def echo(body: bytes, properties: Any) -> bytes:
    return b"echo:" + body


def test_rpc_with_servers_on_every_node_answers_from_the_callers_node(
    rabbitmq_testbed: TestBed, amqp_lb_placer: AmqpPlacer, rabbitmq_unique_name: str
) -> None:
    exchange = f"{rabbitmq_unique_name}-rpc"
    with RpcServer(amqp_lb_placer, exchange, echo, require_full_coverage=True) as server:
        report = server.start()
        assert report.complete and set(report.servers) == set(node_names(rabbitmq_testbed))
        for node in rabbitmq_testbed.nodes:
            with amqp_lb_placer.connect(node.short) as placed:
                client = RpcClient(placed, exchange)
                for i in range(5):
                    reply = client.call(b"%d" % i)
                    assert reply.body == b"echo:%d" % i
                    assert reply.node == node.name  # x-local-random: the server on the caller's node
        assert server.handled == 15
    _delete_exchange(rabbitmq_testbed, exchange)


def test_a_node_without_server_gives_no_rpc_server_naming_it_and_nothing_hangs(
    rabbitmq_testbed: TestBed, placer: AmqpPlacer, rabbitmq_unique_name: str
) -> None:
    exchange = f"{rabbitmq_unique_name}-rpc"
    covered = [n.name for n in rabbitmq_testbed.nodes[:2]]
    bare = rabbitmq_testbed.nodes[2]
    with RpcServer(placer, exchange, echo, nodes=covered) as server:
        report = server.start()
        assert report.without == (bare.name,) and not report.complete
        with placer.connect(bare.short) as placed:
            client = RpcClient(placed, exchange, timeout=30)
            started = time.monotonic()
            with pytest.raises(NoRpcServer, match=bare.name) as caught:
                client.call(b"anyone?")
            assert caught.value.node == bare.name
            assert time.monotonic() - started < 10  # the return, not the timeout
        with pytest.raises(NoRpcServer):
            RpcServer(placer, exchange, echo, nodes=covered, require_full_coverage=True).start()
    # exclusive queues go with the servers, and the management API lists them gone a moment later
    wait_until_sync(lambda: coverage(placer.management, exchange).servers == {}, 15,
                    lambda: f"no RPC server listed on {exchange!r}: {coverage(placer.management, exchange).servers}")
    _delete_exchange(rabbitmq_testbed, exchange)


@pytest.mark.faults
def test_through_the_lb_a_connection_is_known_by_the_queue_it_declares_else_by_its_listing(
    rabbitmq_testbed: TestBed, amqp_lb_placer: AmqpPlacer, rabbitmq_unique_name: str
) -> None:
    """An exclusive queue lives on its connection's node and the management API shows it at once, where
    it lists the connection only after a statistics round (up to 5 s).  Without the configure permission
    the queue needs, the listing answers.  The probe queue is gone either way."""
    from smartclient import Credentials

    host, port = rabbitmq_testbed.lb("amqp")

    def probe_queues(api: Any) -> list[str]:
        return [q["name"] for q in api.get("/api/queues/%2F?columns=name,exclusive")
                if q.get("exclusive") and q["name"].startswith("amq.gen-")]

    user = f"{rabbitmq_unique_name}-noconfigure"
    with rabbitmq_testbed.management() as api:
        before = probe_queues(api)
        api.put(f"/api/users/{user}", {"password": "s3cret-noconf", "tags": ""})
        api.put(f"/api/permissions/%2F/{user}", {"configure": "^$", "write": ".*", "read": ".*"})
        try:
            lb = LoadBalancer(Address(host, port), amqp=Address(host, port))
            restricted = AmqpPlacer(api, settings=ClientSettings(resolver=lb, credentials=Credentials(user, "s3cret-noconf")))
            for chosen in (amqp_lb_placer, restricted):
                for node in rabbitmq_testbed.nodes:
                    with chosen.connect(node.short) as placed:
                        assert placed.node == node.name == amqp_lb_placer.node_of(placed.name)
                        assert placed.connection.is_open  # the refused declaration closed a channel only
            assert probe_queues(api) == before
        finally:
            api.delete(f"/api/users/{user}")


def test_an_rpc_server_whose_node_restarts_serves_there_again(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    exchange = f"{rabbitmq_unique_name}-rpc"
    victim = bed.nodes[2]
    with bed.management() as api:  # every node's API: the victim's may be the one that is down
        placer = AmqpPlacer(api)
        with RpcServer(placer, exchange, echo, require_full_coverage=True) as server:
            server.start()
            bed.kill_node(victim.name)  # by PID
            bed.restart_node(victim.name)
            lost = next(s for s in server.servers if s.node == victim.name)
            wait_until_sync(lambda: lost.restarts >= 1, 60, "the server on the restarted node to serve again")
            with placer.connect(victim.short) as placed:
                reply = RpcClient(placed, exchange, timeout=10).call(b"back")
            assert reply.body == b"echo:back" and reply.node == victim.name
            assert server.coverage().complete
    _delete_exchange(bed, exchange)


def _delete_exchange(bed: TestBed, exchange: str) -> None:
    with bed.management() as api:
        api.delete(f"/api/exchanges/%2F/{exchange}")


# -- streams over AMQP ----------------------------------------------------------------------------
@pytest.fixture
def amqp_stream(rabbitmq_testbed: TestBed, placer: AmqpPlacer, rabbitmq_unique_name: str) -> Iterator[str]:
    import pika

    with placer.connect(rabbitmq_testbed.nodes[0].short) as placed:
        channel = placed.channel()
        declare_stream(channel, rabbitmq_unique_name, {"max_age": "1D", "initial_cluster_size": 3})
        channel.confirm_delivery()
        for i in range(30):
            channel.basic_publish("", rabbitmq_unique_name, b"%d" % i, pika.BasicProperties(delivery_mode=2))

    def in_sync() -> bool:  # a confirm needs a quorum: a replica may still lack the tail ("next" would read it)
        rows = rabbitmq_testbed.stream_status(rabbitmq_unique_name)
        return len(rows) == 3 and all(r.get("offset") == 29 for r in rows)
    wait_until_sync(in_sync, 30, lambda: f"every member of {rabbitmq_unique_name} to hold its 30 messages")
    yield rabbitmq_unique_name
    with rabbitmq_testbed.management() as api:
        api.delete(f"/api/queues/%2F/{rabbitmq_unique_name}")


def read_over_amqp(placer: AmqpPlacer, stream: str, offset: Any, expect: int,
                   prefetch: int = 5) -> tuple[list[int], str]:
    """The numbers an AMQP 0.9.1 stream consumer from ``offset`` got (once ``expect`` came, or after 10 s), and
    the node it read on."""
    got: list[StreamDelivery] = []
    with AmqpStreamConsumer(placer, stream, got.append, offset=offset, prefetch=prefetch) as consumer:
        deadline = time.monotonic() + 10
        while len(got) < expect and time.monotonic() < deadline:
            consumer.poll(0.1)
        consumer.poll(0.3)  # a window, not a wait: a delivery beyond `expect` has no condition, it would come now
        assert all(d.acked for d in got)
        return [int(d.body) for d in got], consumer.node


def test_stream_declared_over_amqp_has_its_arguments(rabbitmq_testbed: TestBed, amqp_stream: str) -> None:
    with rabbitmq_testbed.management() as api:
        info = api.queue("/", amqp_stream)
    assert info["type"] == "stream" and info["arguments"]["x-max-age"] == "1D"
    assert len(info["members"]) == 3


@pytest.mark.parametrize("offset, expected", [
    ("first", list(range(30))),
    (10, list(range(10, 30))),
    ("last", None),  # the last chunk: a suffix of the stream
    ("next", []),
    ("1h", list(range(30))),
])
def test_every_x_stream_offset_form(placer: AmqpPlacer, amqp_stream: str, offset: Any, expected: Any) -> None:
    bodies, node = read_over_amqp(placer, amqp_stream, offset, expect=len(expected) if expected is not None else 1)
    _leader, replicas = stream_members(placer, amqp_stream)
    assert node in replicas  # consumers read from a replica
    if expected is None:
        assert bodies and bodies == list(range(30))[-len(bodies):]
    else:
        assert bodies == expected


def test_timestamp_offsets_in_seconds(placer: AmqpPlacer, amqp_stream: str) -> None:
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    assert read_over_amqp(placer, amqp_stream, past, expect=30)[0] == list(range(30))
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5)
    assert read_over_amqp(placer, amqp_stream, future, expect=0)[0] == []


def test_global_qos_is_refused_before_the_broker_closes_the_channel(placer: AmqpPlacer, amqp_stream: str) -> None:
    with pytest.raises(ConfigurationError, match="global QoS"):
        AmqpStreamConsumer(placer, amqp_stream, lambda d: None, global_qos=True)
    with pytest.raises(ConfigurationError, match="prefetch"):
        AmqpStreamConsumer(placer, amqp_stream, lambda d: None, prefetch=0)
    with placer.connect() as placed:
        channel = placed.channel()
        with pytest.raises(ConfigurationError, match="global QoS"):
            stream_qos(channel, 10, global_qos=True)
        assert channel.is_open  # refused here, so the channel survives


def test_bad_stream_arguments_are_refused_before_declaring(placer: AmqpPlacer, rabbitmq_unique_name: str) -> None:
    with placer.connect() as placed:
        channel = placed.channel()
        with pytest.raises(ConfigurationError, match="max_age"):
            declare_stream(channel, rabbitmq_unique_name, {"x-max-age": "seven days"})
        with pytest.raises(ConfigurationError, match="unknown stream argument"):
            declare_stream(channel, rabbitmq_unique_name, {"x-max-lenght-bytes": 10})
        assert channel.is_open


def test_nodes_discovered_from_dns_srv_are_identified_and_placed(rabbitmq_testbed: TestBed) -> None:
    from resolvers import DnsResolver, SrvDiscovery

    host, port = rabbitmq_testbed.dns_address
    with rabbitmq_testbed.management() as api:
        placer = AmqpPlacer(api, settings=ClientSettings(resolver=DnsResolver([host], port=port)),
                            entry_points=SrvDiscovery("_amqp._tcp.smartclient.test", [host], port=port))
        nodes = placer.nodes()
        assert [n.name for n in nodes] == sorted(node_names(rabbitmq_testbed))
        assert all(n.address("amqp").host.endswith(".smartclient.test") for n in nodes)
        with placer.connect(rabbitmq_testbed.nodes[2].short) as placed:
            assert placed.node == rabbitmq_testbed.nodes[2].name == placer.node_of(placed.name)


def test_a_connection_cut_in_the_handshake_is_a_connection_failure_and_refused_credentials_are_not(
    rabbitmq_testbed: TestBed,
) -> None:
    """pika calls a connection that ends after Connection.Start a *probable* authentication error; only
    the broker's Close says so.  An LB that restarts cuts connections there, and an RPC server stops for
    good on refused credentials, so the seam must tell the two apart."""
    import socket
    import threading

    import pika

    from smartclient import AuthenticationFailed, ConnectionFailed
    from smartclient.amqp._pika import pika_errors

    node = rabbitmq_testbed.nodes[0]
    with socket.create_connection((node.host, node.amqp_port), timeout=5) as real:  # the broker's own Start
        real.sendall(b"AMQP\x00\x00\x09\x01")
        start = real.recv(65536)
    cutter = socket.create_server(("127.0.0.1", 0))

    def start_then_cut() -> None:
        conn, _ = cutter.accept()
        conn.recv(8)
        conn.sendall(start)
        conn.recv(65536)  # the client's StartOk (its credentials): cut here
        conn.close()

    threading.Thread(target=start_then_cut, daemon=True).start()
    guest = pika.PlainCredentials(rabbitmq_testbed.username, rabbitmq_testbed.password)
    with pytest.raises(ConnectionFailed, match="cut during the handshake"), pika_errors("cut", vhost="/"):
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cutter.getsockname()[1], credentials=guest))
    cutter.close()
    wrong = pika.PlainCredentials(rabbitmq_testbed.username, "not-the-password")
    with pytest.raises(AuthenticationFailed, match="refused the credentials"), pika_errors("wrong", vhost="/"):
        pika.BlockingConnection(pika.ConnectionParameters(node.host, node.amqp_port, credentials=wrong))

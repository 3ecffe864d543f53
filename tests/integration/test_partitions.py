"""Silent networks on the namespaced bed (issue 55): each node on its own address, reached only through the load
balancer, and a partition a silent drop inside a node's namespace (no reset, no FIN).  A connection that hears
nothing is found dead within ``ConnectionOptions.dead_after`` (10 s), not after two 60 s heartbeats; nothing
confirmed is lost; a busy connection is no false alarm."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pika
import pika.exceptions
import pytest

from resolvers import LoadBalancer
from smartclient import (
    Address,
    ClientSettings,
    ConnectionFailed,
    ConnectionOptions,
    Consumer,
    EnqueueTimeout,
    Environment,
    Producer,
    RecoveryEvent,
)
from smartclient.amqp._pika import WATCHES
from smartclient.amqp.placement import AmqpPlacer
from smartclient.mqtt.placement import MqttOptions, MqttPlacer
from smartclient.testing.local import LocalTestBed

from ..conftest import wait_until_sync
from .conftest import node_index
from .test_mqtt import close, until_routed
from .test_mqtt import lb as mqtt_lb
from .test_recovery_faults import Collector, Publisher

pytestmark = pytest.mark.faults

DEAD_AFTER = ConnectionOptions().dead_after
#: 2.25 minutes, seed 32: isolate, isolate-from-peers, cut-lb and cut-lb-one-way, one each (3 minutes of seed 55 held
#: the same kinds, isolate twice: CI's time)
PARTITION_RUN_MINUTES, PARTITION_RUN_SEED = 2.25, 32


def _declares(host: str, port: int, bed: LocalTestBed) -> bool:
    """Whether an exclusive queue can be declared through the LB (the metadata store takes writes)."""
    params = pika.ConnectionParameters(host, port, credentials=pika.PlainCredentials(bed.username, bed.password))
    with contextlib.closing(pika.BlockingConnection(params)) as connection:
        connection.channel().queue_declare("", exclusive=True)
    return True


def lb_environment(bed: LocalTestBed, **kwargs: object) -> Environment:
    host, port = bed.lb("stream")
    return Environment(bed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port)), **kwargs)  # type: ignore[arg-type]


async def test_a_consumer_whose_replica_goes_silent_finds_it_within_dead_after_and_loses_nothing(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_partitions
    async with lb_environment(bed) as env:
        collector, consumer, producer, publisher = await flowing(env, rabbitmq_unique_name)
        await collector.wait_for(300)
        cut = bed.nodes[node_index(bed, consumer.node)]
        assert consumer.node != producer.node  # a replica
        started = time.monotonic()
        bed.partition("cut-lb", cut.name)  # the LB's link to the consumer's node goes quiet
        recovered = await until_recovered(consumer, started)
        await collector.wait_for(len(collector.items) + 300)
        print(f"the consumer on {cut.short} recovered {recovered:.1f} s after its link went silent "
              f"(dead_after {DEAD_AFTER:g} s), on {consumer.node}")
        assert recovered < DEAD_AFTER + 3 and consumer.node != Address(*cut.advertised)
        bed.heal()
        await publisher.stop()
        await collector.wait_for(publisher.sent)
        collector.assert_no_gap(publisher.sent)
        await env.delete_stream(rabbitmq_unique_name)


async def test_a_producer_whose_leader_goes_silent_finds_it_within_dead_after_and_every_message_lands_once(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    """The LB's link to the leader goes quiet for 20 s: the producer finds its connection dead within dead_after,
    recovers once the link is back, and every message it was given is confirmed and stored once (a named
    producer's resends are deduplicated).  Its publisher sends a message again when there was no room for it
    within the enqueue timeout, as a service would (CI-like run 27: under load, max_in_flight stayed full for the
    30 s of it while the producer recovered after the heal)."""
    bed = rabbitmq_partitions
    async with lb_environment(bed) as env:
        events: list[tuple[float, RecoveryEvent]] = []
        env.on_recovery(lambda event: events.append((time.monotonic(), event)))
        collector, _, producer, publisher = await flowing(env, rabbitmq_unique_name, name="p",
                                                          publisher=PatientPublisher)
        await publisher.confirmed_after(time.monotonic(), count=300)
        leader = bed.nodes[node_index(bed, producer.node)]
        cut = time.monotonic()
        bed.partition("cut-lb", leader.name)
        while time.monotonic() - cut < 20:
            await _tick()
        bed.heal()
        await publisher.confirmed_after(time.monotonic(), count=300, timeout=60)
        await publisher.stop()
        await collector.wait_for(publisher.sent, timeout=60)
        collector.assert_no_gap(publisher.sent)
        ended, event = next((t, e) for t, e in events if e.handle is producer)
        found = ended - event.seconds - cut
        print(f"the producer on the leader {leader.short} found its silent connection {found:.1f} s after the cut "
              f"(dead_after {DEAD_AFTER:g} s), and was back {ended - cut:.1f} s after it (healed at 20 s); "
              f"{publisher.sent} messages, each stored once")
        assert found <= DEAD_AFTER + 0.5 and event.recovered


class PatientPublisher(Publisher):
    """Sends the same message again when there was no room for it within the enqueue timeout (a leader lost for
    longer holds max_in_flight messages unconfirmed), as a service would."""

    async def _run(self) -> None:
        while not self._stop:
            try:
                await self.producer.send(b"%d" % self.sent, on_confirm=self._on_confirm)
            except EnqueueTimeout:
                continue
            self.sent += 1
            if self.sent % 50 == 0:
                await asyncio.sleep(0.002)


async def test_a_producer_on_a_leader_in_the_minority_loses_nothing_and_no_write_the_majority_missed_is_confirmed(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    """The leader's node drops its peers (the LB still reaches it): it can commit nothing, so it confirms nothing;
    the majority elects a new leader once its nodes see the old one gone (Erlang's net_ticktime, 60 s); the
    producer, its confirms stopped, moves there and sends what was unconfirmed again (deduplicated: a named
    producer).  Every message is then stored once, and the consumer, which reads only what a majority holds, gets
    each of them once."""
    bed = rabbitmq_partitions
    async with lb_environment(bed) as env:
        collector, consumer, producer, publisher = await flowing(env, rabbitmq_unique_name, name="p",
                                                                 publisher=PatientPublisher)
        await publisher.confirmed_after(time.monotonic(), count=300)
        leader = bed.nodes[node_index(bed, producer.node)]
        confirmed_before = len(publisher.confirmed)
        cut = time.monotonic()
        bed.partition("split", leader.name)
        await publisher.confirmed_after(cut + 5, count=300, timeout=150)
        resumed = time.monotonic() - cut
        stored_then = len(publisher.confirmed)
        assert producer.node != Address(*leader.advertised)
        bed.heal()
        healed = time.monotonic()
        await publisher.confirmed_after(healed, count=300, timeout=60)
        await publisher.stop()
        await collector.wait_for(publisher.sent, timeout=90)
        collector.assert_no_gap(publisher.sent)
        print(f"the leader {leader.short} in a minority: confirms resumed {resumed:.1f} s after the split, on "
              f"{producer.node} ({confirmed_before} confirmed before, {stored_then} by then); after the heal "
              f"{publisher.sent} messages, each stored once; the consumer on {consumer.node} got each once")


async def test_an_idle_connection_that_goes_silent_is_ended_within_dead_after(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_partitions
    async with lb_environment(bed) as env:
        await env.create_stream(rabbitmq_unique_name, {"initial-cluster-size": 3})
        collector = Collector()
        consumer = await env.consumer(rabbitmq_unique_name, collector, offset="next")  # nothing comes
        cut = bed.nodes[node_index(bed, consumer.node)]
        started = time.monotonic()
        bed.partition("cut-lb", cut.name)
        found = await until_recovered(consumer, started)
        print(f"an idle consumer's silent connection was found and recovered in {found:.1f} s")
        assert found < DEAD_AFTER + 3  # found within dead_after, then placed again
        bed.heal()
        producer = await env.producer(rabbitmq_unique_name)
        await producer.send_wait(b"1")
        await collector.wait_for(1)
        await env.delete_stream(rabbitmq_unique_name)


async def test_a_busy_connection_is_no_false_alarm(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    """dead_after 4 s, the least: a producer and a consumer busy for 15 s (the client's event loop held by the
    publishing), then idle for 12 s, are never taken for dead."""
    bed = rabbitmq_partitions
    async with lb_environment(bed, connection=ConnectionOptions(dead_after=4)) as env:
        collector, consumer, producer, publisher = await flowing(env, rabbitmq_unique_name)
        started = time.monotonic()
        while time.monotonic() - started < 15:
            await _tick()
        await publisher.stop()
        await collector.wait_for(publisher.sent)
        collector.assert_no_gap(publisher.sent)
        idle = time.monotonic()
        while time.monotonic() - idle < 12:  # then idle: only heartbeats, a third of dead_after apart
            await _tick()
        assert producer.recoveries == 0 and consumer.recoveries == 0, (producer.recoveries, consumer.recoveries)
        print(f"{publisher.sent} messages in 15 s, then 12 s idle, with dead_after 4 s: no recovery")
        await env.delete_stream(rabbitmq_unique_name)


async def _tick() -> None:
    await asyncio.sleep(0.1)


async def flowing(env: Environment, stream: str, *, name: str | None = None,
                  publisher: type[Publisher] = Publisher) -> tuple[Collector, Consumer, Producer, Publisher]:
    """A three-member stream with a consumer from its first offset and a producer publishing steadily."""
    await env.create_stream(stream, {"initial-cluster-size": 3})
    collector = Collector()
    consumer = await env.consumer(stream, collector, offset="first")
    producer = await env.producer(stream, name=name)
    return collector, consumer, producer, publisher(producer).start()


async def until_recovered(handle: Consumer | Producer, since: float) -> float:
    """Seconds from ``since`` until ``handle`` has recovered once (its silent connection found and left)."""
    while handle.recoveries == 0:
        assert time.monotonic() < since + DEAD_AFTER + 20, f"{handle!r}: its silent connection was never found"
        await _tick()
    return time.monotonic() - since


def test_an_mqtt_qos1_subscriber_whose_link_goes_silent_reconnects_within_dead_after_and_loses_nothing(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    """MQTT's keepalive as it comes (60 s, agreed with the broker): the client's silence watch sends a PINGREQ
    after dead_after / 3 s with nothing received, and ends the connection after dead_after s of it.
    The subscriber (a persistent QoS 1 session, in a quorum queue) reconnects through the LB to another node and
    gets every message published meanwhile (redeliveries allowed, no loss)."""
    bed = rabbitmq_partitions
    got: list[int] = []
    sub_id = f"part-{rabbitmq_unique_name[-6:]}"
    topic = f"part/{sub_id}"
    with bed.management() as api:
        settings = ClientSettings(resolver=mqtt_lb(bed))
        placer = MqttPlacer(api, settings=settings, options=MqttOptions(clean_start=False))
        sub = placer.connect(sub_id, bed.nodes[1].short, subscriptions=[(topic, 1)],
                             setup=lambda c: setattr(c, "on_message", lambda cl, u, m: got.append(int(m.payload))))
        pub = MqttPlacer(api, settings=settings).connect(f"{sub_id}-pub", bed.nodes[0].short)
        lost: list[float] = []  # when the silence watch ended the connection (its log record)
        watch = _When(lost, "nothing received for")
        logging.getLogger("smartclient.mqtt._paho").addHandler(watch)
        try:
            until_routed(pub, topic, got)
            cut = time.monotonic()
            bed.partition("cut-lb", bed.nodes[1].name)
            sent = 0
            while sub.failovers == 0:
                assert time.monotonic() - cut < DEAD_AFTER + 20, "the silent MQTT connection was never found"
                pub.publish(topic, str(sent), qos=1).wait_for_publish(10)
                sent += 1
                time.sleep(0.05)
            found = time.monotonic() - cut
            for _ in range(100):
                pub.publish(topic, str(sent), qos=1).wait_for_publish(10)
                sent += 1
            wait_until_sync(lambda: set(got) >= set(range(sent)), 30, lambda: f"{sent} messages ({len(set(got))} in)")
            ended = lost[0] - cut
            wait_until_sync(lambda: sub.node is not None, 15, "the node it reconnected to, from the listing")
            print(f"the MQTT subscriber on {bed.nodes[1].short} found its link silent {ended:.1f} s after the cut and "
                  f"reconnected {found:.1f} s after it (keepalive {placer.keepalive} s, dead_after {DEAD_AFTER:g} s), "
                  f"now on {sub.node}; {sent} QoS 1 messages, none lost ({len(got) - len(set(got))} redelivered)")
            assert ended <= DEAD_AFTER + 1 and sub.node != bed.nodes[1].name
        finally:
            logging.getLogger("smartclient.mqtt._paho").removeHandler(watch)
            bed.heal()
            close(sub, pub)
            close(MqttPlacer(api, settings=settings, options=MqttOptions(clean_start=True)).connect(sub_id))


class _When(logging.Handler):
    """Notes when a log record saying ``text`` came (from any thread)."""

    def __init__(self, into: list[float], text: str) -> None:
        super().__init__(logging.INFO)
        self.into, self.text = into, text

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.into.append(time.monotonic())


def test_an_amqp_publisher_whose_link_goes_silent_fails_within_dead_after_and_loses_nothing(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    """AMQP 0.9.1 through the LB onto a quorum queue, publishing with confirms, with the defaults (heartbeat 60 s,
    which a pika BlockingConnection keeps: it heartbeats only inside its calls).  The LB's link to the client's
    node goes quiet: the seam's silence watch asks the broker something once nothing came for a third of
    dead_after, and ends the connection within dead_after, not after 2 x 60 s.  The publisher connects again (the
    LB has marked the node down) and sends the message it had no confirm for again: every confirmed message is in
    the queue (one may be there twice)."""
    import pika.exceptions

    bed = rabbitmq_partitions
    host, port = bed.lb("amqp")
    lb = LoadBalancer(Address(host, port), amqp=Address(host, port))
    queue = rabbitmq_unique_name
    with bed.management() as api:
        placer = AmqpPlacer(api, settings=ClientSettings(resolver=lb))
        placed = placer.connect()
        channel = placed.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        confirmed: list[int] = []
        for i in range(100):
            channel.basic_publish("", queue, str(i).encode())
            confirmed.append(i)
        cut_node = next(n for n in bed.nodes if n.name == placed.node)
        cut = time.monotonic()
        bed.partition("cut-lb", cut_node.name)
        i = len(confirmed)
        with pytest.raises((pika.exceptions.AMQPError, ConnectionFailed)):
            while time.monotonic() - cut < 60:
                channel.basic_publish("", queue, str(i).encode())
                confirmed.append(i)
                i += 1
        found = time.monotonic() - cut
        placed.close()
        placed = placer.connect()  # through the LB, to a node it still reaches
        channel = placed.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, str(i).encode())  # the one with no confirm, again
        confirmed.append(i)
        bed.heal()
        got = set()
        while (message := channel.basic_get(queue, auto_ack=True))[0] is not None:
            got.add(int(message[2]))
        channel.queue_delete(queue)
        placed.close()
        print(f"the AMQP publisher on {cut_node.short} found its silent connection {found:.1f} s after the cut "
              f"(heartbeat {placer.heartbeat} s); {len(confirmed)} confirmed, all in the queue")
        assert set(confirmed) <= got
        assert found < DEAD_AFTER


def test_amqp10_clients_whose_link_goes_silent_find_it_within_dead_after_and_lose_nothing(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    """AMQP 1.0 through the LB onto a quorum queue, with the defaults: proton's idle timeout at two fifths of
    dead_after (4 s), so the broker sends something every 2 s.  The LB's link to the leader's node goes quiet
    under a publisher and a consumer there: each finds it within dead_after (was: two 60 s heartbeats), recovers
    on a node the LB still reaches, and every message the publisher was told was taken is consumed.  A publisher
    made while the cut lasts goes through another member (which forwards to the leader)."""
    from smartclient.amqp10.placement import Amqp10Placer

    bed = rabbitmq_partitions
    host, port = bed.lb("amqp")
    lb = LoadBalancer(Address(host, port), amqp=Address(host, port))
    queue = rabbitmq_unique_name
    with bed.management() as api:
        api.put(f"/api/queues/%2F/{queue}", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
        placer = Amqp10Placer(api, settings=ClientSettings(resolver=lb))
        ended: dict[str, float] = {}
        placer.on_recovery = lambda event: ended.setdefault(  # when each found its link dead
            type(event.handle).__name__, time.monotonic() - event.seconds)
        got: set[int] = set()
        try:
            with placer.publisher(queue) as publisher, placer.consumer(
                    queue, lambda message, accept: (got.add(int(bytes(message.body))), accept()),
                    prefer="leader") as consumer:
                sent = 0
                for sent in range(100):
                    publisher.publish(str(sent).encode())
                wait_until_sync(lambda: len(got) == 100, 30, "the first 100 messages")
                cut_node = next(n for n in bed.nodes if n.name == publisher.node)
                assert consumer.node == cut_node.name  # on the leader too
                cut = time.monotonic()
                bed.partition("cut-lb", cut_node.name)
                while len(ended) < 2 and time.monotonic() - cut < 60:
                    sent += 1
                    publisher.publish(str(sent).encode())  # returns once taken, on another node after the loss
                    time.sleep(0.05)
                began = time.monotonic()  # a new publisher while the LB cannot reach the leader: another member
                with placer.publisher(queue) as fresh:
                    sent += 1
                    fresh.publish(str(sent).encode())
                    fresh_at, fresh_took = fresh.node, time.monotonic() - began
                bed.heal()
                wait_until_sync(lambda: got >= set(range(sent + 1)), 30, "every message taken")
        finally:
            api.delete(f"/api/queues/%2F/{queue}")
            placer.close()
    found = {kind: round(at - cut, 1) for kind, at in ended.items()}
    print(f"AMQP 1.0 on {cut_node.short}: found its silent link after {found} s (idle timeout {placer.heartbeat} s); "
          f"{sent + 1} sent, all consumed; a publisher made meanwhile took its first message on {fresh_at} after "
          f"{fresh_took:.1f} s")
    assert set(found) == {"Amqp10Publisher", "Amqp10Consumer"} and max(found.values()) < DEAD_AFTER
    assert fresh_at != cut_node.name


def test_amqp_and_mqtt_placements_through_the_lb_while_a_node_is_cut_off_find_their_node_at_once(
    rabbitmq_partitions: LocalTestBed,
) -> None:
    """While a node is cut off from everyone (until its peers give it up, about a minute), the management API's
    reads that gather statistics wait on it: each timed out on every management node (20 s in all), and an AMQP
    0.9.1 placement through the LB, which finds its node by an exclusive queue's row, took 30 s and failed.  The
    row read without statistics answers at once.  The connection listing waits too, even without statistics: an
    MQTT client whose session ends with its connection is known by its QoS 0 subscription's queue instead (before,
    each of its reconnects through the LB gave up after 20-30 s)."""
    bed = rabbitmq_partitions
    host, port = bed.lb("amqp")
    lb = LoadBalancer(Address(host, port), amqp=Address(host, port))
    with bed.management() as api:
        placer = AmqpPlacer(api, settings=ClientSettings(resolver=lb))
        placer.connect().close()  # a service's first connection: the nodes read once (the overview waits too)
        mqtt = MqttPlacer(api, settings=ClientSettings(resolver=mqtt_lb(bed)))
        close(mqtt.connect("partition-where-0"))
        bed.partition("isolate", bed.nodes[2].name)
        cut = bed.nodes[2].short
        wait_until_sync(lambda: all(servers.get(cut, "DOWN").startswith("DOWN") for servers in  # ("UP 1/2": going)
                                    bed.haproxy.server_states().values()), 15, "the LB to mark the node down")
        # and the metadata store to take writes (when the node cut off led it, a declare waits out the store's 30 s
        # timeout until the other two elect a leader: CI's placement failed so; the broker's wait, not the read's)
        wait_until_sync(lambda: _declares(host, port, bed), 120, "a queue declare through the LB",
                        retry_on=(pika.exceptions.AMQPError,))
        took = []
        for _ in range(3):
            started = time.monotonic()
            placed = placer.connect()
            took.append(round(time.monotonic() - started, 2))
            assert placed.node != bed.nodes[2].name
            placed.close()
        mqtt_took = []
        for i in range(1, 4):
            started = time.monotonic()
            client = mqtt.connect(f"partition-where-{i}")
            mqtt_took.append(round(time.monotonic() - started, 2))
            assert client.node is not None and client.node != bed.nodes[2].name
            close(client)
        bed.heal()
    print(f"placements through the LB with {bed.nodes[2].short} cut off: AMQP {took} s, MQTT {mqtt_took} s")
    assert max(took) < 5.0 and max(mqtt_took) < 5.0


def test_amqp_quorum_clients_on_a_node_cut_from_its_peers_are_ended_by_the_queue_watch_and_lose_nothing(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    """A quorum queue led on n2; an AMQP 0.9.1 publisher with confirms and a consumer, each on a connection of its
    own on n1, which is then cut from its peers (the LB still reaches it: its links stay alive, it answers basic.qos
    and sends heartbeats).  The queue watch ends the consumer's connection once nothing was delivered for a third
    of dead_after and passive declares on n1 counted 0 consumers for 4 s (they counted one before), and the
    publisher's once its publish waited dead_after - 2 s without a confirm.  Connected again to any node, both land
    on the majority (the placer avoids n1 now) and every confirmed message is consumed."""
    import threading

    bed = rabbitmq_partitions
    host, port = bed.lb("amqp")
    lb = LoadBalancer(Address(host, port), amqp=Address(host, port))
    queue, minority = rabbitmq_unique_name, bed.nodes[0].name
    found: dict[str, float] = {}
    confirmed: list[int] = []
    got: set[int] = set()
    with bed.management() as api:
        placer = AmqpPlacer(api, settings=ClientSettings(resolver=lb))
        with placer.connect(bed.nodes[1].name) as leader:
            leader.channel().queue_declare(queue, durable=True, arguments={
                "x-queue-type": "quorum", "x-queue-leader-locator": "client-local"})
        publisher, consumer = placer.connect(minority), placer.connect(minority)
        channel = publisher.channel()
        channel.confirm_delivery()
        reader = consumer.channel()
        reader.basic_qos(prefetch_count=50)
        reader.basic_consume(queue, lambda ch, method, _p, body: (got.add(int(body)), ch.basic_ack(
            method.delivery_tag)))
        for i in range(20):
            channel.basic_publish("", queue, str(i).encode())
            confirmed.append(i)
        wait_until_sync(lambda: consumer.connection.process_data_events(0.1) or len(got) == 20, 10, "the consumer")
        watch = WATCHES[consumer.connection].queues  # its baseline: a declare that counts this consumer (under CI's
        # load the leader answers some of them too late: RabbitMQ then says 0 and 0, and the watch asks again)
        wait_until_sync(lambda: consumer.connection.process_data_events(0.2) or queue in watch.counted, 60,
                        "the queue watch to count the consumer")
        cut = time.monotonic()
        bed.partition("isolate-from-peers", minority)
        try:
            def consume() -> None:
                with contextlib.suppress(pika.exceptions.AMQPError):
                    while time.monotonic() - cut < 40:
                        consumer.connection.process_data_events(0.2)
                found["consumer"] = time.monotonic() - cut
                consumer.close()  # (not ended by the watch: what it holds goes back to the queue at the heal)

            reading = threading.Thread(target=consume)
            reading.start()
            # its own queue watch (no confirm), or the consumer's finding first (the Environment's: every connection
            # placed there ends)
            with pytest.raises(pika.exceptions.AMQPError, match="no confirm|was found cut off since it was placed"):
                channel.basic_publish("", queue, b"20")
            found["publisher"] = time.monotonic() - cut
            reading.join(45)
            assert placer.cut_off.avoided() == {minority}
            publisher, consumer = placer.connect(), placer.connect()  # any node: not the one cut off
            moved = (publisher.node, consumer.node)
            channel = publisher.channel()
            channel.confirm_delivery()
            channel.basic_publish("", queue, b"20")  # the one with no confirm, again
            confirmed.append(20)
            reader = consumer.channel()
            reader.basic_qos(prefetch_count=50)
            reader.basic_consume(queue, lambda ch, method, _p, body: (got.add(int(body)), ch.basic_ack(
                method.delivery_tag)))
            deadline = time.monotonic() + 10
            while not set(confirmed) <= got and time.monotonic() < deadline:
                consumer.connection.process_data_events(0.1)
            before_heal = set(confirmed) <= got  # (a message the leader had handed to the consumer cut off stays
            # with it until the heal: the leader hears of neither its connection's end nor its node's)
        finally:
            bed.heal()
        try:
            wait_until_sync(lambda: consumer.connection.process_data_events(0.1) or set(confirmed) <= got, 60,
                            "every confirmed message consumed")
        finally:
            for placed in (publisher, consumer):
                placed.close()
        with placer.connect(bed.nodes[1].name) as leader:
            leader.channel().queue_delete(queue)
    print(f"on {bed.nodes[0].short} cut from its peers: the consumer's connection ended {found['consumer']:.1f} s "
          f"after the cut, the publisher's {found['publisher']:.1f} s; both moved to {moved}; "
          f"{len(confirmed)} confirmed, all consumed ({'before' if before_heal else 'after'} the heal)")
    assert minority not in moved
    assert found["consumer"] < DEAD_AFTER and found["publisher"] < DEAD_AFTER + 1


def test_an_mqtt_publisher_on_a_node_cut_from_its_peers_is_ended_by_the_puback_watch_and_loses_nothing(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    """A persistent QoS 1 subscriber on n2 (its session's quorum queue led there) and a QoS 1 publisher on n1,
    which is then cut from its peers: n1 still answers the publisher's pings, so only its PUBACKs stop.  The PUBACK
    watch ends the connection once a publish waited dead_after - 2 s; the client reconnects to another node first,
    sends what had no PUBACK again, and the subscriber gets every message PUBACKed (some twice, none lost)."""
    bed = rabbitmq_partitions
    got: list[int] = []
    sub_id, minority = f"puback-{rabbitmq_unique_name[-6:]}", bed.nodes[0]
    topic = f"part/{sub_id}"
    with bed.management() as api:
        settings = ClientSettings(resolver=mqtt_lb(bed))
        sub = MqttPlacer(api, settings=settings, options=MqttOptions(clean_start=False)).connect(
            sub_id, bed.nodes[1].short, subscriptions=[(topic, 1)],
            setup=lambda c: setattr(c, "on_message", lambda cl, u, m: got.append(int(m.payload))))
        pub = MqttPlacer(api, settings=settings).connect(f"{sub_id}-pub", minority.short)
        ended: list[float] = []
        watch = _When(ended, "no PUBACK for")
        logging.getLogger("smartclient.mqtt._paho").addHandler(watch)
        acked: list[int] = []
        try:
            until_routed(pub, topic, got)
            cut = time.monotonic()
            bed.partition("isolate-from-peers", minority.name)
            sent = 0
            while pub.failovers == 0 or not acked or acked[-1] != sent - 1:  # until one after the move is in
                assert time.monotonic() - cut < DEAD_AFTER + 30, f"the publisher on {minority.short} never moved"
                info = pub.publish(topic, str(sent), qos=1)
                sent += 1
                with contextlib.suppress(RuntimeError, ValueError):
                    info.wait_for_publish(12)
                if info.is_published():
                    acked.append(sent - 1)
                time.sleep(0.05)
            moved = time.monotonic() - cut
            wait_until_sync(lambda: set(got) >= set(acked), 30, lambda: f"{len(acked)} PUBACKed ({len(set(got))} in)")
        finally:
            logging.getLogger("smartclient.mqtt._paho").removeHandler(watch)
            bed.heal()
            close(sub, pub)
            close(MqttPlacer(api, settings=settings, options=MqttOptions(clean_start=True)).connect(sub_id))
    print(f"the MQTT publisher on {minority.short} cut from its peers: ended {ended[0] - cut:.1f} s after the cut "
          f"(no PUBACK), PUBACKed again {moved:.1f} s after it, now on {pub.node}; {len(acked)} of {sent} PUBACKed, "
          f"every one received ({len(got) - len(set(got))} twice)")
    assert ended[0] - cut <= DEAD_AFTER + 1 and pub.node != minority.name  # (paho looks every second, or later)


async def test_a_producer_whose_leader_stalls_is_no_false_alarm(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    """A live broker that confirms nothing for 12 s (the stream's writer suspended: nothing is written, confirmed
    or replicated meanwhile), with dead_after 4 s: its connections still carry its heartbeats, so none is taken for
    dead; then every message is confirmed and stored once."""
    bed = rabbitmq_partitions
    async with lb_environment(bed, connection=ConnectionOptions(dead_after=4)) as env:
        collector, consumer, producer, publisher = await flowing(env, rabbitmq_unique_name, name="p",
                                                                 publisher=PatientPublisher)
        await publisher.confirmed_after(time.monotonic(), count=300)
        leader = bed.nodes[node_index(bed, producer.node)]
        stalled = time.monotonic()
        await asyncio.to_thread(bed.suspend_stream_member, rabbitmq_unique_name, leader.name, 12)
        while time.monotonic() - stalled < 12:
            await _tick()
        await publisher.confirmed_after(time.monotonic(), count=300, timeout=60)
        await publisher.stop()
        await collector.wait_for(publisher.sent, timeout=60)
        collector.assert_no_gap(publisher.sent)
        print(f"the leader's writer stalled 12 s (dead_after 4 s): {publisher.sent} messages, each once; "
              f"recoveries: producer {producer.recoveries}, consumer {consumer.recoveries}")
        assert producer.recoveries == 0 and consumer.recoveries == 0


async def test_a_short_partition_run_loses_nothing_and_finds_each_silent_drop(
    rabbitmq_partitions: LocalTestBed,
) -> None:
    """bench/partitions.py, short (issue 55): 2.25 minutes of partitions, one node at a time, each held 12-25 s,
    under the nemesis's whole workload with AMQP 0.9.1 and 1.0 and MQTT QoS 1 on quorum queues, all through the LB
    in lb-only mode.  Streams lose and duplicate nothing, queues and MQTT lose nothing, and every wing's clients
    find each silent drop within dead_after.  (The clients' own recovery after each, printed, is the bench's.)"""
    from smartclient.testing.nemesis import History, run
    from smartclient.testing.partition_run import bounds, detections, plan, record_recoveries

    history = History()
    report = await run(rabbitmq_partitions, plan(PARTITION_RUN_MINUTES, seed=PARTITION_RUN_SEED), progress=print,
                       extras=(record_recoveries,), history=history)
    found = detections(history.records, bounds(DEAD_AFTER))
    print(report.summary())
    print("\n".join(found.summary()))
    print(f"the clients' own share after each stream took writes again: p99 {report.p99_own():.2f} s")
    assert report.lost == 0 and report.duplicated == 0 and report.consumer_gaps == 0, report.summary()
    assert found.times.get("stream"), "no silent drop was found on the streams"
    assert found.beyond == [], found.summary()  # every wing within dead_after


def test_consumers_of_every_wing_leave_a_node_cut_from_its_peers_once_one_wing_finds_it(
    rabbitmq_partitions: LocalTestBed, rabbitmq_unique_name: str
) -> None:
    """A quorum queue led on n1, with an AMQP 0.9.1 consumer, an AMQP 1.0 consumer and a persistent MQTT QoS 1
    subscriber on n1, and an AMQP 0.9.1 publisher with confirms there too; then n1 is cut from its peers (the LB
    still reaches it).  The consumers have nothing to compare (n1 leads their queue, and answers): only the
    publisher's queue watch finds the cut, when its confirms stop.  Its finding is the Environment's
    (``env.cut_off``): the other wings' connections on n1 end at their watches' next look, and recover on the
    majority, where each gets what a publisher there sends, before the heal."""
    bed = rabbitmq_partitions
    host, port = bed.lb("stream")
    lb = LoadBalancer(f"{host}:{port}", amqp=bed.lb("amqp")[1], mqtt=bed.lb("mqtt")[1])
    queue, minority = rabbitmq_unique_name, bed.nodes[0]
    topic, sub_id = f"cut/{queue[-6:]}", f"cut-{queue[-6:]}"
    got: dict[str, set[int]] = {"amqp": set(), "amqp10": set(), "mqtt": set()}
    probes: list[int] = []  # the MQTT subscription's (-1, -2: until it routes)
    with bed.management() as api:
        env = Environment(bed.stream_uri(host, port), resolver=lb, management=api)  # (its AMQP and MQTT wings only)
        with env.amqp.connect(minority.name) as leader:
            leader.channel().queue_declare(queue, durable=True, arguments={
                "x-queue-type": "quorum", "x-queue-leader-locator": "client-local"})
        amqp10 = env.amqp10.consumer(queue, lambda m, accept: (got["amqp10"].add(int(bytes(m.body))), accept()),
                                     prefer="leader")
        sub = env.mqtt_placer(options=MqttOptions(clean_start=False)).connect(
            sub_id, minority.short, subscriptions=[(topic, 1)],
            setup=lambda c: setattr(c, "on_message", lambda cl, u, m: probes.append(int(m.payload))
                                    if int(m.payload) < 0 else got["mqtt"].add(int(m.payload))))
        mqtt_pub = env.mqtt.connect(f"{sub_id}-p", bed.nodes[1].short)
        consumer = env.amqp.connect()  # any node (one asked for stays there), until it is n1
        for _ in range(30):  # (round robin: a few)
            if consumer.node == minority.name:
                break
            consumer.close()
            consumer = env.amqp.connect()
        assert consumer.node == minority.name, f"no connection to any node landed on {minority.short} in 30"
        reader = consumer.channel()
        reader.basic_consume(queue, lambda ch, method, _p, body: (got["amqp"].add(int(body)), ch.basic_ack(
            method.delivery_tag)))
        publisher = env.amqp.connect(minority.name)
        channel = publisher.channel()
        channel.confirm_delivery()
        try:
            assert amqp10.node == minority.name and sub.node == minority.name and consumer.node == minority.name
            until_routed(mqtt_pub, topic, probes)
            cut = time.monotonic()
            bed.partition("isolate-from-peers", minority.name)
            with pytest.raises(pika.exceptions.AMQPError, match="no confirm"):
                channel.basic_publish("", queue, b"-1")
            found = time.monotonic() - cut
            assert env.cut_off.avoided() == {minority.name}
            with contextlib.suppress(pika.exceptions.AMQPError):  # its watch ends it at its next look
                wait_until_sync(lambda: consumer.connection.process_data_events(0.2) or not consumer.connection.is_open,
                                5, "the AMQP 0.9.1 consumer on the node found cut off to end")
            assert not consumer.connection.is_open
            consumer = env.amqp.connect()  # any node: not the one found cut off
            reader = consumer.channel()
            reader.basic_consume(queue, lambda ch, method, _p, body: (got["amqp"].add(int(body)), ch.basic_ack(
                method.delivery_tag)))
            wait_until_sync(lambda: amqp10.recoveries and sub.failovers, 10,
                            lambda: f"the AMQP 1.0 consumer ({amqp10.recoveries}) and the MQTT subscriber "
                                    f"({sub.failovers}) to leave {minority.short}")
            left = time.monotonic() - cut
            with env.amqp.connect() as writer:  # the majority, once it has elected the queue's leader
                confirming = writer.channel()
                confirming.confirm_delivery()
                for i in range(10):
                    confirming.basic_publish("", queue, str(i).encode())
                    mqtt_pub.publish(topic, str(i), qos=1).wait_for_publish(10)
            # (the queue's new leader still counts the consumers on n1, whose cancels cannot reach it: it hands them
            # their share, which stays there until the heal; the two AMQP consumers share the rest)
            wait_until_sync(lambda: consumer.connection.process_data_events(0.1) or all(got.values()), 30,
                            lambda: f"each consumer to get messages: {got}")
            on = (consumer.node, amqp10.node, sub.node)
        finally:
            bed.heal()
            for placed in (consumer, publisher):
                with contextlib.suppress(Exception):
                    placed.close()
            amqp10.close()
            close(sub, mqtt_pub)
            close(env.mqtt_placer(options=MqttOptions(clean_start=True)).connect(sub_id))
            with contextlib.suppress(Exception):
                api.delete(f"/api/queues/%2F/{queue}")
    print(f"{minority.short} cut from its peers: the AMQP publisher found it {found:.1f} s after the cut, the other "
          f"wings' consumers had left it {left:.1f} s after (now on {', '.join(str(n) for n in on)}); got "
          f"{ {k: len(v) for k, v in got.items()} } before the heal")
    assert minority.name not in on

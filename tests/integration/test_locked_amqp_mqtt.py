"""AMQP 0.9.1 and MQTT on the locked test bed, placed by an Environment: OAuth2 tokens of 20 s kept fresh on every
live connection for over two minutes (AMQP takes each on the open connection, AMQP 1.0 by ``PUT /auth/tokens``,
MQTT clients and a fleet hand over to it), nothing lost or sent twice; a revoked subject and an expired token as
typed errors, with no retry storm; SASL EXTERNAL with a client certificate over AMQPS and MQTTS, and a rotated one
used by the next connection (issue 31)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from smartclient import (
    AuthenticationFailed,
    ClientCertificate,
    Environment,
    RetryPolicy,
    TokenCredentials,
    TokenExpired,
    TokenProviderFailed,
)
from smartclient.amqp.placement import PlacedConnection
from smartclient.mqtt.placement import MqttOptions, PlacedMqttClient
from smartclient.testing import TestBed
from smartclient.testing.oauth import DEFAULT_SCOPES, RESOURCE_SERVER_ID, TokenAuthority

from ..conftest import wait_until, wait_until_sync

log = logging.getLogger(__name__)

#: how long the soak runs: the issue asks for at least 2 minutes of 20 s tokens
SOAK = 125.0
LIFETIME = 20.0
#: the bed's scopes give no topic rights (``rabbitmq.write:*/*`` is a vhost and a resource): an MQTT publish or
#: subscription is authorised on the topic too, and the broker closes a connection that publishes without them
SCOPES = [*DEFAULT_SCOPES, f"{RESOURCE_SERVER_ID}.read:*/*/*", f"{RESOURCE_SERVER_ID}.write:*/*/*"]


class Minting:
    """A token provider of the bed's identity provider for ``subject`` (with :data:`SCOPES`), counting its calls."""

    def __init__(self, tokens: TokenAuthority, subject: str, lifetime: float = LIFETIME) -> None:
        self.tokens, self.subject, self.lifetime = tokens, subject, lifetime
        self.calls = 0

    def __call__(self) -> tuple[str, float]:
        self.calls += 1
        return self.tokens.mint(self.subject, self.lifetime, SCOPES)


def locked_environment(bed: TestBed, credentials: Any = None, *, tls: bool = False, retry: RetryPolicy | None = None,
                **more: Any) -> Environment:
    node = bed.nodes[0]
    entry = (f"rabbitmq-stream+tls://{node.host}:{node.stream_tls_port}/" if tls
             else f"rabbitmq-stream://{node.host}:{node.stream_port}/")
    return Environment(entry, credentials=credentials, management=bed.management(),
                       tls=bed.tls_context() if tls else None, retry=retry or RetryPolicy(), **more)


class Worker:
    """A thread running ``body(stop)`` until stopped, keeping what it raised."""

    def __init__(self, name: str, body: Callable[[threading.Event], None]) -> None:
        self.stop = threading.Event()
        self.error: BaseException | None = None

        def run() -> None:
            try:
                body(self.stop)
            except BaseException as exc:  # reported by join()
                self.error = exc

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), f"{self.thread.name} did not stop"
        if self.error is not None:
            raise self.error


def mqtt_close(*clients: PlacedMqttClient) -> None:
    for client in clients:
        client.disconnect()
        client.loop_stop()


def forget_session_on(env: Environment, client_id: str, node: str) -> None:
    """Connect once more with a clean start, so that the broker drops the persistent session (and its queue)."""
    mqtt_close(env.mqtt_client(client_id, node, options=MqttOptions(clean_start=True)))


# -- the soak: 20 s tokens for over two minutes ----------------------------------------------------------------
class StreamSoak:
    """A stream producer sending a number every 10 ms and a consumer reading them (the soak's stream part)."""

    def __init__(self, env: Environment, stream: str) -> None:
        self.env, self.stream = env, stream
        self.sent = 0
        self.got: list[int] = []
        self.stop = asyncio.Event()

    async def start(self) -> None:
        await self.env.create_stream(self.stream)
        self.producer = await self.env.producer(self.stream)

        async def on_message(message: bytes, context: Any) -> None:
            self.got.append(int(message))

        self.consumer = await self.env.consumer(self.stream, on_message, offset="first")
        self.opened = {conn.name for conn in self.env.streams.connector.connections}
        self.task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while not self.stop.is_set():
            await self.producer.send(str(self.sent).encode())
            self.sent += 1
            await asyncio.sleep(0.01)

    async def finish(self) -> None:
        self.stop.set()
        await self.task
        await self.producer.flush()
        await wait_until(lambda: len(self.got) >= self.sent, 30, f"the stream consumer to read all {self.sent}")


class AmqpSoak:
    """A publisher (publisher confirms) on node 1 and a consumer on node 2 of one queue, counting sequence numbers."""

    def __init__(self, env: Environment, bed: TestBed, queue: str) -> None:
        self.queue = queue
        self.consumer = env.amqp_connection(bed.nodes[1].short)
        self.publisher = env.amqp_connection(bed.nodes[0].short)
        self.consumer.channel().queue_declare(queue, durable=True)
        self.sent = 0
        self.got: list[int] = []
        self.workers = [Worker("amqp-consumer", self._consume), Worker("amqp-publisher", self._publish)]

    def _publish(self, stop: threading.Event) -> None:
        channel = self.publisher.channel()
        channel.confirm_delivery()
        while not stop.is_set():
            channel.basic_publish("", self.queue, str(self.sent).encode(), mandatory=True)  # confirmed, or raises
            self.sent += 1
            time.sleep(0.005)  # never pumps process_data_events: only publishes and their confirms

    def _consume(self, stop: threading.Event) -> None:
        channel = self.consumer.channel()
        channel.basic_qos(prefetch_count=200)

        def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
            self.got.append(int(body))
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(self.queue, on_message)
        while not stop.is_set():
            self.consumer.connection.process_data_events(0.2)

    def placed(self) -> list[PlacedConnection]:
        return [self.publisher, self.consumer]


class Amqp10Soak:
    """An AMQP 1.0 publisher on a quorum queue's leader and a consumer on a member (issue 34): each new token goes
    to their live connections (``PUT /auth/tokens``, RabbitMQ 4.1+), the publisher's between two messages, the
    consumer's on its own thread."""

    def __init__(self, env: Environment, queue: str) -> None:
        self.env, self.queue = env, queue
        self._admin(lambda channel: channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"}))
        self.placer = env.amqp10
        self.sent = 0
        self.got: list[int] = []
        self.consumer = self.placer.consumer(queue, self._on_message, prefer="replica")
        self.publisher = self.placer.publisher(queue)
        self.connections = (self.publisher.placed, self.consumer.placed)
        self.workers = [Worker("amqp10-publisher", self._publish)]

    def _on_message(self, message: Any, accept: Any) -> None:
        self.got.append(int(bytes(message.body)))
        accept()

    def _publish(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.publisher.publish(str(self.sent).encode())  # settled by the broker, or raises
            self.sent += 1
            time.sleep(0.01)

    def _admin(self, action: Callable[[Any], Any]) -> None:
        """``action(channel)`` on an AMQP 0.9.1 connection of its own, closed at once (an idle one would outlive
        its token: pika's take a new one only when their thread calls pika)."""
        placed = self.env.amqp_connection()
        try:
            with placed.channel() as channel:
                action(channel)
        finally:
            placed.close()

    def close(self) -> None:
        self.publisher.close()
        self.consumer.close()
        self._admin(lambda channel: channel.queue_delete(self.queue))


class MqttSoak:
    """QoS 1 from a placed publisher (node 1, clean start) and a fleet of six to a persistent subscriber (node 3,
    clean start off), each message naming its sender and sequence number."""

    FLEET = 6

    def __init__(self, env: Environment, bed: TestBed, topic: str) -> None:
        self.topic = topic
        self.got: dict[str, list[int]] = {}
        self.trail: list[tuple[float, str, int, bool]] = []  # (when, sender, seq, DUP flag) of every message
        self.dropped = 0  # on_disconnect calls: a broker close (a hand-over calls none)
        self.subscriber_id = f"soak-sub-{uuid.uuid4().hex[:6]}"
        self.subscriber_node = bed.nodes[2].short
        self.subscriber = env.mqtt_client(self.subscriber_id, self.subscriber_node, setup=self._setup,
                                          subscriptions=[(f"{topic}/#", 1)], options=MqttOptions(clean_start=False))
        self.publisher = env.mqtt_client(f"soak-pub-{uuid.uuid4().hex[:6]}", bed.nodes[0].short, setup=self._dropped)
        self.fleet = env.mqtt_fleet(self.FLEET, client_id_prefix=f"soak-fleet-{uuid.uuid4().hex[:6]}")
        self.fleet.start()
        self._until_routed()
        self.sent: Counter[str] = Counter()
        self.workers = [Worker("mqtt-publishers", self._publish)]

    def _setup(self, client: PlacedMqttClient) -> None:
        def on_message(c: Any, userdata: Any, message: Any) -> None:
            sender, seq = message.payload.decode().split(":")
            self.got.setdefault(sender, []).append(int(seq))
            self.trail.append((time.time(), sender, int(seq), message.dup))

        client.on_message = on_message
        self._dropped(client)

    def _dropped(self, client: PlacedMqttClient) -> None:
        def on_disconnect(*args: Any) -> None:
            self.dropped += 1

        client.on_disconnect = on_disconnect

    def _until_routed(self) -> None:
        """Probe until the subscription routes (4.0.5 acknowledges a SUBSCRIBE a moment before it does)."""
        def probed() -> bool:
            self.publisher.publish(f"{self.topic}/probe", b"probe:0", qos=1).wait_for_publish(5)
            return "probe" in self.got

        wait_until_sync(probed, 15, f"the subscription to {self.topic}/# to route", interval=0.05)

    def _publish(self, stop: threading.Event) -> None:
        pending: deque[Any] = deque()
        while not stop.is_set():
            pending.append(self.publisher.publish(f"{self.topic}/p", f"p:{self.sent['p']}".encode(), qos=1))
            self.sent["p"] += 1
            for i in range(self.FLEET):
                sender = f"f{i}"
                pending.append(self.fleet.publish(i, f"{self.topic}/{sender}", f"{sender}:{self.sent[sender]}", qos=1))
                self.sent[sender] += 1
            while len(pending) > 200:  # a bounded window of unacknowledged messages
                pending.popleft().wait_for_publish(30)
            time.sleep(0.02)
        for info in pending:
            info.wait_for_publish(30)
            assert info.is_published()

    def received_all(self) -> bool:
        return all(len(self.got.get(sender, [])) >= n for sender, n in self.sent.items())


async def test_20_s_tokens_for_two_minutes_close_no_connection_lose_nothing_and_reach_every_connection(
        rabbitmq_testbed: TestBed, rabbitmq_tokens: TokenAuthority, rabbitmq_unique_name: str) -> None:
    bed = rabbitmq_testbed
    provider = Minting(rabbitmq_tokens, f"soak-{uuid.uuid4().hex[:6]}")
    credentials = TokenCredentials(provider)  # refreshed at 3/4 of the lifetime, spread by a tenth
    queue, topic = rabbitmq_unique_name, f"soak/{uuid.uuid4().hex[:6]}"
    async with locked_environment(bed, credentials) as env:
        amqp = AmqpSoak(env, bed, queue)
        mqtt = MqttSoak(env, bed, topic)
        amqp10 = Amqp10Soak(env, f"{queue}-amqp10") if renews_amqp10(bed) else None
        stream = StreamSoak(env, f"{queue}-stream")  # streams, AMQP 0.9.1 and 1.0 and MQTT in one soak
        await stream.start()
        names = [placed.name for placed in amqp.placed()]
        try:
            began = time.monotonic()
            while time.monotonic() - began < SOAK:  # the passing time is the scenario; fail early on a loss
                await asyncio.sleep(1.0)
                assert all(p.failure is None and p.connection.is_open for p in amqp.placed()), \
                    [p.failure for p in amqp.placed()]
                assert mqtt.dropped == 0 and mqtt.fleet.disconnects == 0
            await stream.finish()
            for worker in amqp.workers[1:] + mqtt.workers + (amqp10.workers if amqp10 else []):  # the publishers
                worker.join()
            await wait_until(lambda: len(amqp.got) >= amqp.sent and mqtt.received_all(), 30,
                             lambda: f"every message: AMQP {len(amqp.got)}/{amqp.sent}, MQTT "
                                     f"{ {s: len(mqtt.got.get(s, [])) for s in mqtt.sent} } of {dict(mqtt.sent)}")
            amqp.workers[0].join()
            refreshes = credentials.refreshes
            placer = env.amqp
            # no connection was closed by the broker, none replaced: AMQP's are the same, open; MQTT's were handed
            # over by the clients themselves (DISCONNECT first), never dropped or failed over
            assert [p.name for p in amqp.placed()] == names
            assert all(p.connection.is_open and p.failure is None for p in amqp.placed())
            assert mqtt.dropped == 0 and mqtt.publisher.failovers == mqtt.subscriber.failovers == 0
            # a client in a hand-over is down for a moment (20 s tokens: one every few seconds): every one comes back
            await wait_until(lambda: mqtt.fleet.connected == MqttSoak.FLEET, 15,
                             lambda: f"the fleet: {mqtt.fleet.connected} of {MqttSoak.FLEET} connected")
            assert mqtt.fleet.disconnects == mqtt.fleet.reconnects == 0
            # every connection took the new tokens
            assert refreshes >= SOAK // LIFETIME, f"{refreshes} refreshes in {SOAK:.0f} s of {LIFETIME:.0f} s tokens"
            assert provider.calls <= refreshes + 2  # one call for every connection of every wing
            assert all(p.secret_updates >= refreshes - 1 for p in amqp.placed()), [p.secret_updates for p in
                                                                                  amqp.placed()]
            assert placer.secret_failures == 0
            clients = [mqtt.publisher, mqtt.subscriber, *mqtt.fleet]
            assert all(c.handovers >= refreshes - 1 for c in clients), [c.handovers for c in clients]
            assert mqtt.fleet.token_refusals == 0 and all(c.token_refusals == 0 for c in clients)
            if amqp10 is not None:  # the same connections, each new token taken on them, nothing lost or twice
                await wait_until(lambda: len(amqp10.got) >= amqp10.sent, 30,
                                 lambda: f"the AMQP 1.0 consumer: {len(amqp10.got)} of {amqp10.sent}")
                assert (amqp10.publisher.placed, amqp10.consumer.placed) == amqp10.connections
                assert amqp10.publisher.recoveries == amqp10.consumer.recoveries == 0
                assert amqp10.consumer.failure is None and amqp10.placer.token_failures == 0
                updates = [c.token_updates for c in amqp10.connections if c is not None]
                assert all(n >= refreshes - 1 for n in updates), updates
                assert amqp10.got == list(range(amqp10.sent))
            # the stream connections: the same ones open, nothing recovered, every update taken (the locator too)
            assert {conn.name for conn in env.streams.connector.connections} == stream.opened
            assert stream.producer.recoveries == 0 and stream.consumer.recoveries == 0
            assert env.streams.connector.secret_failures == 0
            assert env.streams.connector.secret_updates >= (refreshes - 1) * (len(stream.opened) + 1)
            log.warning(
                "soak of %.0f s, %d refreshes, %d provider calls: AMQP %d messages confirmed and consumed, secret "
                "updates %s; MQTT %d messages from %d senders, hand-overs %s; stream %d messages, %d secret updates",
                SOAK, refreshes, provider.calls, amqp.sent, [p.secret_updates for p in amqp.placed()],
                sum(mqtt.sent.values()), len(mqtt.sent), [c.handovers for c in clients], stream.sent,
                env.streams.connector.secret_updates)
        finally:
            for worker in amqp.workers + mqtt.workers + (amqp10.workers if amqp10 else []):
                worker.stop.set()
                worker.thread.join(10)
            if amqp10 is not None:
                amqp10.close()
            mqtt.fleet.close()
            mqtt_close(mqtt.publisher, mqtt.subscriber)
            with amqp.consumer.channel() as channel:
                channel.queue_delete(queue)
            for placed in amqp.placed():
                placed.close()
            forget_session_on(env, mqtt.subscriber_id, mqtt.subscriber_node)
            stream.stop.set()
            await env.delete_stream(stream.stream, missing_ok=True)
    assert stream.got == list(range(stream.sent))  # the stream's: nothing lost, nothing twice, in order
    # nothing lost, nothing twice: AMQP in order (one publisher, one queue), MQTT each sender's in full
    assert amqp.got == list(range(amqp.sent))
    for sender, n in mqtt.sent.items():
        twice = {seq for seq, times in Counter(mqtt.got[sender]).items() if times > 1}
        assert sorted(mqtt.got[sender]) == list(range(n)), \
            f"{sender}: twice {sorted(twice)[:10]}: {[t for t in mqtt.trail if t[1] == sender and t[2] in twice][:10]}"


def renews_amqp10(bed: TestBed) -> bool:
    """Whether the soak runs the AMQP 1.0 clients: the extra installed and a broker that renews their tokens."""
    try:
        import rabbitmq_amqp_python_client  # noqa: F401
    except ImportError:
        print("SKIPPED part: the AMQP 1.0 clients of the token soak (the [amqp10] extra is not installed)")
        return False
    version = bed.rabbitmq_version()
    if tuple(int(x) for x in version.split(".")[:2]) < (4, 1):
        print(f"SKIPPED part: the AMQP 1.0 clients of the token soak (RabbitMQ {version} renews no token on a "
              f"live AMQP 1.0 connection: 4.1+)")
        return False
    return True


# -- a provider that fails, a token that expired -----------------------------------------------------------------
QUICK = RetryPolicy(max_attempts=5, max_time=5.0, backoff_initial=0.1, backoff_max=0.5)


def noticed(placed: PlacedConnection) -> Any:
    """Why the broker closed ``placed``, once its thread (this one) calls pika, as an application would."""
    with contextlib.suppress(Exception):  # pika's own: the application's pika calls are its own
        placed.connection.process_data_events(0)
    return placed.failure


async def test_a_revoked_subject_is_a_typed_error_with_no_retry_storm(
        rabbitmq_testbed: TestBed, rabbitmq_tokens: TokenAuthority) -> None:
    bed = rabbitmq_testbed
    subject = f"revoked-{uuid.uuid4().hex[:6]}"
    provider = Minting(rabbitmq_tokens, subject, lifetime=8.0)
    credentials = TokenCredentials(provider)
    async with locked_environment(bed, credentials, retry=QUICK) as env:
        placed = env.amqp_connection(bed.nodes[0].short)
        client = env.mqtt_client(f"revoked-{uuid.uuid4().hex[:6]}", bed.nodes[1].short)
        try:
            rabbitmq_tokens.revoke(subject)  # the identity provider refuses it from now on (as its 401 would)
            held = credentials.token
            assert held is not None
            # the token held stays in use while it is valid (new connections log in with it); the refresher's calls
            # fail on their back-off meanwhile
            await wait_until(lambda: time.time() > held.expires_at - 1, 15, "the token held to expire")
            assert credentials.failures >= 1
            # new connections: typed at once, and the provider is asked no more often than its back-off lets
            calls, tries, began = provider.calls, 0, time.monotonic()
            while time.monotonic() - began < 10.0:
                for connect in (env.amqp_connection, env.mqtt_client):
                    with pytest.raises(TokenProviderFailed, match=subject):
                        connect()
                    tries += 1
                await asyncio.sleep(0.02)
            asked = provider.calls - calls
            # back-off 1, 2, 4, 8 s (+- a fifth), whoever asks (connects, reconnects, the refresher): <= 5 in 10 s
            assert tries > 200 and 1 <= asked <= 5, (tries, asked)
            # the live connections kept the token they had until it expired; then the broker ended them, and the
            # MQTT client's reconnect, which cannot log in, gave up typed
            await wait_until(lambda: client.failure is not None, 20, "the MQTT client to give up")
            assert isinstance(client.failure, TokenProviderFailed) and not client.is_connected()
            if bed.rabbitmq_version() >= "4.3":  # 4.0.5 keeps an AMQP connection open past its token's expiry
                await wait_until(lambda: noticed(placed), 10, "the broker to end the AMQP connection")
                assert isinstance(placed.failure, TokenExpired) and "credential expired" in str(placed.failure)
            log.warning("revoked: %d connects refused in 10 s, the provider asked %d times (%d in all)", tries, asked,
                        provider.calls)
        finally:
            placed.close()
            mqtt_close(client)


async def test_a_token_past_its_expiry_at_connect_is_token_expired_naming_it(
        rabbitmq_testbed: TestBed, rabbitmq_tokens: TokenAuthority) -> None:
    bed = rabbitmq_testbed
    expired = TokenCredentials(lambda: rabbitmq_tokens.mint("late", -30.0, SCOPES), name="late-idp")
    async with locked_environment(bed) as env:  # the stream wing logs in with guest; these two wings with the token
        amqp = env.amqp
        amqp.login = expired
        with pytest.raises(TokenExpired, match=r"late-idp answered a token that expired at \d{4}-\d\d-\d\dT") as caught:
            amqp.connect(bed.nodes[0].short)
        assert caught.value.expires_at is not None and caught.value.expires_at < time.time()
        placer = env.mqtt_placer()
        placer.login.credentials = expired
        with pytest.raises(TokenExpired, match="late-idp answered a token that expired at") as caught:
            placer.connect(f"late-{uuid.uuid4().hex[:6]}", bed.nodes[0].short)
        # a token the broker refuses (a key it does not trust): refused, naming the provider and the token's expiry
        untrusted = TokenCredentials(lambda: rabbitmq_tokens.mint("x", 60.0, SCOPES, key="untrusted"), name="rogue")
        amqp.login = untrusted
        with pytest.raises(AuthenticationFailed, match="refused the token from rogue") as refused:
            amqp.connect(bed.nodes[0].short)
        assert not isinstance(refused.value, TokenExpired)
        placer.login.credentials = untrusted
        with pytest.raises(AuthenticationFailed, match="refused the token from rogue"):
            placer.connect(f"rogue-{uuid.uuid4().hex[:6]}", bed.nodes[0].short)


# -- EXTERNAL: the client certificate is the identity ---------------------------------------------------------------
def listed(bed: TestBed, column: str, name: str) -> dict[str, Any]:
    """The management API's row of the connection whose ``column`` is ``name`` (once it lists it)."""
    def row() -> dict[str, Any] | None:
        with bed.management() as api:
            return next((r for r in api.get("/api/connections") if (r.get("client_properties") or {}).get(column)
                         == name), None)

    found: dict[str, Any] = wait_until_sync(row, 15, f"the management API to list {name}", interval=0.25)
    return found


@pytest.fixture
def current_certificate(rabbitmq_testbed: TestBed, rabbitmq_client_certificate: Any) -> Iterator[list[Any]]:
    """The bed's client certificate, in a list the test replaces it in when it rotates it."""
    yield [rabbitmq_client_certificate]


async def test_external_with_a_client_certificate_over_amqps_and_mqtts_and_a_rotated_one_on_the_next_connection(
        rabbitmq_testbed: TestBed, current_certificate: list[Any]) -> None:
    bed = rabbitmq_testbed

    def certificate() -> ClientCertificate:  # asked before each connection
        bed_certificate = current_certificate[0]
        return ClientCertificate(bed_certificate.cert_file, bed_certificate.key_file)

    async with locked_environment(bed, tls=True, client_certificate=certificate) as env:  # no credentials: EXTERNAL
        subjects = []
        for rotation in range(2):
            placed = env.amqp_connection(bed.nodes[1].short)
            client = env.mqtt_client(f"external-{uuid.uuid4().hex[:6]}", bed.nodes[2].short)
            try:
                assert placed.dialled.port == bed.nodes[1].port("amqp_tls")  # the AMQPS listener
                assert client.dialled.port == bed.nodes[2].port("mqtt_tls")  # the MQTTS listener
                amqp_row = listed(bed, "connection_name", placed.name)
                mqtt_row = listed(bed, "client_id", client.client_id)
                common_name = current_certificate[0].common_name
                assert amqp_row["user"] == mqtt_row["user"] == common_name
                assert amqp_row["auth_mechanism"] == "EXTERNAL" and amqp_row["ssl"] and mqtt_row["ssl"]
                # each certificate the bed issues has a subject of its own (trustme: "OU=Testing cert #<random>")
                assert amqp_row["peer_cert_subject"] == mqtt_row["peer_cert_subject"]
                subjects.append(amqp_row["peer_cert_subject"])
                with placed.channel() as channel:  # and it may work: its user's permissions
                    channel.queue_declare("", exclusive=True)
                client.publish("external/check", b"x", qos=1).wait_for_publish(5)
            finally:
                placed.close()
                mqtt_close(client)
            if rotation == 0:
                current_certificate[0] = bed.rotate_client_certificate()  # new files, a new key and subject
        assert subjects[0] != subjects[1]  # the next connections presented the rotated certificate

"""The nemesis's workloads that run in threads (RPC, MQTT, AMQP 1.0 and 0.9.1 on quorum queues, MQTT QoS 1), each
through the Environment's placers and the load balancer, recording into the run's
:class:`~smartclient.testing.nemesis.History` until ``halt``."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from smartclient.testing.probe import is_probe

__all__ = [
    "Awaited",
    "amqp10_loop",
    "amqp_quorum_loop",
    "declare_quorum_queue",
    "found",
    "mqtt_loop",
    "mqtt_qos1_loop",
    "op",
    "publish",
    "quorum_queues",
    "rpc_loop",
]


class Awaited:
    """What the end of a queue's loop waits for, kept small for a soak's flat resources: the confirmed ids not
    received yet, and the ids received before their confirm was counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._awaited: set[int] = set()
        self._early: set[int] = set()

    def received(self, history: Any, client: str, producer: str, number: int) -> None:
        with self._lock:
            if number in self._awaited:
                self._awaited.discard(number)
            else:
                self._early.add(number)
        history.add("received", client=client, producer=producer, id=number)

    def confirmed(self, history: Any, producer: str, number: int) -> None:
        history.add("confirm", client=producer, id=number)
        with self._lock:
            if number in self._early:
                self._early.discard(number)
            else:
                self._awaited.add(number)

    def wait(self, seconds: float) -> None:
        """Until every confirmed id was received, or ``seconds`` passed (the checker then names what is lost)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self._awaited:
            time.sleep(0.1)


def found(history: Any, client: str, wing: str) -> None:
    """Record that ``client`` found its connection dead now (the checker times its own share from there; the
    partition run times the finding: :mod:`smartclient.testing.partition_run`)."""
    history.add("found", client=client, wing=wing, started=round(time.monotonic() - history.start, 4))


def op(history: Any, client: str, action: Callable[[], Any], setup: bool = False) -> bool:
    """Run ``action`` and record it as an ``op``; a ``setup`` op (a one-off start) is not timed against faults."""
    extra = {"setup": True} if setup else {}
    try:
        action()
    except Exception as exc:  # counted by type: the checker reports RPC and MQTT errors this way
        history.add("op", client=client, ok=False, error=type(exc).__name__, **extra)
        return False
    history.add("op", client=client, ok=True, **extra)
    return True


def rpc_loop(env: Any, history: Any, halt: threading.Event, run_id: str) -> None:
    """RPC servers on every node and a client through the LB (its node's server answers), until ``halt``."""
    from smartclient.amqp.rpc import RpcClient, RpcServer

    exchange = f"nemesis-{run_id}-rpc"
    placer = env.amqp
    with RpcServer(placer, exchange, lambda body, properties: b"re:" + body) as server:
        while not op(history, "rpc-server", server.start, setup=True):  # a fault at the start: try again
            server.stop()
            if halt.wait(1.0):
                return
        while not halt.is_set():
            try:
                with placer.connect() as placed:
                    call = partial(RpcClient(placed, exchange, timeout=5.0).call, b"ping")
                    while not halt.is_set() and op(history, "rpc", call):
                        halt.wait(0.05)
                    found(history, "rpc", "rpc")  # a call failed (5 s without an answer): it connects again
            except Exception as exc:  # placing or opening the client failed: counted, then tried again
                history.add("op", client="rpc", ok=False, error=type(exc).__name__)
            halt.wait(0.5)


def mqtt_loop(env: Any, history: Any, halt: threading.Event, run_id: str) -> None:
    """A fleet of 12 MQTT clients through the LB, one of them publishing QoS 1 every 50 ms, until ``halt``."""
    fleet = env.mqtt_fleet(12, client_id_prefix=f"nemesis-{run_id}")
    while not op(history, "mqtt-fleet", fleet.start, setup=True):  # a fault at the start: try again
        fleet.close()
        fleet = env.mqtt_fleet(12, client_id_prefix=f"nemesis-{run_id}")
        if halt.wait(1.0):
            return
    try:
        n = 0
        while not halt.is_set():
            n += 1

            def publish(n: int = n) -> None:
                info = fleet.publish(n % len(fleet), f"nemesis/{run_id}", b"%d" % n, qos=1)
                info.wait_for_publish(timeout=5.0)
                if not info.is_published():
                    raise TimeoutError("no PUBACK within 5 s")

            if not op(history, "mqtt", publish):
                found(history, "mqtt", "mqtt-fleet")
            halt.wait(0.05)
    finally:
        fleet.close()


def amqp10_loop(env: Any, history: Any, halt: threading.Event, run_id: str) -> None:
    """An AMQP 1.0 publisher on a quorum queue's leader and a consumer on a replica, both through the LB (the
    ``[amqp10]`` extra), until ``halt``; then every confirmed message is waited for.  The checker holds each
    confirmed id received at least once (``received``), and counts those received again."""
    import importlib.util

    if importlib.util.find_spec("rabbitmq_amqp_python_client") is None:
        return  # the extra is not installed: no AMQP 1.0 client in this run
    from smartclient import SmartClientError

    queue, awaited = f"nemesis-{run_id}-amqp10", Awaited()

    def on_message(message: Any, accept: Callable[[], None]) -> None:
        if not is_probe(body := bytes(message.body)):
            awaited.received(history, "amqp10-c", "amqp10-p", int(body))
        accept()

    placer = env.amqp10
    if not declare_quorum_queue(env, history, halt, queue):
        return
    consumer = None
    try:
        while consumer is None and not halt.is_set():
            try:
                consumer = placer.consumer(queue, on_message, prefer="replica")
            except SmartClientError as exc:  # a fault at the start: try again
                history.add("op", client="amqp10-setup", ok=False, error=type(exc).__name__, setup=True)
                halt.wait(1.0)
        publish(history, halt, "amqp10-p", awaited, lambda: placer.publisher(queue), lambda p, body: p.publish(body),
                lambda p: p.close())
    finally:
        if consumer is not None:
            consumer.close()
        with contextlib.suppress(SmartClientError):
            env.management.delete(f"/api/queues/%2F/{queue}")


def publish(history: Any, halt: threading.Event, client: str, awaited: Awaited, start: Callable[[], Any],
            send: Callable[[Any, bytes], None], drop: Callable[[Any], None], found_as: str = "") -> None:
    """Publish numbered messages as ``client`` until ``halt``, then wait for each confirmed one to be received:
    ``start()`` a publisher (again a second later when that failed: counted as a setup error), ``send(it, body)``
    each message (a return is its confirm); one that raised is failed as indeterminate (it may be in the queue)
    and the publisher dropped (``drop(it)``; with ``found_as``, a wing: the client found its connection dead)."""
    handle, number = None, 0
    try:
        while not halt.is_set():
            if handle is None:
                try:
                    handle = start()
                except Exception as exc:
                    history.add("op", client=f"{client.rsplit('-', 1)[0]}-setup", ok=False, error=type(exc).__name__,
                                setup=True)
                    halt.wait(1.0)
                    continue
            number += 1
            history.add("send", client=client, id=number)
            try:
                send(handle, b"%d" % number)
            except Exception as exc:  # recovery gave up, the connection was found dead, the broker refused it
                history.add("fail", client=client, id=number, reason=f"{type(exc).__name__}: {exc}", code=-1)
                if found_as:
                    found(history, client, found_as)
                with contextlib.suppress(Exception):
                    drop(handle)
                handle = None
                continue
            awaited.confirmed(history, client, number)
            halt.wait(0.05)
        awaited.wait(60)
    finally:
        if handle is not None:
            with contextlib.suppress(Exception):
                drop(handle)


def quorum_queues(run_id: str, amqp10: bool, queues: bool) -> dict[str, tuple[str, ...]]:
    """The quorum queues of a run's queue clients, each with the clients that use it: after a silent drop each is
    probed (:func:`~smartclient.testing.probe.queues_writable`), and its clients' own share timed from when it took
    a write again.  The MQTT subscriber's session queue is named by RabbitMQ (``mqtt-subscription-<id>qos1``)."""
    return {**({f"nemesis-{run_id}-amqp10": ("amqp10-p", "amqp10-c")} if amqp10 else {}),
            **({f"nemesis-{run_id}-amqp": ("amqp-p", "amqp-c"),
                f"mqtt-subscription-nemesis-{run_id}-q1-sqos1": ("mqtt-p", "mqtt-c")} if queues else {})}


def declare_quorum_queue(env: Any, history: Any, halt: threading.Event, queue: str) -> bool:
    """Declare ``queue`` (quorum) through the management API, again until it worked or ``halt``."""
    while not op(history, "queue-setup", lambda: env.management.put(
            f"/api/queues/%2F/{queue}", {"durable": True, "arguments": {"x-queue-type": "quorum"}}), setup=True):
        if halt.wait(1.0):
            return False
    return True


def amqp_quorum_loop(env: Any, history: Any, halt: threading.Event, run_id: str) -> None:
    """An AMQP 0.9.1 publisher with confirms on a quorum queue and a consumer acknowledging each message, each on a
    connection of its own through the LB, until ``halt``; then every confirmed message is waited for.  A publish
    that raised (its connection found dead, say) is failed as indeterminate (it may be in the queue) and the
    publisher connects again: at least once, checked as ``received``."""
    queue, awaited = f"nemesis-{run_id}-amqp", Awaited()
    if not declare_quorum_queue(env, history, halt, queue):
        return
    done = threading.Event()  # the consumer's end: once the publisher's waiting is over

    def consume() -> None:
        while not done.is_set():
            try:
                with env.amqp.connect() as placed:
                    channel = placed.channel()
                    channel.basic_qos(prefetch_count=200)
                    for method, _, body in channel.consume(queue, inactivity_timeout=0.2):
                        if method is not None:
                            if not is_probe(body):
                                awaited.received(history, "amqp-c", "amqp-p", int(body))
                            channel.basic_ack(method.delivery_tag)
                        if done.is_set():
                            break
            except Exception as exc:  # its connection lost: counted, then placed again
                history.add("op", client="amqp-c", ok=False, error=type(exc).__name__)
                if "was found cut off since" not in str(exc):  # (another wing's finding, recorded there: not its own)
                    found(history, "amqp-c", "amqp")
                done.wait(0.5)

    def start() -> tuple[Any, Any]:
        placed = env.amqp.connect()
        try:
            channel = placed.channel()
            channel.confirm_delivery()
        except BaseException:
            placed.close()
            raise
        return placed, channel

    consumer = threading.Thread(target=consume, name="amqp-quorum-consumer", daemon=True)
    consumer.start()
    try:
        publish(history, halt, "amqp-p", awaited, start, lambda pc, body: pc[1].basic_publish("", queue, body),
                lambda pc: pc[0].close(), found_as="amqp")
    finally:
        done.set()
        consumer.join(30)
        with contextlib.suppress(Exception):
            env.management.delete(f"/api/queues/%2F/{queue}")


def mqtt_qos1_loop(env: Any, history: Any, halt: threading.Event, run_id: str) -> None:
    """An MQTT publisher at QoS 1 and a subscriber in a persistent session (a quorum queue on the bed), each
    placed through the LB and recovering by itself, until ``halt``; then every PUBACKed message is waited for.  A
    publish without its PUBACK within 10 s is failed as indeterminate: at least once, checked as ``received``."""
    from smartclient.mqtt.placement import MqttOptions

    awaited, topic, client_id = Awaited(), f"nemesis/{run_id}/q1", f"nemesis-{run_id}-q1"
    routed = threading.Event()  # a probe came through: the subscription routes (SUBACK comes a little before)

    def setup(client: Any) -> None:
        client.on_message = lambda c, u, m: routed.set() if is_probe(m.payload) else awaited.received(
            history, "mqtt-c", "mqtt-p", int(m.payload))

    sessions = env.mqtt_placer(options=MqttOptions(clean_start=False))

    def subscribe() -> Any:
        return sessions.connect(f"{client_id}-s", subscriptions=[(topic, 1)], setup=setup)

    sub = pub = None
    while sub is None or pub is None:
        try:
            sub = sub or subscribe()
            pub = pub or env.mqtt.connect(f"{client_id}-p")
        except Exception as exc:  # a fault at the start: try again
            history.add("op", client="mqtt-setup", ok=False, error=type(exc).__name__, setup=True)
            if halt.wait(1.0):
                break
    try:
        _until_routed(pub, topic, routed, halt)
        number = 0
        while pub is not None and not halt.is_set():
            if sub is not None and sub.failure is not None:  # its recovery gave up: its session keeps the messages
                found(history, "mqtt-c", "mqtt")
                sub.close_quietly()
                sub = _connect_again(subscribe, history, halt)
            number += 1
            history.add("send", client="mqtt-p", id=number)
            try:
                info = pub.publish(topic, b"%d" % number, qos=1)
                info.wait_for_publish(timeout=10.0)
                published = info.is_published()
            except Exception as exc:  # (a client that gave up for good is placed anew)
                history.add("fail", client="mqtt-p", id=number, reason=f"{type(exc).__name__}: {exc}"[:120], code=-1)
                if pub.failure is not None:
                    found(history, "mqtt-p", "mqtt")
                    pub.close_quietly()
                    pub = _connect_again(lambda: env.mqtt.connect(f"{client_id}-p"), history, halt)
                halt.wait(0.05)
                continue
            if published:
                awaited.confirmed(history, "mqtt-p", number)
            else:
                history.add("fail", client="mqtt-p", id=number, reason="no PUBACK within 10 s", code=-1)
            halt.wait(0.05)
        awaited.wait(60)
    finally:
        for client in (pub, sub):
            if client is not None:
                client.close_quietly()
        with contextlib.suppress(Exception):  # the session ends: a clean start under its client id
            env.mqtt.connect(f"{client_id}-s", start=False).close_quietly()


def _until_routed(pub: Any, topic: str, routed: threading.Event, halt: threading.Event, within: float = 30.0) -> None:
    """Publish probes to ``topic`` until one is ``routed`` (or ``within`` s, or ``halt``): RabbitMQ acknowledges a
    SUBSCRIBE tens of milliseconds before publishes from other connections reach it (docs/mqtt.md), and a QoS 1
    message published in that window is acknowledged and goes nowhere."""
    deadline = time.monotonic() + within
    while pub is not None and not routed.is_set() and time.monotonic() < deadline and not halt.is_set():
        with contextlib.suppress(Exception):  # (a fault at the start: the next probe)
            pub.publish(topic, b"probe:routed", qos=1).wait_for_publish(timeout=2.0)
        routed.wait(0.05)


def _connect_again(connect: Callable[[], Any], history: Any, halt: threading.Event) -> Any:
    """``connect()`` again, every second until it works (None once ``halt``)."""
    while not halt.is_set():
        try:
            return connect()
        except Exception as exc:
            history.add("op", client="mqtt-setup", ok=False, error=type(exc).__name__, setup=True)
            halt.wait(1.0)
    return None

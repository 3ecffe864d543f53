"""Thousands of MQTT connections from one process, driven by one selector thread, spread over the nodes.

paho runs one network thread per client (``loop_start``).  A fleet instead drives every client from one thread
and one selector (:class:`~smartclient.mqtt.selector_loop.SelectorLoop`): no thread per client, no socket pair per
client, one file descriptor each.

Every connection is a placement of the core's loop (``Placement``), driven by the loop thread's events, over
candidates the core decides (:mod:`smartclient.core.broker_nodes`); every dial goes through the placer's
resolution seam (the resolver and the allow-list, or the load balancer's listener).  Directly, client *i*
aims at node *i* mod *n*, the others in turn if that one is out of reach (``spread_candidates``).  Through a
load balancer, the management API says where each client landed, and those on nodes above their share
(``rebalance``) are placed again on the nodes below theirs, round after round, until every node holds its
share; a balancer that never routes them there is the core's to judge (``NodeUnreachable`` when a moved
client's placement gives up).  A dropped client is placed again (``reconnect_candidates``, :data:`RECONNECT`).

With token credentials every client hands over to each new token (:mod:`smartclient.mqtt.handover`: hold, drain,
DISCONNECT, connect again with the new token on its own node first, send what was held), the fleet's clients spread
evenly over the first half of the time their token has left (:func:`~smartclient.core.relogin.handover_delay`,
client *i* of *n* at *i/n* of it), so thousands never reconnect at once.  A publish made while a client hands over or
reconnects is held and sent once it is connected again.

Thread safety: ``publish``/``subscribe`` may be called from any thread; socket registration changes made
off the loop thread are handed to it.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from smartclient._errors import (
    AddressNotAllowed,
    AuthenticationFailed,
    CertificateRejected,
    ConfigurationError,
    ConnectionFailed,
    NodeUnreachable,
    SmartClientError,
)
from smartclient.core.address import Address
from smartclient.core.broker_nodes import evenly_spread, pick_node, rebalance, reconnect_candidates, spread_candidates
from smartclient.core.landing import Done, GiveUp, Keep, Placement, PlacementStep
from smartclient.core.relogin import handover_candidates, handover_delay, slot_of
from smartclient.core.retry import Backoff, RetryPolicy
from smartclient.core.topology import Candidates, Role
from smartclient.core.validation import function, instance, number, text, texts, whole
from smartclient.credentials import Refreshes
from smartclient.mqtt._paho import MQTTMessage, MQTTMessageInfo, is_refusal
from smartclient.mqtt.handover import LoginSent
from smartclient.mqtt.placed import SHORT_LIVED, PlacedMqttClient
from smartclient.mqtt.placement import MqttPlacer
from smartclient.mqtt.selector_loop import SelectorLoop
from smartclient.mqtt.topics import validate_filter, validate_topic

__all__ = ["FleetReport", "MqttFleet", "process_rss"]

log = logging.getLogger(__name__)

RECONNECT = Backoff(initial=0.1, factor=2.0, max=5.0, jitter=0.2)  # a dropped client's tries
LOOP_POLL = Backoff.steady(0.05)  # the caller's look at what the loop thread did: connects, CONNACKs, closes
LISTING_POLL = Backoff.steady(0.5)  # the management API lists a new client within its statistics round
DRAIN_POLL = 0.02  # a client handing over looks at its messages in flight this often

MessageCallback = Callable[[int, MQTTMessage], None]


def process_rss() -> int:
    """This process's resident set size in bytes (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class FleetReport:
    """What :meth:`MqttFleet.start` did."""

    size: int
    connected: int
    per_node: dict[str, int]
    connect_seconds: float
    rss_per_connection: float  # bytes of this process's RSS per connection, measured around the start
    rebalanced: int = 0  # connections moved to even out the nodes (through a load balancer)
    failed: int = 0

    @property
    def spread(self) -> float:
        """max/min connections per node (1.0 is perfectly even; inf if a node has none)."""
        counts = [c for c in self.per_node.values()]
        if not counts:
            return math.inf
        return max(counts) / min(counts) if min(counts) else math.inf


@dataclass
class _Member:
    index: int
    client: PlacedMqttClient
    node: str | None = None
    up: bool = False
    closing: bool = False
    failures: int = 0
    listed_at: int = -1  # the management API's connected_at when last identified
    started: bool = False  # its first connect was begun (later ones are reconnects)
    was_up: bool = False  # connected once: a CONNACK without a session then means subscribing again
    plan: Placement[_Member] | None = None  # the placement under way (first connect, move or reconnect)
    target: Address | None = None  # what the last dial aimed at, and what it dialled
    dialled: Address | None = None
    failure: SmartClientError | None = None  # why its placement gave up
    # handing over to a new token: what it had (the fallback of a refusal); a token, so never in repr
    handing_over: LoginSent | None = field(default=None, repr=False)
    falling_back: bool = False  # the broker refused the new token: connecting again with the old one, soon
    settling: bool = False  # handing over: reading nothing while the broker applies its last PUBACKs
    kept_at: float = 0.0  # when its current connection was made (monotonic)
    short_lived: int = 0  # connections in a row the broker ended within SHORT_LIVED of being made


class MqttFleet:
    """``size`` MQTT connections from this process, on one selector thread, spread evenly over the nodes.

    :param placer: how to reach the cluster (resolver, allow-list, load balancer, TLS, options).
    :param client_id_prefix: client ids are ``<prefix>-<index>``.
    :param nodes: spread over these nodes only (full or short names; default: every node with a listener).
    :param window: most connections waiting for their CONNACK at once.
    :param on_message: ``f(index, message)``, on the loop thread, for messages to subscribed clients.
    :param tolerance: through a load balancer, rebalance until max/min per node is at most this.
    :param rebalance_rounds: through a load balancer, rounds of moving clients at most.

    Each client's placement is capped by the placer's ``RetryPolicy`` (its attempts and time): one that
    gives up is counted as failed (a reconnect's after :meth:`start`: the client stays disconnected).

    Use it as ``with MqttFleet(placer, 1000) as fleet:``; :meth:`start` connects (``__enter__`` calls it).
    """

    def __init__(
        self,
        placer: MqttPlacer,
        size: int,
        *,
        client_id_prefix: str = "smartclient-fleet",
        nodes: list[str] | None = None,
        window: int = 256,
        on_message: MessageCallback | None = None,
        tolerance: float = 1.05,
        rebalance_rounds: int = 10,
    ) -> None:
        instance("placer", placer, MqttPlacer, optional=False, what="an MqttPlacer (Environment.mqtt_placer())")
        whole("size", size, low=1, note="connections")
        text("client_id_prefix", client_id_prefix)
        texts("nodes", nodes, optional=True, note="node names")
        whole("window", window, low=1, note="connections opening at once")
        function("on_message", on_message, takes="client, userdata, message")
        number("tolerance", tolerance, low=1, note="the most connections on a node over the fewest")
        whole("rebalance_rounds", rebalance_rounds, low=0)
        if placer.lb is not None and placer.management is None:
            raise ConfigurationError("a fleet behind a load balancer needs the management API to see where it landed")
        self.placer = placer
        self.size = size
        self.prefix = client_id_prefix
        self.window = window
        self.on_message = on_message
        self.tolerance = tolerance
        self.rebalance_rounds = rebalance_rounds
        self._wanted_nodes = nodes
        self._targets: dict[Address, str | None] = {}  # the nodes spread over (listener -> name), in order
        self._reconnect_policy = replace(placer.retry, backoff_initial=RECONNECT.initial,
                                         backoff_factor=RECONNECT.factor, backoff_max=RECONNECT.max,
                                         backoff_jitter=RECONNECT.jitter)
        self._checking = False  # through a load balancer, start() identifies landings (else accepted unchecked)
        self._deadline = 0.0
        self.members: list[_Member] = []
        self._loop = SelectorLoop("smartclient-mqtt-fleet", lambda: self.members, self._member)
        self._awaiting: set[int] = set()
        #: the token hand-overs, from start() on
        self._refreshes = Refreshes(f"MQTT fleet {self.prefix}",
                                    lambda token: self._loop.call(self._schedule_handovers))
        self.disconnects = 0
        self.reconnects = 0
        self.handovers = 0  #: connections handed over to a new token
        self.token_refusals = 0  #: new tokens the broker refused at a hand-over (the client kept the one it had)

    # -- public ------------------------------------------------------------------------------
    def __enter__(self) -> MqttFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[PlacedMqttClient]:
        return (m.client for m in self.members)

    def client(self, index: int) -> PlacedMqttClient:
        return self.members[index].client

    def per_node(self) -> Counter[str]:
        """Connected clients per node, as far as known (through an LB: as last identified)."""
        return Counter(m.node for m in self.members if m.up and m.node is not None)

    @property
    def connected(self) -> int:
        return sum(1 for m in self.members if m.up)

    def start(self, timeout: float = 300.0) -> FleetReport:
        """Connect every client (and, through a load balancer, even them out).

        :raises ConnectionFailed: not every client was connected within ``timeout`` seconds.
        """
        if self._loop.running or self._loop.stopped:
            raise ConfigurationError("this fleet was started already")
        self.placer.login.check(self.prefix)  # a provider that fails, an expired token: raised now, not retried
        rss0 = process_rss()
        t0 = time.monotonic()
        self._targets = self._spread_targets()
        self._loop.start()
        for i in range(self.size):
            self.members.append(_Member(i, self._new_client(i)))
        self._checking = self.placer.lb is not None
        deadline = self._deadline = t0 + timeout
        self._loop.call(self._pump)
        try:
            self._wait(lambda: self.connected + self._failed() >= self.size, deadline, "connect")
            if self._failed():
                raise ConnectionFailed(f"{self._failed()} of {self.size} fleet connections failed; see the log")
            rebalanced = self._rebalance(deadline) if self.placer.lb is not None else 0
            self._refreshes.start(self.placer.login.credentials)
        except BaseException:
            self.close()
            raise
        finally:
            self._checking = False
        seconds = time.monotonic() - t0
        return FleetReport(self.size, self.connected, dict(sorted(self.per_node().items())), seconds,
                           (process_rss() - rss0) / max(1, self.connected), rebalanced, self._failed())

    def publish(self, index: int, topic: str, payload: bytes | str, qos: int = 0) -> MQTTMessageInfo:
        """Publish from client ``index`` (any thread).  Wait on the returned info for QoS 1's PUBACK.  While the
        client hands over to a new token or reconnects, the message is held and sent once it is connected again
        (the info is then a :class:`~smartclient.mqtt._paho.HeldInfo`)."""
        validate_topic(topic)
        _check_qos(qos)
        return self.members[index].client.publish(topic, payload, qos)

    def subscribe(self, index: int, topic_filter: str, qos: int = 0) -> None:
        """Subscribe client ``index`` (any thread); made again after a reconnect without a session."""
        validate_filter(topic_filter)
        _check_qos(qos)
        member = self.members[index]
        member.client.remember_subscription(topic_filter, qos)
        member.client.subscribe(topic_filter, qos)

    def close(self, timeout: float = 10.0) -> None:
        """DISCONNECT every client, wait for the broker to close them (up to ``timeout``), stop the loop."""
        if not self._loop.running:
            return
        self._refreshes.stop()

        def disconnect_all() -> None:
            for m in self.members:
                m.closing = True
                if m.client.socket() is not None:
                    m.client.disconnect()

        self._loop.call(disconnect_all)
        deadline = time.monotonic() + timeout
        polls = LOOP_POLL.delays()
        while time.monotonic() < deadline and any(m.client.socket() is not None for m in self.members):
            time.sleep(next(polls))
        self._loop.stop()
        for m in self.members:
            m.client.drop_connection()

    # -- placement ---------------------------------------------------------------------------
    def _node_names(self) -> list[str]:
        """The nodes to spread over: those asked for, or every node with a listener."""
        nodes = self.placer.nodes()
        if self._wanted_nodes is None:
            return [n.name for n in nodes if self.placer.protocol in n.listeners]
        return [pick_node(nodes, wanted).name for wanted in self._wanted_nodes]

    def _spread_targets(self) -> dict[Address, str | None]:
        targets = self.placer.targets()
        if self._wanted_nodes is not None:
            names = set(self._node_names())
            targets = {a: name for a, name in targets.items() if name in names}
            if not targets:
                raise ConfigurationError(f"none of {self._wanted_nodes} has an MQTT listener")
        return targets

    def _new_client(self, index: int) -> PlacedMqttClient:
        client = self.placer.new_client(f"{self.prefix}-{index}")
        client.suppress_exceptions = True
        self._loop.attach(client)
        client.hold_while_down = True  # what it is asked to publish while it reconnects is held
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.user_data_set(index)
        return client

    def _pump(self) -> None:
        """Start placements while fewer than ``window`` wait for a CONNACK (loop thread)."""
        nodes = tuple(self._targets)
        for m in self.members:
            if len(self._awaiting) >= self.window:
                break
            if m.started or m.closing:
                continue
            m.started = True
            candidates = spread_candidates(m.index, nodes, through_lb=self.placer.lb is not None, what=self.prefix)
            m.plan = Placement(candidates, self._round_policy() if self._checking else self.placer.retry)
            self._follow(m, m.plan.start())

    def _follow(self, m: _Member, step: PlacementStep[_Member]) -> None:
        """Do what a member's placement says (loop thread): dial now or later, or it is over."""
        while isinstance(step, Keep):  # on a node the placement does not take: open until the next dial
            assert m.plan is not None
            step = m.plan.next()
        if isinstance(step, Done):
            m.plan = None
        elif isinstance(step, GiveUp):
            m.plan, m.failure = None, step.error
            m.failures += 1
            m.client.fail_held()
            log.warning("fleet client %d: gave up: %s", m.index, step.error)
        elif step.delay:
            self._loop.later(step.delay, functools.partial(self._dial, m, step.target))
        else:
            self._dial(m, step.target)

    def _dial(self, m: _Member, target: Address, login: LoginSent | None = None) -> None:
        """Dial ``target`` for ``m`` through the resolution seam (loop thread), logging in with the current
        credentials (or ``login``)."""
        if m.closing or self._loop.stopped or m.plan is None:
            return
        m.client.drop_connection()
        m.up, m.node, m.dialled = False, None, None
        if m.was_up and m.handing_over is None:  # a hand-over is no reconnect
            self.reconnects += 1
        try:
            route = self.placer.route(target)  # the resolver and the allow-list, or the load balancer
            m.target, m.dialled = target, route.dial
            self._awaiting.add(m.index)
            self.placer.begin_connect(m.client, target, route.dial, login)
        except (AuthenticationFailed, CertificateRejected, AddressNotAllowed) as exc:  # never retried
            self._awaiting.discard(m.index)
            m.plan, m.failure = None, exc
            m.failures += 1
            m.client.fail_held()
            log.warning("fleet client %d: %s", m.index, exc)
        except SmartClientError as exc:
            self._awaiting.discard(m.index)
            log.debug("fleet client %d: connecting to %s failed: %s", m.index, target, exc)
            self._follow(m, m.plan.failed(target, m.dialled, exc))

    def _round_policy(self) -> RetryPolicy:
        """The placer's policy for a placement checked once per rebalance round (a landing per round, each
        round a statistics round of the management API): capped by the rounds and :meth:`start`'s time."""
        retry = self.placer.retry
        return replace(retry, max_attempts=max(retry.max_attempts, self.rebalance_rounds + 1),
                       max_time=max(1.0, self._deadline - time.monotonic()))

    def _failed(self) -> int:
        return sum(1 for m in self.members if m.failures and not m.up)

    def _rebalance(self, deadline: float) -> int:
        """Through a load balancer: identify every client's node and even the fleet out, round by round
        (the decisions are the core's: :func:`rebalance` and each moved client's placement)."""
        names = [name for name in self._targets.values() if name is not None]
        moved = 0
        for _ in range(self.rebalance_rounds + 1):
            t = time.monotonic()
            self._identify(deadline)
            log.info("fleet rebalance: identified in %.1f s: %s", time.monotonic() - t, dict(self.per_node()))
            batch = self._loop.on_loop_wait(functools.partial(self._round, names), deadline)
            if batch is None:
                return moved
            if not batch:
                break
            moved += batch
            self._wait(lambda: self.connected + self._failed() >= self.size and not self._awaiting, deadline,
                       "rebalance")
        raise NodeUnreachable(
            f"after {self.rebalance_rounds} rounds through {self.placer.lb} the fleet is still uneven: "
            f"{dict(self.per_node())} (max/min above {self.tolerance})"
        )

    def _round(self, names: list[str]) -> int | None:
        """One rebalance round (loop thread): None if the fleet is even; else each identified landing goes
        to its placement, the surplus gets placements on the nodes below their share, and every dial they
        ask for is made; the number of clients dialled again.

        :raises NodeUnreachable: a placement gave up (the balancer never routes to a candidate).
        """
        up = [m for m in self.members if m.up]
        if evenly_spread(self.per_node(), names, self.size, self.tolerance):
            for m in up:
                m.plan = None  # wherever it landed suits the fleet
            return None
        steps: list[tuple[_Member, PlacementStep[_Member]]] = []
        for m in up:
            if m.plan is not None and m.node is not None and m.target is not None and m.dialled is not None:
                step = m.plan.landed(m.target, m.dialled, self.placer.node_address(m.node), m)
                if isinstance(step, Done):
                    m.plan = None
                else:
                    steps.append((m, m.plan.next()))
        placing = {m.index for m, _ in steps}
        moving, room = rebalance([(m.index, m.node) for m in up if m.index not in placing], names, self.size)
        if moving:
            by_name = {name: address for address, name in self._targets.items()}
            candidates = Candidates(f"{self.prefix} rebalance", Role.CONNECTION, (tuple(by_name[n] for n in room),))
            for index in moving:
                m = self.members[index]
                m.plan = Placement(candidates, self._round_policy())
                steps.append((m, m.plan.start()))
        for _, step in steps:
            if isinstance(step, GiveUp):
                raise step.error
        for m, step in steps:
            self._follow(m, step)
        return len(steps)

    def _identify(self, deadline: float) -> None:
        ids = {m.client.client_id: m for m in self.members if m.up}
        polls = LISTING_POLL.delays()
        while True:
            unknown = [c for c, m in ids.items() if m.node is None]
            seen = {c: ids[c].listed_at for c in unknown}
            for client_id, (node, listed_at) in self.placer.listings(unknown, seen).items():
                ids[client_id].node, ids[client_id].listed_at = node, listed_at
            if all(m.node is not None for m in ids.values()) or time.monotonic() > deadline:
                return
            time.sleep(next(polls))

    # -- token hand-overs (the loop thread) -------------------------------------------------------------
    def _schedule_handovers(self) -> None:
        """A new token: client *i* of *n* hands over at *i/n* of the first half of the time its token has left."""
        now = time.time()
        for m in self.members:
            if m.up and not m.closing:
                delay = handover_delay(now, m.client.login_expires_at, slot_of(m.index, len(self.members)))
                self._loop.later(delay, functools.partial(self._hand_over, m, None))

    def _hand_over(self, m: _Member, deadline: float | None) -> None:
        """Hold ``m``'s publishes, wait (polling) for the PUBACKs of those in flight, say DISCONNECT, place it again
        with the new token (its node first); its CONNACK sends what was held (:meth:`_on_connect`)."""
        if m.closing or self._loop.stopped or not m.up or m.plan is not None:
            m.settling = False
            return  # down or being placed: its next connect logs in with the new token anyway
        m.client.hold_publishes()
        deadline = deadline if deadline is not None else time.monotonic() + self.placer.handover_drain()
        if m.client.in_flight() and time.monotonic() < deadline:
            self._loop.later(DRAIN_POLL, functools.partial(self._hand_over, m, deadline))
            return
        settle = self.placer.handover_settle()
        if settle and not m.settling:  # a persistent session: its last PUBACKs applied before DISCONNECT
            m.settling = True
            m.client.flush()
            self._loop.mute(m.client)
            self._loop.later(settle, functools.partial(self._hand_over, m, deadline))
            return
        m.settling = False
        if m.client.in_flight():
            log.warning("fleet client %d: %d messages still unacknowledged after %.1f s: they are sent again after the "
                        "hand-over (at least once)", m.index, m.client.in_flight(), self.placer.handover_drain())
        m.handing_over = m.client.login_sent
        m.client.say_goodbye()
        m.up, m.node = False, None
        candidates = handover_candidates(tuple(self._targets), m.target, f"{self.prefix} #{m.index} token hand-over")
        m.plan = Placement(candidates, self._reconnect_policy)
        self._follow(m, m.plan.start())

    def _wait(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        polls = LOOP_POLL.delays()
        while not done():
            if time.monotonic() > deadline:
                raise ConnectionFailed(
                    f"fleet {what}: {self.connected} of {self.size} connected when the time ran out "
                    f"({len(self._awaiting)} waiting for a CONNACK, {self._failed()} failed)"
                )
            time.sleep(next(polls))

    # -- paho callbacks (loop thread, except register_write from a publishing thread) ------------
    def _member(self, userdata: Any) -> _Member:
        return self.members[int(userdata)]

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        m = self._member(userdata)
        self._awaiting.discard(m.index)
        code = m.client.take_connack(flags, reason, resubscribe=m.was_up)
        handing, m.handing_over = m.handing_over, None
        if code != 0 and handing is not None and is_refusal(code) and m.target is not None:
            try:  # the new token refused at a hand-over: back with the one it had, while it is valid
                login = m.client.fallback_after(AuthenticationFailed(f"reason code {code}"), handing)
            except AuthenticationFailed:
                pass
            else:
                m.handing_over = (None, None)  # still handing over; no second fallback
                # not from here: paho holds its callback lock while in on_connect, and a dial closes the refused
                # socket under that lock (a deadlock); nor before paho has closed the refused socket itself
                m.falling_back = True
                self.token_refusals += 1
                self._loop.call(partial(self._fall_back, m, login))
                return
        if code == 0:
            if handing is not None:
                m.client.handovers += 1
                self.handovers += 1
            m.client.release_publishes()
            m.up, m.was_up, m.failures, m.kept_at = True, True, 0, time.monotonic()
            if m.plan is not None and self.placer.lb is None:  # directly: the node reached is the target
                assert m.target is not None and m.dialled is not None
                m.node = self._targets.get(m.target)
                self._follow(m, m.plan.landed(m.target, m.dialled, m.target, m))
            elif m.plan is not None and not self._checking:
                m.plan = None  # through a load balancer after start(): not identified one by one
        else:
            m.plan = None
            m.failures += 1
            m.client.fail_held()
            log.warning("fleet client %d: refused (reason code %d)", m.index, code)
        if not self._loop.stopped:
            self._pump()

    def _fall_back(self, m: _Member, login: LoginSent) -> None:
        """Connect again with the token ``m`` had, after the broker refused the new one at a hand-over."""
        m.falling_back = False
        if m.closing or self._loop.stopped or m.target is None:
            return
        self._dial(m, m.target, login)

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        m = self._member(userdata)
        was_up, m.up = m.up, False
        self._awaiting.discard(m.index)
        if m.falling_back:  # the refused connection's close: the fallback connects again
            return
        if m.closing or self._loop.stopped or (m.failures and not was_up):
            return
        if was_up:  # a reconnect: placed again, moving on from the node it was on, after a jittered wait
            self.disconnects += 1
            # longer after connections the broker ended at once (a publish it refuses, sent again on each new one)
            m.short_lived = m.short_lived + 1 if time.monotonic() - m.kept_at < SHORT_LIVED else 0
            candidates = reconnect_candidates(tuple(self._targets), m.target, f"{self.prefix} #{m.index} reconnect")
            m.plan = Placement(candidates, self._reconnect_policy)
            self._loop.later(RECONNECT.delay(1 + m.short_lived), functools.partial(self._follow, m, m.plan.start()))
        elif m.plan is not None and m.target is not None:  # closed before its CONNACK
            self._follow(m, m.plan.failed(m.target, m.dialled, ConnectionFailed("closed before its CONNACK")))
        self._pump()

    def _on_message(self, client: Any, userdata: Any, message: MQTTMessage) -> None:
        if self.on_message is not None:
            self.on_message(int(userdata), message)


def _check_qos(qos: int) -> None:
    if qos not in (0, 1):
        raise ConfigurationError(f"a fleet publishes and subscribes with QoS 0 or 1, not {qos!r}")


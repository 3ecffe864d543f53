"""A placed MQTT client (:class:`PlacedMqttClient`), and its reconnect as the sync placement driver's shell
(:class:`Reconnecting`): each dial drops the connection the client holds (a client id has one), logs in, connects,
and learns the node reached; the core's loop (:func:`smartclient.core.landing.drive`) decides.  What they ask of
their placer (:class:`~smartclient.mqtt.placement.MqttPlacer`) is :class:`Placing`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from smartclient._errors import (
    AddressNotAllowed,
    AuthenticationFailed,
    CertificateRejected,
    ConnectionFailed,
    HandleClosed,
    NodeUntold,
    PlacementError,
    ResolutionError,
    SmartClientError,
    TokenProviderFailed,
)
from smartclient.core.address import Address
from smartclient.core.broker_nodes import CutOffNodes
from smartclient.core.landing import Attempt, Keep, Missed, Reached, Reject
from smartclient.core.recovery import RecoveryEvent
from smartclient.core.retry import Backoff, RetryPolicy
from smartclient.core.topology import Candidates
from smartclient.mqtt.handover import HandsOver, LoginSent, Reconnects
from smartclient.mqtt.options import MqttOptions
from smartclient.resolution import Route

__all__ = ["CONNACK_WHILE_CUT", "UNTOLD_AFTER", "UNTOLD_FOR", "Current", "PlacedMqttClient", "Placing", "Reconnecting"]

log = logging.getLogger("smartclient.mqtt.placement")  # (its warnings, as before this module was split off)


class Placing(Reconnects, Protocol):
    """What a placed client and its reconnect ask of their placer (:class:`~smartclient.mqtt.placement.MqttPlacer`)."""

    options: MqttOptions
    retry: RetryPolicy
    cut_off: CutOffNodes
    on_recovery: Callable[[RecoveryEvent], None] | None

    def reconnect(self, client: PlacedMqttClient, *, handover: bool = False,
                  login: LoginSent | None = None) -> None: ...

    def route(self, target: Address) -> Route: ...

    def _reached(self, client: PlacedMqttClient, target: Address,
                 nodes: dict[Address, str | None]) -> tuple[str | None, Address]: ...


#: seconds a reconnect's first two landings wait for their CONNACK while a node is found cut off (``connect_timeout``
#: otherwise): a node cut from its peers sends none (through the LB a third of the landings went there, 5 s each), a
#: healthy one within milliseconds
CONNACK_WHILE_CUT = 1.0

#: a connection the broker ends this soon (seconds) after it was made makes the next reconnect wait, on the back-off
#: of ``MqttOptions.reconnect_delay``: the broker closes a connection that publishes where it may not (a token without
#: topic scopes, say), and paho sends the message again on the next connection, so without a wait the client
#: reconnects in a tight loop, hundreds of times a second
SHORT_LIVED = 1.0
#: seconds a reconnect through a load balancer waits for the management API to answer which node it reached before
#: it keeps the connection anyway (any node will do): the listing answers within milliseconds, but waits while a node
#: is cut off, until its peers give it up (about a minute), as a partition's reconnects would too
UNTOLD_AFTER = 2.0
#: seconds after a listing went unanswered during which the placer's reconnects do not ask it again (each would wait
#: :data:`UNTOLD_AFTER` more while the partition lasts)
UNTOLD_FOR = 10.0


class PlacedMqttClient(HandsOver):
    """A paho ``Client`` that knows where it sits (:attr:`node`, :attr:`dialled`) and reconnects as a
    placement rather than to the same host.  Use it as any paho client: ``publish``, ``subscribe``,
    callbacks.  ``subscriptions`` given to :meth:`MqttPlacer.connect` are made again after every reconnect
    that did not resume a session.  A reconnect that gives up (the placer's ``RetryPolicy`` ran out, a load
    balancer never reached a candidate, refused credentials) leaves the client disconnected for good: paho
    calls ``on_connect_fail`` and its loop ends, and :attr:`failure` says why.

    With token credentials it hands over to each new token (:attr:`handovers`; :mod:`smartclient.mqtt.handover`):
    a publish made meanwhile, or while it reconnects, is held and sent once it is connected again (a
    :class:`~smartclient.mqtt._paho.HeldInfo` is answered).  ``on_connect`` is called for the new connection;
    ``on_disconnect`` is not."""

    node: str | None
    target: Address
    dialled: Address
    attempts: int
    failovers: int
    listed_at: int  # the management API's connected_at when the node was last identified (-1: never)
    failure: SmartClientError | None  # why the last reconnect gave up (then the client stays disconnected)
    #: the client's own node: where it was placed, or where its last reconnect took it; a token hand-over aims
    #: there first, and one that kept a connection elsewhere leaves it as it is (the next one aims there again)
    home: Address | None

    def _setup(self, placer: Placing, subscriptions: Sequence[tuple[str, int]]) -> None:
        self._placer = placer
        self._subscriptions = list(subscriptions)
        self._failover = False  # reconnects are placements (set once placed by MqttPlacer.connect)
        self._placing = False  # a reconnect is placing: CONNACKs are held until it keeps one
        self._held: tuple[Any, ...] | None = None
        self._user_on_connect: Any = None
        self._sc_lock = threading.Lock()
        self._asked = threading.Event()  # set by disconnect(): see disconnect_asked
        self.node = self.home = self.failure = None
        self.failovers, self.listed_at = 0, -1
        self._kept_at = time.monotonic()  # when the current connection was made
        self._short_lived = 0  # connections in a row the broker ended within SHORT_LIVED

    def disconnect(self, reasoncode: Any = None, properties: Any = None) -> Any:
        """paho's ``disconnect`` (what the client holds fails), and a reconnect under way stops
        (:attr:`disconnect_asked`)."""
        self._asked.set()
        return super().disconnect(reasoncode, properties)

    @property
    def disconnect_asked(self) -> bool:
        """The application called :meth:`disconnect` (and has not connected again): a reconnect under way stops."""
        return self._asked.is_set()

    def wait_unless_disconnected(self, seconds: float) -> bool:
        """Wait ``seconds``, or less if the application disconnects meanwhile; whether it did."""
        return self._asked.wait(seconds)

    # paho calls reconnect() for the first connect too; after placement every one is a placement
    def _before_reconnect(self) -> bool:
        self._asked.clear()  # (paho's loop does not reconnect a client disconnected: the application does)
        if not self._failover:
            return False
        lived = time.monotonic() - self._kept_at
        self._short_lived = self._short_lived + 1 if lived < SHORT_LIVED else 0
        if self._short_lived:
            first, most = self._placer.options.reconnect_delay
            wait = Backoff(first, 2.0, most, self._placer.retry.backoff_jitter).delay(self._short_lived)
            log.warning("MQTT client %s: the connection to %s ended %.2f s after it was made (%d in a row): does the "
                        "broker refuse a publish or a subscription of it (for a token: its topic scopes)? reconnecting "
                        "in %.1f s", self.client_id, self.node or self.target, lived, self._short_lived, wait)
            time.sleep(wait)
        self._place_again(handover=False)
        return True

    def _place_again(self, *, handover: bool, fallback: LoginSent | None = None) -> None:
        """Connect again as a placement (:meth:`MqttPlacer.reconnect`), telling ``on_connect`` only the CONNACK of
        the connection kept; a hand-over whose new token is refused goes on with ``fallback`` (see
        :meth:`~smartclient.mqtt.handover.HandsOver.fallback_after`).

        :raises SmartClientError: it gave up (the client stays disconnected: :attr:`failure`)."""
        began, before = time.monotonic(), self.node
        with self._sc_lock:
            self._placing, self._held = True, None
            try:
                try:
                    self._placer.reconnect(self, handover=handover)
                except AuthenticationFailed as exc:
                    if not handover:
                        raise
                    self._placer.reconnect(self, handover=True, login=self.fallback_after(exc, fallback))
                except PlacementError as exc:  # a hand-over that reached no node: a reconnect, with a policy of its own
                    if not handover:
                        raise
                    log.warning("MQTT client %s: the hand-over reached no node (%s); reconnecting", self.client_id, exc)
                    self._placer.reconnect(self)
            except SmartClientError as exc:
                self.failure = exc
                log.log(logging.INFO if isinstance(exc, HandleClosed) else logging.ERROR,
                        "MQTT client %s: reconnect gave up, the client stays disconnected: %s", self.client_id, exc)
                self.stop_reconnecting()
                self.fail_held(unsent=True)  # (what it held failed with the disconnect; what paho had in flight too)
                if handover:  # (paho's loop calls on_connect_fail for a reconnect of its own that failed)
                    self._handle_on_connect_fail()
                raise
            finally:
                self._placing = False
                if not handover and self._placer.on_recovery is not None:  # (a hand-over is no recovery)
                    self._placer.on_recovery(RecoveryEvent(self, "mqtt", before, self.node if self.failure is None
                                                           else None, "connection lost", time.monotonic() - began,
                                                           self.attempts, self.failure))
            held, self._held = self._held, None
        if held is not None:  # the CONNACK of the connection kept, told now (not those of the ones dropped)
            self._connack_received(*held)

    def found_cut_off(self) -> str | None:
        """What found this connection's node cut off since it was kept there (any wing: its placer's
        :class:`~smartclient.core.broker_nodes.CutOffNodes`), asked by the silence watch: it ends the connection as
        the PUBACK watch does, and the reconnect takes the other nodes first (through a load balancer it keeps the
        first landing, as after a dead connection: while a node is cut off, the listing that would name it waits or
        lags).  A connection whose node is not known (a reconnect kept it unnamed) ends at any finding since it was
        kept: it may be on that node, and a landing there then sends no CONNACK (:data:`CONNACK_WHILE_CUT`).  Not
        while a reconnect places it (its node is the one it left until then)."""
        if not self._failover or self._placing:
            return None
        cut = self._placer.cut_off  # a node not known (kept unnamed) may be the one: it ends too, and lands elsewhere
        why = cut.ends(self.node, self._kept_at) if self.node is not None else cut.any_after(self._kept_at)
        where = f"its node {self.node}" if self.node is not None else "a node (its own is not known)"
        return None if why is None else f"{where} was found cut off since it was kept there, by {why}"

    def _handing_over(self) -> Placing:
        return self._placer

    def take_connack(self, flags: Any, reason: Any, *, resubscribe: bool) -> int:
        """Record a CONNACK (paho's VERSION2 ``on_connect`` arguments) and, if ``resubscribe`` and no session
        was resumed, make the subscriptions again; return the reason code."""
        session_present, code = self.record_connack(flags, reason)
        if code == 0 and not session_present and resubscribe:
            for topic, qos in self._subscriptions:
                self.subscribe(topic, qos)
        return code

    def remember_subscription(self, topic_filter: str, qos: int) -> None:
        """Make this subscription again after every reconnect that does not resume a session."""
        self._subscriptions.append((topic_filter, qos))

    def _connack_received(self, c: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if self._placing:  # one landing of a reconnect: told only if the placement keeps it
            self.record_connack(flags, reason)
            self._held = (c, userdata, flags, reason, properties)
            return
        code = self.take_connack(flags, reason, resubscribe=self._failover)
        self._kept_at = time.monotonic()
        if self._user_on_connect is not None:
            self._user_on_connect(c, userdata, flags, reason, properties)
        if code == 0 and self._failover:
            self.release_publishes()

    def __repr__(self) -> str:
        return (f"PlacedMqttClient(client_id={self.client_id!r}, node={self.node!r}, "
                f"dialled={self.dialled}, failovers={self.failovers})")


class Current:
    """A reconnect's kept connection (:class:`~smartclient.core.landing.Kept`): the client itself, while its connection
    to a node the placement did not take stays open (an MQTT client id has one connection)."""

    def __init__(self, client: PlacedMqttClient) -> None:
        self.client = client
        self.node: Address | None = None

    def take(self, nodes: tuple[Address, ...]) -> PlacedMqttClient | None:
        if self.node in nodes and self.client.is_connected():
            return self.client
        return None


class Reconnecting:
    """An MQTT client's reconnect as the sync placement driver's shell: each dial drops the connection it holds (a
    client id has one), logs in with the current credentials (or ``login``), connects, and learns the node reached."""

    def __init__(self, placer: Placing, client: PlacedMqttClient, nodes: dict[Address, str | None],
                 candidates: Candidates, login: LoginSent | None, identify: bool = True) -> None:
        self.placer, self.client, self.nodes, self.candidates, self.login = placer, client, nodes, candidates, login
        #: learn the node each landing reached (else the first connection made is kept, its node told later)
        self.identify = identify
        self.current = Current(client)
        self.landings: dict[Address, tuple[Address, Address, str | None]] = {}  # node -> (target, dialled, name)
        self.unsigned: TokenProviderFailed | None = None  # the last attempt could not log in: the provider failed
        self.untold: tuple[Address, Address] | None = None  # (target, dialled) of a landing whose node was not told
        self.short = 2  # landings left that wait only CONNACK_WHILE_CUT while a node is found cut off (then the whole
        # connect_timeout: a majority busy with elections may answer a resumed session late, and a reconnect that
        # missed for RetryPolicy.max_time gives up for good)

    def dial(self, target: Address) -> Reached[PlacedMqttClient] | Missed:
        placer, client = self.placer, self.client
        self._stop_if_disconnected()
        self.current.node = None
        client.drop_connection()
        try:
            route = placer.route(target)
        except AddressNotAllowed:
            raise
        except ResolutionError as exc:  # a resolver that failed now may answer for this node later
            return Missed(None, exc)
        try:
            placer.login.sign_in(client, self.login)
        except TokenProviderFailed as exc:  # asked again on its own back-off, not sooner
            self.unsigned = exc
            return Missed(route.dial, exc)
        self.unsigned = None
        try:
            short = self.short > 0 and bool(placer.cut_off.avoided())
            self.short -= short
            client.reconnect_to(route.dial, route.tls_name, min(placer.options.connect_timeout, CONNACK_WHILE_CUT)
                                if short else placer.options.connect_timeout)
        except AuthenticationFailed as exc:
            raise placer.login.refused(client, exc) from exc
        except CertificateRejected:
            raise
        except ConnectionFailed as exc:
            return Missed(route.dial, exc)
        if not self.identify:  # any node that answers will do: its node is asked for later, not waited for
            self.untold = (target, route.dial)
            return Reached(client, route.dial, None)
        try:
            node, reported = placer._reached(client, target, self.nodes)
        except NodeUntold as exc:  # any node will do: connected now beats waiting for the API (a partition)
            log.warning("MQTT client %s: %s; keeping the connection", client.client_id, exc)
            self.untold = (target, route.dial)
            return Reached(client, route.dial, None)
        except ConnectionFailed as exc:
            client.drop_connection()
            return Missed(route.dial, exc)
        self.landings[reported] = (target, route.dial, node)
        self.current.node, self.untold = reported, None
        return Reached(client, route.dial, reported)

    def keep(self, step: Keep[PlacedMqttClient]) -> None:  # left open: the fallback, should tier 0 stay out of reach
        log.warning("MQTT client %s: reconnect expected %s, got %s, candidates %s", self.client.client_id,
                    self.candidates.tiers[0], step.node, self.candidates)
        self.current.node = step.node

    def reject(self, step: Reject[PlacedMqttClient]) -> None:  # (a reconnect is not routed by name: never asked)
        self.client.drop_connection()

    def sleep(self, seconds: float) -> None:
        self.client.wait_unless_disconnected(seconds)
        self._stop_if_disconnected()

    def _stop_if_disconnected(self) -> None:
        """:raises HandleClosed: the application disconnected the client: its reconnect stops."""
        if self.client.disconnect_asked:
            raise HandleClosed(f"MQTT client {self.client.client_id} was disconnected by the application during its "
                               f"reconnect")

    def attempted(self, attempt: Attempt) -> None:
        pass

"""The AMQP 1.0 wing's clients: a placed connection, a publisher on a queue's leader and a consumer on the node
its preference chose, each recovering a lost connection through its :class:`~smartclient.amqp10.placement.Amqp10Placer`.

Proton's connections are driven by one thread at a time: a publisher's by the thread that publishes (under the
connection's lock), a consumer's by its own thread; a new token is handed to each on that thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from smartclient import _otel
from smartclient._errors import (
    AuthenticationFailed,
    ConnectionFailed,
    SmartClientError,
)
from smartclient.amqp10._rabbitmq_amqp import (
    Amqp10Connection,
    QueueTopology,
    close_quietly,
    new_consumer,
    publish,
    refresh_token,
    timed_out,
)
from smartclient.core.address import Address
from smartclient.core.broker_nodes import CutOffNodes, LeftNodes, Unreachable
from smartclient.core.recovery import RecoveryPolicy
from smartclient.core.retry import Backoff, RetryPolicy

__all__ = ["Amqp10Consumer", "Amqp10Publisher", "PlacedAmqp10Connection", "Placing"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: seconds a new token's ``PUT /auth/tokens`` may take (the broker answers in milliseconds; the refresher's thread,
#: which every wing shares, is not held up longer by a connection that went silent)
TOKEN_WAIT = 3.0


class Placing(Protocol):
    """What the clients ask of their placer (:class:`~smartclient.amqp10.placement.Amqp10Placer`)."""

    tracer: Any
    recovery: RecoveryPolicy
    retry: RetryPolicy
    token_updates: int
    left: LeftNodes  # per queue, the node a publisher lost its connection on lately
    cut_off: CutOffNodes  # the nodes found cut off lately, by any wing

    def queue_topology(self, queue: str) -> QueueTopology: ...

    def connect(self, node: str | None = None, purpose: str = "connection",
                retry: RetryPolicy | None = None) -> PlacedAmqp10Connection: ...

    def consumer_on(self, queue: str, prefer: str, retry: RetryPolicy, unreachable: Unreachable | None = None
                    ) -> PlacedAmqp10Connection: ...

    def publisher_on(self, queue: str, retry: RetryPolicy, unreachable: Unreachable | None = None
                     ) -> tuple[PlacedAmqp10Connection, Any]: ...

    def recover(self, what: str, lost: BaseException, reopen: Callable[[RetryPolicy], T], *, prior: int = 0,
                stopping: Callable[[], bool] = ..., handle: Any = ..., before: Any = ...,
                after: Callable[[T], Any] = ...) -> T: ...

    def token_refused(self, placed: PlacedAmqp10Connection, token: str, error: SmartClientError) -> None: ...

def _span_attributes(queue: str, node: str, operation: str) -> dict[str, str]:
    return _otel.messaging_attributes(queue, node, operation, **{"network.protocol.name": "amqp",
                                                                   "network.protocol.version": "1.0"})


@dataclass(eq=False)
class PlacedAmqp10Connection:
    """An AMQP 1.0 connection (the official client's ``Connection``) and the node it sits on.

    Proton's connections are driven by one thread at a time: a publisher's and the look-up connection by whoever
    holds :attr:`lock` (:meth:`driving`), a consumer's by its own thread (woken by :attr:`wake`).  A new token
    (token credentials) is handed over on that thread: :meth:`offer_token` leaves it in :attr:`pending_token`, and
    :meth:`take_token` sends it, once its owner has made it :attr:`ready` (its link attached).  A connection from
    :meth:`~smartclient.amqp10.placement.Amqp10Placer.connect` is yours to drive: hold :attr:`lock` while you do
    (or call :meth:`take_token` from your thread), and mark it :attr:`ready` to have new tokens sent when idle."""

    connection: Amqp10Connection
    node: str
    dialled: Address
    name: str
    attempts: int = 1
    closed: bool = field(default=False, repr=False)
    placer: Placing | None = field(default=None, repr=False)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    pending_token: str | None = field(default=None, repr=False)
    wake: Callable[[], None] | None = field(default=None, repr=False)  # a consumer's: its loop takes the token
    ready: bool = field(default=False, repr=False)  # its owner's link is attached: a token may be sent when idle
    close_pending: bool = field(default=False, repr=False)  # closed while another thread drove it: closed after
    token_updates: int = 0  #: new tokens the broker took on this connection
    token_failure: SmartClientError | None = field(default=None, repr=False)  #: why the last one was not taken

    def offer_token(self, token: str) -> None:
        """Hand ``token`` over now if no thread drives the connection, else at that thread's next step (from the
        token refresher's thread).  A connection lost meanwhile is closed: its owner recovers it."""
        self.pending_token = token
        if not self.ready:
            return
        if self.wake is not None:
            self.wake()
        elif self.lock.acquire(blocking=False):
            try:
                self.take_token()
            except ConnectionFailed as exc:  # its owner finds it closed at its next step, and recovers
                log.warning("AMQP 1.0 connection %s on %s did not answer its new token, closing it: %s", self.name,
                            self.node, exc)
                self.close()
            finally:
                self.lock.release()
            self._after()

    def take_token(self) -> None:
        """Send the pending token, if any, within :data:`TOKEN_WAIT` seconds (on the thread that drives the
        connection).  A refusal (or any answer but yes) is logged and kept in :attr:`token_failure`: the
        connection keeps its old token until the broker closes it at its expiry, and a recovery then logs in with
        the current one.

        :raises ConnectionFailed: the connection was lost, or did not answer in time (its reply could come
            later and be taken for another's: the connection is not to be used again)."""
        token, self.pending_token = self.pending_token, None
        if token is None or self.closed:
            return
        try:
            refresh_token(self.connection, token, self.name, TOKEN_WAIT)
        except SmartClientError as exc:
            if isinstance(exc, ConnectionFailed) and not isinstance(exc, AuthenticationFailed):
                raise  # lost (a refusal, TokenRefused, is an AuthenticationFailed: kept below)
            self.token_failure = exc
            if self.placer is not None:
                self.placer.token_refused(self, token, exc)
            return
        self.token_updates += 1
        if self.placer is not None:
            self.placer.token_updates += 1

    @contextlib.contextmanager
    def driving(self) -> Iterator[None]:
        """Hold the connection for this thread: a token left for it is sent first, one offered meanwhile after,
        and a close asked meanwhile is done last."""
        try:
            with self.lock:
                self.take_token()
                yield
                self.take_token()
        finally:
            self._after()

    def _after(self) -> None:
        if self.close_pending:
            self.close()

    def close(self, wait: bool = True) -> None:
        """Close the connection (and its socket); ``wait=False``: if another thread drives it now, that thread
        closes it when done."""
        if not self.lock.acquire(blocking=wait):
            self.close_pending = True
            return
        try:
            if not self.closed:
                self.closed = True
                close_quietly(self.connection)
        finally:
            self.lock.release()

    def __enter__(self) -> PlacedAmqp10Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: how much later (in ``stall_check`` periods) a publisher that could not follow its leader n times looks again
FOLLOW_AGAIN = Backoff(initial=1.0, factor=2.0, max=30.0)
#: seconds the queue's publishers do not go back to the node one lost its connection on (a recovery, a new publisher,
#: a leader check): a node cut off from its peers still names itself the leader to a look-up that reaches it, and each
#: write there would wait again (:class:`~smartclient.core.broker_nodes.LeftNodes`)
LEFT_FOR = 30.0
#: seconds a consumer's link may take to attach while a node is found cut off (the connection's timeout otherwise): a
#: queue whose leader was on that node takes a consumer only once its new leader is elected, and an attach asked
#: meanwhile waited 5 s after it in the partition run, where a new one would have been taken at once
ATTACH_WHILE_CUT = 1.5


@dataclass(eq=False)
class Amqp10Publisher:
    """A publisher to a queue, on the node of its leader.  A lost connection is recovered under the placer's
    :class:`RecoveryPolicy` (a placed reconnect on the leader, each attempt bounded by its ``attempt_time``) and
    the message sent again: at least once.  Every ``stall_check`` seconds of publishing it checks that its node
    still leads the queue, and follows a leader that moved."""

    queue: str
    placed: PlacedAmqp10Connection
    publisher: Any = field(repr=False)
    placer: Placing = field(repr=False)
    recoveries: int = 0  #: placed reconnects after a lost connection
    moves: int = 0  #: leaders followed while the connection was fine
    _checked: float = field(default_factory=time.monotonic, repr=False)
    _missed: int = field(default=0, repr=False)  # leaders it could not follow in a row: it waits longer each time

    @property
    def node(self) -> str:
        return self.placed.node

    def publish(self, body: bytes | Any) -> None:
        """Send one message (``bytes``, or the client's ``Message``) and wait until the broker accepts it (the
        official client's only way: one message in flight).

        :raises PublishFailed: the broker rejected or released it.
        :raises RecoveryFailed: the connection was lost and recovery gave up (its last error is the cause).
        """
        check = self.placer.recovery.stall_check
        if check and time.monotonic() - self._checked >= check:
            self._follow()
        tracer = self.placer.tracer
        if tracer is None:
            self._send(body, None)
            return
        span = tracer.start(f"send {self.queue}", _otel.SpanKind.PRODUCER, _span_attributes(self.queue, self.node,
                                                                                             "send"))
        with _otel.use(span):  # the consumer's span is its child: the context goes in the application properties
            self._send(body, _otel.inject(span))

    def _send(self, body: bytes | Any, properties: dict[str, str] | None) -> None:
        try:
            self._publish(body, properties)
        except ConnectionFailed as exc:
            self._recover(exc)
            self._publish(body, properties)

    def _publish(self, body: bytes | Any, properties: dict[str, str] | None) -> None:
        placed = self.placed
        with placed.driving():  # not driven by the token refresher meanwhile; the tokens it left are sent here
            publish(self.publisher, body, f"queue {self.queue!r} on {self.node}", properties)

    def _follow(self) -> None:
        self._checked = time.monotonic()
        try:
            leader = self.placer.queue_topology(self.queue).leader
        except SmartClientError as exc:
            log.debug("checking the leader of %r: %s", self.queue, exc)
            return
        if leader is not None and leader != self.node and leader != self.placer.left.recent(self.queue):
            log.info("the leader of %r moved from %s to %s: following it", self.queue, self.node, leader)
            try:
                moved = self.placer.publisher_on(self.queue, replace(self.placer.retry,
                                                                      max_time=self.placer.recovery.attempt_time))
            except SmartClientError as exc:  # the connection it has still works: it stays, and checks again later,
                # later each time (a leader the LB no longer routes to: each try dials for a whole attempt)
                self._checked = time.monotonic() + FOLLOW_AGAIN.scaled(self.placer.recovery.stall_check).delay(
                    self._missed)  # (from when this try ended: it may have dialled for a whole attempt)
                self._missed += 1
                log.warning("following the leader of %r to %s failed, staying on %s (tried %d time(s)): %s",
                            self.queue, leader, self.node, self._missed, exc)
                return
            self._swap(*moved)
            self.moves += 1
        self._missed = 0

    def _recover(self, lost: ConnectionFailed) -> None:
        log.warning("AMQP 1.0 publisher of %r lost its connection on %s: %s", self.queue, self.node, lost)
        # another member first, which forwards the writes to the leader: the node lost may be cut off from its peers
        # (it names itself the leader still) or from the LB; the leader's own node once no other member is reached
        self.placer.left.add(self.queue, self.node)
        if timed_out(lost):  # its node answered nothing in time: every wing leaves it
            self.placer.cut_off.found(self.node, f"a publish to {self.queue!r} of AMQP 1.0 that timed out")
        unreachable = Unreachable()
        self._swap(*self.placer.recover(f"publisher of {self.queue!r}", lost,
                                        lambda retry: self.placer.publisher_on(self.queue, retry, unreachable),
                                        handle=self, before=self.node, after=lambda reopened: reopened[0].node))
        self.recoveries += 1
        log.info("AMQP 1.0 publisher of %r recovered on %s", self.queue, self.node)

    def _swap(self, placed: PlacedAmqp10Connection, publisher: Any) -> None:
        old, self.placed, self.publisher = self.placed, placed, publisher
        old.close()

    def close(self) -> None:
        self.placed.close()

    def __enter__(self) -> Amqp10Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(eq=False)
class Amqp10Consumer:
    """A consumer of a queue on the node its preference chose; its messages are handed over on a thread of its
    own until :meth:`close`.  A lost connection is recovered under the placer's :class:`RecoveryPolicy`, on a
    node chosen again: a queue's messages not accepted yet come again (at least once); a stream is read again
    from the offset after the last one handed over.  When recovery gives up, :attr:`failure` says why."""

    queue: str
    placer: Placing = field(repr=False)
    on_message: Callable[[Any, Callable[[], None]], None] = field(repr=False)
    prefer: str = "member"
    credit: int = 10
    offset: int | str | None = None
    filter_values: Sequence[str] = ()
    sql: str | None = None
    placed: PlacedAmqp10Connection | None = None
    failure: BaseException | None = None
    recoveries: int = 0  #: placed reconnects after a lost connection
    callback_errors: int = 0  #: messages whose callback raised (each given back to the queue)
    last_offset: int | None = None  #: a stream's last offset handed over (its callback returned)
    _handed: int = field(default=0, repr=False)  # messages handed over since the last recovery
    _fruitless: int = field(default=0, repr=False)  # recoveries in a row with nothing handed over between them
    _unreachable: Unreachable = field(default_factory=Unreachable, repr=False)  # members a recovery could not reach
    _loop: Any = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _stopping: bool = field(default=False, repr=False)

    @property
    def node(self) -> str | None:
        return self.placed.node if self.placed is not None else None

    def _hand(self, message: Any, accept: Callable[[], None], requeue: Callable[[], None]) -> None:
        """One message to the application's callback.  A callback that raises is logged and counted
        (:attr:`callback_errors`), and its message given back to the queue (unless the callback settled it): it
        comes again, never taken for a lost connection.  Once :meth:`close` is called, nothing more is handed over
        (a message that comes meanwhile is not settled: it comes again to the next consumer)."""
        if self._stopping:
            return
        self._handed += 1
        tracer = self.placer.tracer
        try:
            if tracer is None:
                self.on_message(message, accept)
            else:
                properties = getattr(message, "application_properties", None)
                span = tracer.start(f"process {self.queue}", _otel.SpanKind.CONSUMER,
                                    _span_attributes(self.queue, str(self.node), "process"),
                                    parent=_otel.extract(properties) if isinstance(properties, dict) else None)
                with _otel.use(span):
                    self.on_message(message, accept)
        except Exception as exc:
            self.callback_errors += 1
            log.warning("the callback of the AMQP 1.0 consumer of %r raised: %s", self.queue, exc)
            with contextlib.suppress(Exception):  # it may have settled the message itself
                requeue()
            return
        annotations = getattr(message, "annotations", None)  # a stream's position: after its callback returned
        if isinstance(annotations, dict) and (offset := annotations.get("x-stream-offset")) is not None:
            self.last_offset = int(offset)

    def _open(self, retry: RetryPolicy) -> tuple[PlacedAmqp10Connection, Any]:
        placed_at = time.monotonic()
        placed = self.placer.consumer_on(self.queue, self.prefer, retry, self._unreachable)
        start = self.offset if self.last_offset is None else self.last_offset + 1
        try:
            loop = new_consumer(placed.connection, self.queue, self._hand, credit=self.credit, offset=start,
                                filter_values=self.filter_values, sql=self.sql,
                                within=ATTACH_WHILE_CUT if self.placer.cut_off.avoided() else None)
        except BaseException:
            placed.close()
            raise
        cut_off = self.placer.cut_off

        def between() -> None:  # on the consumer's own thread, after each pass (20 a second at least)
            placed.take_token()  # a new token
            if (why := cut_off.ends(placed.node, placed_at)) is not None:  # a node that hands over nothing now
                raise ConnectionFailed(f"its node {placed.node} was found cut off from its peers, by {why}")
        loop.between = between
        placed.wake = loop.wake
        placed.ready = True
        return placed, loop

    def start(self) -> Amqp10Consumer:
        self.placed, self._loop = self._open(self.placer.retry)
        self._thread = threading.Thread(target=self._run, name=f"amqp10-{self.placed.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            assert self.placed is not None
            try:
                self._loop.run()
                return
            except BaseException as exc:  # the client's own errors include BaseException subclasses
                if self._stopping:
                    return
                log.warning("AMQP 1.0 consumer of %r lost its connection on %s: %s", self.queue, self.node, exc)
                self.placed.close()
                self._loop.release()
                # a connection lost again with nothing handed over since the last recovery: the back-off goes on
                self._fruitless = 0 if self._handed else self._fruitless + 1
                self._handed = 0
                try:
                    self.placed, self._loop = self.placer.recover(
                        f"consumer of {self.queue!r}", exc, self._open, prior=self._fruitless,
                        stopping=lambda: self._stopping, handle=self, before=self.node,
                        after=lambda reopened: reopened[0].node)
                except BaseException as final:
                    if not self._stopping:
                        self.failure = final
                        log.warning("AMQP 1.0 consumer of %r stopped: %s", self.queue, final)
                    return
                if self._stopping:  # closed while it recovered: the new connection goes too
                    self.placed.close()
                    self._loop.release()
                    return
                self.recoveries += 1
                log.info("AMQP 1.0 consumer of %r recovered on %s", self.queue, self.node)
            finally:
                if self._stopping or self.failure is not None:
                    self.placed.close()  # on this thread: proton's connection is not to be driven from two
                    self._loop.release()

    def close(self, timeout: float = 10.0) -> None:
        """Stop handing messages over and close the connection (on the consumer's thread), waiting up to
        ``timeout`` seconds for that."""
        self._stopping = True
        if self._loop is not None:
            self._loop.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("AMQP 1.0 consumer of %r on %s did not stop within %g s", self.queue, self.node, timeout)

    def __enter__(self) -> Amqp10Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

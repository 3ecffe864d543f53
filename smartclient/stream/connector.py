"""The async stream shell around :class:`~smartclient.core.landing.Placement`.

Every stream connection smartclient opens goes through :meth:`StreamConnector.dial`:
resolve the advertised address (the one resolution seam), check the allow-list,
connect and authenticate, and read the node the connection reports.  On top
of it, :meth:`StreamConnector.acquire` runs the landing loop, and keeps
connections that reached an unwanted node in a :class:`ParkingLot` for the
next placement that needs that node; unused ones close after an idle timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import time
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from smartclient import _otel, credentials, keepalive
from smartclient._errors import REFUSALS, ConnectionFailed, ResolutionError, SmartClientError, TokenRefused
from smartclient.core.address import Address
from smartclient.core.deadline import remaining, step
from smartclient.core.landing import Attempt, Keep, Missed, Placement, Reached, Reject, drive_async
from smartclient.core.retry import HANG_MEMORY, HEDGES, RetryPolicy
from smartclient.core.settings import PoolLimits
from smartclient.core.shared import Shared
from smartclient.core.topology import Candidates
from smartclient.options import ClientSettings
from smartclient.resolution import Resolution
from smartclient.stream import _rstream
from smartclient.stream._rstream import map_stream_errors
from smartclient.stream.host import Connection

__all__ = ["ClientSettings", "Connection", "ParkingLot", "StreamConnector"]

#: numbers the connections of every Environment of this process, so that each name (``smartclient-7``) is
#: unique in the management UI and in logs, even with several Environments using the same prefix
_CONNECTION_IDS = itertools.count(1)

log = logging.getLogger(__name__)

#: seconds a connection has to take a refreshed token (a SASL round trip; a stuck one is left to its heartbeat)
SECRET_UPDATE_TIMEOUT = 10.0


class ParkingLot:
    """Connections to nodes nobody needed yet, by node; each leaves after ``idle_timeout``."""

    def __init__(self, limits: PoolLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._by_node: dict[Address, list[Connection]] = {}
        self.parked_twice = 0  # connections parked while already parked (counted for the soak's accounting)
        self.stale = 0  # entries found no longer parked (taken elsewhere) and dropped

    def put(self, conn: Connection, since: float | None = None) -> Connection | None:
        """Park ``conn`` (again: its idle time starts over, or goes on from ``since``); return a connection that
        no longer fits (to be closed), if any."""
        conn.parked_at = self._clock() if since is None else since
        slot = self._by_node.setdefault(conn.node, [])
        if conn in slot:  # parked twice (two carriers let go of it): once is enough, or a take leaves a copy behind
            log.debug("connection %s parked again", conn.name)
            self.parked_twice += 1
            slot.remove(conn)
        slot.append(conn)
        if len(slot) > self.limits.max_parked_per_node:
            return slot.pop(0)
        return None

    def take(self, nodes: tuple[Address, ...]) -> Connection | None:
        for node in nodes:
            slot = self._by_node.get(node, [])
            while slot:
                conn = slot.pop()
                if conn.alive():
                    conn.idle_since, conn.parked_at = conn.parked_at, None
                    return conn
        return None

    def remove(self, conn: Connection) -> None:
        slot = self._by_node.get(conn.node, [])
        if conn in slot:
            slot.remove(conn)

    def expired(self) -> list[Connection]:
        """The connections parked longer than ``idle_timeout`` (taken out), and any that no longer is parked
        (taken out too: a taken connection has nothing to do here)."""
        deadline = self._clock() - self.limits.idle_timeout
        out = []
        for slot in self._by_node.values():
            for conn in list(slot):
                if conn.parked_at is None:
                    self.stale += 1
                    slot.remove(conn)
                elif conn.parked_at <= deadline:
                    slot.remove(conn)
                    out.append(conn)
        for node in [n for n, slot in self._by_node.items() if not slot]:
            del self._by_node[node]
        return out

    def all(self) -> list[Connection]:
        return [c for slot in self._by_node.values() for c in slot]

    def __len__(self) -> int:
        return sum(len(s) for s in self._by_node.values())


class StreamConnector:
    """Dials stream connections through the resolver and places them by the node they report."""

    def __init__(
        self,
        settings: ClientSettings,
        resolution: Resolution,
        *,
        retry: RetryPolicy = RetryPolicy(),
        limits: PoolLimits = PoolLimits(),
        on_closed: Callable[[Connection, Any], Awaitable[None]] | None = None,
        on_mismatch: Callable[[Address, Address, Candidates], None] | None = None,
    ) -> None:
        self.settings = settings
        self.resolution = resolution  # the one resolution seam: what to dial, which name TLS verifies
        self.retry = retry
        self.limits = limits
        self.parking = ParkingLot(limits)
        self.on_closed = on_closed
        self.on_mismatch = on_mismatch
        self._ids = _CONNECTION_IDS  # one count per process: no two connections of it share a name
        self._reaper: asyncio.Task[None] | None = None
        self.opened = 0  # connections opened (LB sessions, when dialling an LB)
        self.mismatches: Counter[str] = Counter()  # connections that reached another node, by reason
        self.reused = 0  # placements that took a parked connection
        self.hedged = 0  # second dials made beside one still opening after hedge_after (each opens one more)
        self.on_attempt: Callable[[Attempt], None] | None = None  # told each attempt of a placement (traces)
        self.connections: set[Connection] = set()
        #: target -> the address its latest dial went to (the resolver's answer): a failed attempt names it
        self.dialled: dict[Address, Address] = {}
        #: dialled address -> when a dial to it last went unanswered for ``hedge_after``, or a connection through it
        #: was lost (RetryPolicy.hedge_wait): either way, its next dials may meet a node that is gone
        self._hung: dict[Address, float] = {}
        #: the token refreshes (token credentials), handed to the connections on the loop of the first one
        self._refreshes = credentials.Refreshes("the stream connections", self._on_refresh)
        self._loop: asyncio.AbstractEventLoop | None = None
        #: every client this connector opened and someone still holds (the locator too): a new token goes to each
        self._logged_in: weakref.WeakSet[Any] = weakref.WeakSet()
        self.secret_updates = 0  # connections that took a refreshed token
        self.secret_failures = 0  # connections that did not (refused, or lost on the way)
        #: the last login the broker refused: a recovery does not dial with it again (credentials.RefusedLogins)
        self.refused = credentials.RefusedLogins()
        #: login -> done once the broker has judged it on the connection it is judging it on (see _verdict)
        self._judging: dict[str, asyncio.Future[None]] = {}
        #: login never logged in with -> done once the dial that presents it first is answered, and when that
        #: dial began (see _first_try)
        self._trying: dict[str, tuple[asyncio.Future[None], float]] = {}
        #: the locator (its wing's): a connection that carries no producer or consumer, opened if it is not open;
        #: a new token goes to it first (see update_secrets)
        self.idle: Callable[[], Awaitable[Any]] | None = None

    async def resolve(self, advertised: Address) -> Address:
        """What a connection aimed at ``advertised`` dials (resolver, then allow-list)."""
        return await self.resolution.dial_address(advertised)

    async def dial(self, target: Address, name: str, client_class: type[Any] | None = None) -> Connection:
        """Open one authenticated connection aimed at ``target`` and return it with the node it reports.

        One still opening after ``retry.hedge_after`` seconds gets a second dial beside it, and another after each
        further quick wait (a fifth of it) while none has opened (up to ``HEDGES``); the first to open wins and the
        others are parked if they open too (closed through an SNI ingress).  (An LB holds a connection
        it sent to a node that has just died while it retries that node; the second dial goes to the next one.)
        """
        # where it goes (behind an LB: the LB's address, for every node), known before its first dial too: a
        # connection lost through the LB makes the next dials there hedge quickly, whichever node they aim at
        address = self.dialled.get(target) or (await self.resolution.route(target)).dial
        with _otel.detached():  # the connection's tasks outlive the caller's span
            first = asyncio.ensure_future(self._dial_once(target, name, client_class))
        began = time.monotonic()
        hedge = self.retry.hedge_wait(began - self._hung.get(address, -HANG_MEMORY))
        keep = self.resolution.by_name is None  # (through an SNI ingress a connection serves the name it sent)
        if not hedge:
            return await first
        try:
            done, _ = await asyncio.wait({first}, timeout=hedge)
        except BaseException:
            await _settle([first], self, keep)
            raise
        if done:
            return first.result()
        if hedge >= self.retry.hedge_after:  # (a quick hedge proves nothing: it does not renew the memory)
            address = self.dialled.get(target, address)  # (the route is known now: behind an LB, the LB's)
            self._hung[address] = time.monotonic()
            for old in [a for a, at in self._hung.items() if began - at >= HANG_MEMORY]:
                del self._hung[old]
        def another() -> asyncio.Future[Connection]:
            log.info("opening a connection for %s: no answer after %.2f s, dialling one more beside it", target,
                     hedge)
            self.hedged += 1
            with _otel.detached():
                return asyncio.ensure_future(self._dial_once(target, name, client_class, True))

        # the first hung for a hedge wait: the next ones go after the quick wait (RetryPolicy.hedge_wait), as the
        # next dials to that address do (a dial held by an LB for a dead node ends only after seconds)
        return await _first_opened([first, another()], self, keep, (self.retry.hedge_wait(0.0), another))

    async def _dial_once(self, target: Address, name: str, client_class: type[Any] | None,
                         hedge: bool = False) -> Connection:
        route = await self.resolution.route(target)
        dialled = self.dialled[target] = route.dial
        # weakly: the client holds this handler, and the Connection the client, so a strong reference made each
        # connection a cycle that held its socket and buffers past its end until a full collection; while the
        # connection is open, ``self.connections`` holds it
        holder: dict[str, weakref.ref[Connection]] = {}

        async def closed(info: Any) -> None:
            ref = holder.get("conn")
            conn = ref() if ref is not None else None
            if conn is not None:
                await self._closed(conn, info)

        connection_name = f"{name}-{next(self._ids)}"
        signed = await credentials.alogin(self.settings.credentials, connection_name)
        login = self.refused.key(signed, self.settings.client_certificate)
        await self._verdict(login)  # (a recovery: not with a login refused already, or being judged)
        trial = await self._first_try(login, hedge)  # (a login no connection has logged in with yet)
        judged: list[asyncio.Future[None]] = []

        def judging() -> None:  # the broker answered: it judges this login now (the others that wait see its verdict)
            if (pending := self._judging.get(login)) is None or pending.done():
                self._judging[login] = asyncio.get_running_loop().create_future()
                judged.append(self._judging[login])
            _answered(self._trying, login, trial)

        try:
            client = _rstream.new_client(
                client_class, host=dialled.host, port=dialled.port,
                tls=credentials.tls_context(self.settings.tls, self.settings.client_certificate),
                frame_max=self.settings.frame_max,
                heartbeat=keepalive.heartbeat(self.settings.heartbeat, self.settings.dead_after),
                name=connection_name, on_closed=closed, max_ids=self.limits.max_streams_per_connection,
                server_hostname=route.tls_name, mechanism=signed.mechanism, on_answer=judging,
                dead_after=self.settings.dead_after)
        except BaseException:  # (a certificate's files unreadable: nothing was presented)
            _answered(self._trying, login, trial)
            raise
        self.opened += 1
        try:
            self._watch_credentials()
            context = f"connecting to {dialled}" + (f" (advertised as {target})" if dialled != target else "")
            with map_stream_errors(context):
                await step(f"connect to {dialled}" + (" (TLS)" if self.settings.tls else ""), client.start())
                keepalive.watch(_rstream.socket_of(client), self.settings.dead_after)  # a silent peer ends it
                await step(f"authenticate and open on {dialled}", client.authenticate(
                    vhost=self.settings.vhost, username=signed.username, password=signed.password))
        except BaseException as exc:
            self.refused.note(login, exc)
            await _rstream.abort(client)
            again = credentials.after_refusal(self.settings.credentials, signed, exc)
            if again is not exc:
                raise again from exc
            raise
        finally:
            _answered(self._trying, login, trial)
            for verdict in judged:
                verdict.set_result(None)
                if self._judging.get(login) is verdict:
                    del self._judging[login]
        self.refused.accepted(login)
        node, connection_name = _rstream.identity(client)
        if node is None:
            await _rstream.abort(client)
            raise ConnectionFailed(f"{dialled} did not report advertised_host/advertised_port in its Open response")
        conn = Connection(client, node, dialled, connection_name, max_ids=self.limits.max_streams_per_connection)
        _rstream.attach(client, conn)
        self._logged_in.add(client)
        holder["conn"] = weakref.ref(conn)
        self.connections.add(conn)
        return conn

    async def _verdict(self, login: str) -> None:
        """Before a dial that smartclient makes on its own (a recovery: :func:`credentials.acting_alone`) with the
        login ``login``: wait for the broker's verdict on it where a live broker is judging it now on another
        connection (it takes 3 s to refuse one), so that a refused login costs one connection, however many
        recoveries there are; then raise its refusal, if it was refused (now or before).

        :raises AuthenticationFailed: (or CertificateRejected) the broker refused this login."""
        if not credentials.alone():
            return
        pending = self._judging.get(login)
        if pending is not None and not pending.done():
            await step("the broker's verdict on this login, on another connection", asyncio.shield(pending))
        self.refused.check(login)

    async def _first_try(self, login: str, hedge: bool = False) -> asyncio.Future[None] | None:
        """Before a dial with a login that no connection of this connector has logged in with (a new token, a
        rotated certificate): when no other dial presents it now, this one is the first, which the others wait
        for: returned, done once the broker answered it.  Else, in a recovery (:func:`credentials.acting_alone`),
        wait for that answer (then :meth:`_verdict` waits for its verdict) while the first has been waiting less
        than ``retry.hedge_after`` (one unanswered that long hangs on its node: no fault of the login; 0: no wait),
        within the attempt's deadline; a first that ended unanswered (its node refused the connection) leaves the
        next in line to be the first.  A ``hedge`` (a second dial beside one unanswered) does not wait: it
        replaces a dial.  So a new token that the broker refuses costs one connection, not one per recovery that
        began at the same moment (the expiry of the token before it ends every connection at once).

        :raises AuthenticationFailed: (or CertificateRejected) the broker refused this login meanwhile."""
        while not self.refused.tried(login):
            first, began = self._trying.get(login, (None, 0.0))
            if first is None or first.done():  # (a dial the application asks for may be the first: it never waits)
                mine = asyncio.get_running_loop().create_future()
                self._trying[login] = mine, time.monotonic()
                return mine
            left = self.retry.hedge_after - (time.monotonic() - began)
            wait = min(left, remaining(left))  # (within the attempt's deadline)
            if hedge or not credentials.alone() or wait <= 0:
                return None
            await asyncio.wait({first}, timeout=wait)
            await self._verdict(login)  # (refused: raised)
            if not first.done():
                return None  # still unanswered: it hangs (a dial goes beside it, as a hedge would)
        return None

    # -- tokens refreshed on the live connections ------------------------------------------------------
    def _watch_credentials(self) -> None:
        """With token credentials, hand each new token to every live connection of this connector (started
        with its first connection, on its event loop)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._refreshes.start(self.settings.credentials)

    def _on_refresh(self, token: str) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            asyncio.run_coroutine_threadsafe(self.update_secrets(token), loop).add_done_callback(_said)

    async def update_secrets(self, token: str) -> int:
        """Hand ``token`` to every open connection (the stream protocol's SASL exchange again, which the
        broker takes as a secret update); return how many took it.  A refusal is logged as
        :class:`TokenRefused` and counted, and the credentials told (:meth:`TokenCredentials.refused`): every
        connection goes on with the token before it while that one is valid, a recovery too (RabbitMQ 4.3 closes
        a connection 3 s after it refused it a token; 4.0 at its old token's expiry)."""
        username = self.settings.credentials.username
        refused: list[bool] = []  # told the credentials: whether they took the token before it back
        # the login a connection that takes the token has logged in with, as a dial keys it (see _first_try)
        login = self.refused.key(credentials.Login("PLAIN", username, token), self.settings.client_certificate)

        async def update(client: Any) -> bool:
            try:
                await asyncio.wait_for(_rstream.update_secret(client, username, token), SECRET_UPDATE_TIMEOUT)
            except (SmartClientError, asyncio.TimeoutError) as exc:
                self.secret_failures += 1
                if isinstance(exc, TokenRefused):  # every connection goes on with the token before it, if valid
                    refused.append(credentials.refused_token(self.settings.credentials, token))
                log.warning("connection %s kept its old token: %s", _rstream.identity(client)[1], exc)
                return False
            self.refused.taken(login)
            return True

        # first to the locator, which carries no producer or consumer: RabbitMQ 4.3 ends a connection that it
        # refused a token at its next publish confirm or delivery (at once, for a busy one), an idle one 3 s later.
        # A token it refuses costs the locator alone (the credentials take it back, and the others keep theirs).
        # A locator that is not open is opened, which logs in with the new token: the same test.  Then to the others
        # at once, not one after another (a slow connection holds up no other, nor sends its token late).
        first = 0
        try:
            locator = await self.idle() if self.idle is not None else None
        except SmartClientError as exc:
            log.warning("a new token was not tried on an idle connection first: %s", exc)
            locator = None
        if not credentials.current_is(self.settings.credentials, token):
            return 0  # the locator's login with it was refused (and it was taken back), or a newer one came since
        if locator is not None and locator.is_connection_alive():
            first = await update(locator)
            if any(refused):
                return 0  # refused and taken back: the others keep the token they have
        others = [c for c in list(self._logged_in) if c is not locator and c.is_connection_alive()]
        done = first + sum(await asyncio.gather(*(update(c) for c in others)))
        self.secret_updates += done
        return done

    async def acquire(self, candidates: Candidates, name: str, retry: RetryPolicy | None = None,
                      shared: Shared[Connection] | None = None) -> Connection:
        """A connection to a node of ``candidates``: one of ``shared`` (the connections its role shares) with
        room, a parked one, or new ones until one lands right; before every dial, what is shared or parked is
        offered again (see :class:`~smartclient.core.landing.Placement`).

        :raises PlacementError: the retry policy ran out (``NodeUnreachable`` when attempts kept landing
            on other nodes); the error lists every attempt.  Through an SNI ingress, a connection that reports
            another node than the one it named is misrouted: closed, counted in ``mismatches["misrouted"]``, a
            failed attempt (:class:`Misrouted`, the final error's cause if it was the last).
        :raises AuthenticationFailed: at once, without retrying (and so :class:`CertificateRejected`).
        :raises ResolutionError: the resolver failed or the allow-list refused the address.
        """
        policy = retry or self.retry
        bounded = max(0.001, min(policy.max_time, remaining(policy.max_time)))  # within the attempt's deadline
        plan: Placement[Connection] = Placement(candidates, replace(policy, max_time=bounded), self.parking,
                                                shared=Shared() if shared is None else shared)
        done = await drive_async(plan, _Placing(self, candidates, name))
        if done.shared:
            log.debug("placement of %s shares a connection to %s", candidates.stream, done.connection.node)
        elif done.reused:
            log.debug("placement of %s reuses a kept connection to %s", candidates.stream, done.connection.node)
            self.reused += 1
            self._attempted(Attempt(done.connection.node, done.connection.dialled, done.connection.node,
                                    "reused a kept connection"))
        done.connection.sessions = plan.attempts  # opened by this placement (0: shared or kept at once)
        return done.connection

    def _attempted(self, attempt: Attempt) -> None:
        if self.on_attempt is not None:
            self.on_attempt(attempt)

    async def park(self, conn: Connection, since: float | None = None) -> None:
        """Park ``conn`` for the next placement on its node; ``since``: its idle time goes on from then (a
        connection only borrowed from the parking lot, which a read every few seconds must not keep open)."""
        evicted = self.parking.put(conn, since)
        if evicted is not None:
            await self.close_connection(evicted)
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap(), name="smartclient-parking-reaper")

    async def _reap(self) -> None:
        while len(self.parking):
            await asyncio.sleep(min(0.5, max(0.05, self.limits.idle_timeout / 4)))
            for conn in self.parking.expired():
                await self.close_connection(conn)

    async def _closed(self, conn: Connection, info: Any) -> None:
        if not conn.closed:  # lost, not closed by this side: its node may be gone, and an LB sends connections to a
            # dead node until its checks find it (HAProxy: 2 s, each held 3 s), so the next dials through that address
            # hedge after the quick wait from the first (a fleet's first dial after a kill waited hedge_after, 0.5 s)
            self._hung[conn.dialled] = time.monotonic()
        conn.closed = True
        self.parking.remove(conn)
        self.connections.discard(conn)
        if self.on_closed is not None:
            await self.on_closed(conn, info)
        for forward in list(conn.forwards.values()):
            result = forward(info)
            if inspect.isawaitable(result):
                await result

    async def close_connection(self, conn: Connection, handshake: bool = True) -> None:
        """Close ``conn``; ``handshake=False``: at once, with no Close exchange (rstream's close also waits 0.2 s
        after it), for a short connection whose one request is over, on a path that waits for the close."""
        conn.closed = True
        conn.forwards.clear()
        self.parking.remove(conn)
        self.connections.discard(conn)
        if handshake:
            await _quietly_close(conn.client)
        else:
            await _rstream.abort(conn.client)

    async def close(self) -> None:
        self._refreshes.stop()
        if self._reaper is not None:
            self._reaper.cancel()
        for conn in list(self.connections):
            await self.close_connection(conn)


class _Placing:
    """The stream connector as the async placement driver's shell, for one placement: how it dials (through the
    resolution seam, the node read from the Open response), keeps (parks), rejects (closes) and sleeps."""

    def __init__(self, connector: StreamConnector, candidates: Candidates, name: str) -> None:
        self.connector, self.candidates, self.name = connector, candidates, name

    async def dial(self, target: Address) -> Reached[Connection] | Missed:
        connector = self.connector
        try:
            with connector.resolution.routing_errors(target):
                conn = await connector.dial(target, self.name)
        except REFUSALS:
            raise  # every node, every attempt would repeat it (and a resolver's error is raised as it is)
        except ConnectionFailed as exc:
            return Missed(connector.dialled.get(target), exc)
        return Reached(conn, conn.dialled, conn.node, connector.resolution.routed(target))

    async def keep(self, step: Keep[Connection]) -> None:
        candidates, connector = self.candidates, self.connector
        log.info("node mismatch: expected %s, got %s, candidates %s (dialled %s)",
                 candidates.tiers[0][0] if len(candidates.tiers[0]) == 1 else candidates.tiers[0], step.node,
                 candidates, step.connection.dialled)
        connector.mismatches["stale topology" if step.stale else "another node"] += 1
        if step.stale and connector.on_mismatch is not None:
            connector.on_mismatch(step.connection.dialled, step.node, candidates)
        await connector.park(step.connection)

    async def reject(self, step: Reject[Connection]) -> None:  # an SNI ingress sent it to another node: never used
        log.warning("connection misrouted: expected %s, got %s, candidates %s: %s", step.target, step.node,
                    self.candidates, step.error)
        self.connector.mismatches["misrouted"] += 1
        await self.connector.close_connection(step.connection)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def attempted(self, attempt: Attempt) -> None:
        self.connector._attempted(attempt)


async def _first_opened(dials: list[asyncio.Future[Connection]], connector: StreamConnector, keep: bool = False,
                        hedging: tuple[float, Callable[[], asyncio.Future[Connection]]] | None = None) -> Connection:
    """The first of ``dials`` to open; the others are cancelled, or closed if they opened too.  When all fail,
    the first failure is raised; a refusal that another node would repeat is raised at once.  ``hedging``
    (seconds, a dial): one more dial after each such wait in which none opened, up to HEDGES beside the first."""
    pending = set(dials)
    failures: list[BaseException] = []
    try:
        while pending:
            more = hedging if hedging is not None and len(dials) <= HEDGES else None
            done, pending = await asyncio.wait(pending, timeout=more[0] if more else None,
                                               return_when=asyncio.FIRST_COMPLETED)
            if not done and more:  # none opened, nor failed, in that wait: one more
                dials.append(more[1]())
                pending.add(dials[-1])
                continue
            for task in sorted(done, key=dials.index):
                error = task.exception()
                if error is None:
                    pending |= done - {task}
                    return task.result()
                if isinstance(error, (*REFUSALS, ResolutionError)):
                    raise error
                failures.append(error)
        raise failures[0]
    finally:
        await _settle(list(pending), connector, keep)


def _answered(trying: dict[str, tuple[asyncio.Future[None], float]], login: str,
              trial: asyncio.Future[None] | None) -> None:
    """The first dial with ``login`` (``trial``: see :meth:`StreamConnector._first_try`) was answered, or ended."""
    if trial is not None and not trial.done():
        trial.set_result(None)
        if trying.get(login, (None,))[0] is trial:
            del trying[login]


async def _settle(dials: list[asyncio.Future[Connection]], connector: StreamConnector, keep: bool = False) -> None:
    """Cancel dials no one waits for any more, and close those that opened all the same; with ``keep``, park
    them instead: behind an LB the one that lost the race may have reached the very node the placement wants
    (its next look at the parking lot takes it), and one nobody takes closes after ``idle_timeout``."""
    for task in dials:
        task.cancel()
    for outcome in await asyncio.gather(*dials, return_exceptions=True):
        if isinstance(outcome, Connection):
            if keep and outcome.alive():
                await connector.park(outcome)
            else:
                await connector.close_connection(outcome)


def _said(done: Any) -> None:
    """Log what went wrong in a secret update handed to the event loop (nothing else waits for it)."""
    if not done.cancelled() and done.exception() is not None:
        log.error("handing a new token to the stream connections failed", exc_info=done.exception())


async def _quietly_close(client: Any) -> None:
    try:
        await asyncio.wait_for(client.close(), 5)
    except Exception as exc:  # closing a broken connection must not mask the real error
        log.debug("closing %s:%s: %s", client.host, client.port, exc)

"""Where a connection goes: the one place that decides, for streams, AMQP and MQTT alike. No I/O.

:class:`Placement` is the whole loop of one placement as pure decisions, in one step vocabulary, dnspython's
``_Resolution`` again: :class:`Dial` a target (after a back-off), :class:`Done` (landed right, or a shared or kept
connection), :class:`Keep` a connection that reached another node, :class:`Reject` one routed by name that reached
another node, or :class:`GiveUp`.  Two drivers run it, one sync (:func:`drive`) and one async (:func:`drive_async`),
and differ only in awaiting; every protocol supplies only its :class:`Shell`: how it dials and learns the node a
connection reached, what it does with a connection kept or rejected, and how it sleeps::

    plan = Placement(candidates, policy, kept, shared=shared)   # shared: connections of this role in use
    done = drive(plan, shell)                                   # kept: connections to nodes nobody needed yet
    done.connection                                             # or PlacementError, listing every attempt

The stream connector (async, the node read from the Open response), the node placer of AMQP 0.9.1 and 1.0 and the
MQTT reconnect (sync, the node from the management API or the Open frame) are such shells.  The MQTT fleet advances
ten thousand placements on the events of one selector thread: it calls :meth:`Placement.landed`, ``failed`` and
``next`` itself, as a driver would.

Before every dial the placement is offered what it already has: a shared connection of its role on a tier-0
node with room for one more stream (:class:`~smartclient.core.shared.Shared`), then a kept one to a tier-0 node.
A placement that falls back takes a shared connection to the fallback node first, then the kept one.  Placements
running at the same time so share what the others opened meanwhile, instead of each dialling on.

Which landings are acceptable:

* a node in tier 0 of the candidates: at once;
* a node in a later tier: at once if every node of the earlier tiers has already failed to connect
  (direct mode: the replica is down, use the leader); otherwise it is kept, and used if tier 0 turns out
  to be out of reach (a load balancer that never routes there);
* any other node: a mismatch, kept for another placement that needs that node;
* a connection whose node cannot be told now (the management API does not answer): at once in a placement where any
  node will do (``untold_ok``: a reconnect), which never waits for that answer.

A connection *routed by the name it sent* (an SNI ingress: :class:`Routed`) must reach the node it named, its
target, and nothing else: one that reports another node is :class:`~smartclient._errors.Misrouted`
(:func:`misroute`).  :meth:`Placement.landed` then says :class:`Reject`: close it (never use it as the node it
claims, nor keep it for another placement) and go on as after a failed attempt, with the next candidate.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar, overload

from smartclient._errors import Misrouted, NodeUnreachable, PlacementError
from smartclient.core.address import Address
from smartclient.core.retry import RetryPolicy
from smartclient.core.topology import Candidates

__all__ = ["AsyncShell", "Attempt", "Dial", "Done", "GiveUp", "Keep", "Kept", "KeptList", "Missed", "Placement",
           "Reached", "Reject", "Routed", "Shell", "drive", "drive_async", "misroute",
           "summarise"]

C = TypeVar("C")
C_co = TypeVar("C_co", covariant=True)


class _Decision(str, Enum):
    ACCEPT = "accept"
    KEEP = "keep"  # a good connection to the wrong node: park it for another placement


@dataclass(frozen=True)
class Attempt:
    """One connection of a placement: what was aimed at, dialled, and reported, and what became of it."""

    target: Address
    dialled: Address | None
    reported: Address | None
    outcome: str

    def __str__(self) -> str:
        reached = (f"reached {self.reported}" if self.reported else "reached a node" if self.outcome.startswith(
            "accepted") else "reached nothing")
        return f"dialled {self.dialled or '?'} for {self.target}: {reached}, {self.outcome}"


def summarise(attempts: list[Attempt]) -> str:
    """The attempts, each distinct one once with its count, in the order first seen: 21 identical
    misses through a sticky LB read as one line, not 21."""
    counts: dict[str, int] = {}
    for item in attempts:
        line = str(item)
        counts[line] = counts.get(line, 0) + 1
    return "; ".join(f"{n}x {line}" if n > 1 else line for line, n in counts.items())


@dataclass(frozen=True)
class _Wait:
    seconds: float


@dataclass(frozen=True)
class _UseFallback:
    """Use a kept connection to one of ``nodes`` (the best first): the candidates' later tiers, reached before."""

    nodes: tuple[Address, ...]


@dataclass(frozen=True)
class GiveUp:
    """The placement is over and failed: raise ``error`` (it lists every attempt)."""

    error: PlacementError


class _Attempts:
    """The attempts of one placement and what they say (the state :class:`Placement` decides from)."""

    def __init__(
        self, candidates: Candidates, policy: RetryPolicy, clock: Callable[[], float] = time.monotonic,
        holds_one: bool = False,
    ) -> None:
        self.candidates = candidates
        self.policy = policy
        #: the client holds one connection at a time (an MQTT client id): its next dial ends the fallback it holds
        self.holds_one = holds_one
        self._clock = clock
        self._started = clock()
        self.attempts: list[Attempt] = []
        self._targets = candidates.all
        self._failed: set[Address] = set()  # candidates that could not be connected to
        self._seen: set[Address] = set()  # nodes reached
        self._since_new_node = 0  # consecutive wrong landings that reached no new node
        self._consecutive_failures = 0
        #: (tier, node) of every kept landing on a candidate, the best first: a lower tier, then the latest (a client
        #: that can hold one connection at a time, as an MQTT client id, holds only its latest)
        self._fallbacks: list[tuple[int, Address]] = []
        self.accepted: Address | None = None
        self._last_error: BaseException | None = None
        self._began: float | None = None  # when the attempt under way was started (its target given)
        self.longest = 0.0  #: the longest attempt so far, in seconds: what one more attempt may take

    # -- what to do next -------------------------------------------------------------------
    def next_target(self) -> Address:
        """The candidate to aim at: tier by tier, skipping those that failed since the last full round."""
        untried = [a for a in self._targets if a not in self._failed]
        if not untried:  # every candidate failed once: start another round
            self._failed.clear()
            untried = list(self._targets)
        self._began = self._clock()
        return untried[0]

    def _ended(self) -> None:
        """An attempt ended (landed or failed): how long it took counts as what the next one may take."""
        if self._began is not None:
            self.longest = max(self.longest, self._clock() - self._began)
            self._began = None

    def landed(self, target: Address, dialled: Address, reported: Address) -> _Decision:
        self._ended()
        self._consecutive_failures = 0
        new_node = reported not in self._seen
        self._seen.add(reported)
        tier = self.candidates.tier_of(reported)
        if tier == 0 or (tier is not None and self._earlier_tiers_failed(tier)):
            self.accepted = reported
            self.attempts.append(Attempt(target, dialled, reported, f"accepted (tier {tier})"))
            return _Decision.ACCEPT
        if tier is not None:
            self._fallbacks = sorted([(tier, reported), *(f for f in self._fallbacks if f[1] != reported)],
                                     key=lambda fallback: fallback[0])  # (stable: the latest first in its tier)
            outcome = f"kept: tier {tier}, used only if tier 0 {self._tier0()} stays out of reach"
        else:
            outcome = f"kept for another placement: not a candidate ({self.candidates})"
        self.attempts.append(Attempt(target, dialled, reported, outcome))
        self._since_new_node = 0 if new_node else self._since_new_node + 1
        return _Decision.KEEP

    def landed_untold(self, target: Address, dialled: Address) -> None:
        self._ended()
        self._consecutive_failures = 0
        self.attempts.append(Attempt(target, dialled, None, "accepted: its node could not be told, and any will do"))

    def failed(self, target: Address, dialled: Address | None, error: BaseException,
               reported: Address | None = None) -> None:
        """The attempt at ``target`` failed: no connection, or (``reported``) one that reached a node it must
        not be used as (misrouted)."""
        self._ended()
        self._last_error = error
        self._failed.add(target)
        self._consecutive_failures += 1
        if reported is not None:
            self._seen.add(reported)
        self.attempts.append(Attempt(target, dialled, reported, f"failed: {type(error).__name__}: {error}"))

    def next_step(self) -> _Wait | _UseFallback | GiveUp:
        """After a rejected or failed attempt: wait and retry, use a kept fallback, or give up.  With a fallback
        kept, one more attempt that could not end within the policy's time (it would take as long as the longest so
        far) is not made: the fallback is used now.  A client that holds one connection at a time gives its
        fallback up when it dials again, so it dials again only with the time for two more such attempts: one that
        may miss, and one more."""
        elapsed = self._clock() - self._started
        exhausted = len(self.attempts) >= self.policy.max_attempts or elapsed >= self.policy.max_time
        sticky = self._since_new_node >= self.policy.sticky_window
        ahead = self.longest * (2 if self.holds_one else 1)
        late = bool(self._fallbacks) and elapsed + ahead > self.policy.max_time
        if exhausted or sticky or late:
            if self._fallbacks:
                return _UseFallback(tuple(node for _, node in self._fallbacks))
            error = self._error(sticky, elapsed)
            error.__cause__ = self._last_error  # raised as `raise ... from` the last connection failure
            return GiveUp(error)
        delay = self.policy.backoff(self._consecutive_failures)
        return _Wait(min(delay, max(0.0, self.policy.max_time - elapsed)))

    def forget_fallback(self) -> None:
        """The kept fallback connections are gone (closed meanwhile)."""
        self._fallbacks = []

    # -- helpers -----------------------------------------------------------------------------
    def _earlier_tiers_failed(self, tier: int) -> bool:
        earlier = [a for t in self.candidates.tiers[:tier] for a in t]
        return all(a in self._failed for a in earlier)

    def _tier0(self) -> str:
        return "{" + ", ".join(map(str, self.candidates.tiers[0])) + "}"

    def _error(self, sticky: bool, elapsed: float) -> PlacementError:
        role, stream = self.candidates.role.value, self.candidates.stream
        reached = ", ".join(sorted(map(str, self._seen))) or "none"
        history = summarise(self.attempts)
        misrouted = sum(a.outcome.startswith(f"failed: {Misrouted.__name__}") for a in self.attempts)
        if misrouted:
            reached += (f"; {misrouted} of the connections were misrouted (each reached another node than the "
                        f"one whose name it sent), and closed")
        if sticky or (self._seen and not self._failed):
            return NodeUnreachable(
                f"could not place the {role} of {stream!r} on {self.candidates}: {len(self.attempts)} connections "
                f"in {elapsed:.1f}s reached only {reached}; the load balancer (or resolver) never routes to a "
                f"candidate. Attempts: {history}",
                tuple(self.attempts),
            )
        return PlacementError(
            f"could not place the {role} of {stream!r} on {self.candidates} within {len(self.attempts)} attempts "
            f"and {elapsed:.1f}s; nodes reached: {reached}. Attempts: {history}",
            tuple(self.attempts),
        )


# -- the whole loop ----------------------------------------------------------------------------------
class Kept(Protocol[C_co]):
    """Connections kept for a later placement (a parking lot): one alive on one of ``nodes``, taken out."""

    def take(self, nodes: tuple[Address, ...]) -> C_co | None: ...


@dataclass(frozen=True)
class Dial:
    """Dial ``target`` (an advertised node; the resolver says what address), after ``delay`` seconds."""

    target: Address
    delay: float = 0.0


@dataclass(frozen=True)
class Done(Generic[C]):
    """The placement is over: use ``connection`` (``reused``: one not dialled now, a kept one or, with
    ``shared``, one the role already uses)."""

    connection: C
    reused: bool = False
    shared: bool = False


@dataclass(frozen=True)
class Keep(Generic[C]):
    """``connection`` reached ``node``, which this placement cannot use now: keep it for another, then
    ask :meth:`Placement.next`.  ``stale``: a node was dialled directly and another answered, so the
    topology that named it is out of date."""

    connection: C
    node: Address
    stale: bool


@dataclass(frozen=True)
class Routed:
    """How a connection was routed: by the name it sent (SNI), ``sni``.  ``wanted`` and ``reached`` name the
    node aimed at and the node reached where the protocol knows their names (AMQP and MQTT: Erlang node names);
    else the messages name their addresses."""

    sni: str
    wanted: str | None = None
    reached: str | None = None


def misroute(routed: Routed, target: Address, dialled: Address, reported: Address) -> Misrouted | None:
    """The error of a connection routed by name that reached ``reported`` instead of ``target`` (None if it
    reached its target): naming the name sent, the node wanted and the node reached."""
    if reported == target:
        return None
    wanted = f"{routed.wanted} ({target})" if routed.wanted else str(target)
    reached = f"{routed.reached} ({reported})" if routed.reached else str(reported)
    return Misrouted(
        f"misrouted by the ingress at {dialled}: the connection sent the SNI name {routed.sni!r} for node "
        f"{wanted} and reached node {reached}; it was closed, never used as {routed.reached or reported}")


@dataclass(frozen=True)
class Reject(Generic[C]):
    """``connection``, aimed at ``target``, was routed by name to another node, ``node`` (``error``): close it,
    then ask :meth:`Placement.next` (the attempt counts as failed)."""

    connection: C
    target: Address
    node: Address
    error: Misrouted


PlacementStep = Dial | Done[C] | Keep[C] | GiveUp
RoutedStep = Dial | Done[C] | Keep[C] | Reject[C] | GiveUp  #: after a landing of a connection routed by name


class Placement(Generic[C]):
    """Every decision of one placement (see the module docstring for the loop that drives it)."""

    def __init__(self, candidates: Candidates, policy: RetryPolicy, kept: Kept[C] | None = None,
                 clock: Callable[[], float] = time.monotonic, *, shared: Kept[C] | None = None,
                 holds_one: bool = False, untold_ok: bool = False) -> None:
        self.candidates = candidates
        self.landing = _Attempts(candidates, policy, clock, holds_one)
        self.kept = kept
        self.shared = shared
        #: any node will do when the one a connection reached cannot be told (a reconnect, whose candidates are
        #: every node: one that is connected now beats one that waits for the management API to answer)
        self.untold_ok = untold_ok

    def start(self) -> PlacementStep[C]:
        """Use a shared or kept connection to a tier-0 node, or dial the first target."""
        return self._offered(self.candidates.tiers[0]) or Dial(self.landing.next_target())

    def _offered(self, nodes: tuple[Address, ...]) -> Done[C] | None:
        # what this placement is offered before it dials: a shared connection first, then a kept one
        if self.shared is not None and (connection := self.shared.take(nodes)) is not None:
            return Done(connection, reused=True, shared=True)
        if self.kept is not None and (connection := self.kept.take(nodes)) is not None:
            return Done(connection, reused=True)
        return None

    @overload
    def landed(self, target: Address, dialled: Address, reported: Address, connection: C,
               routed: None = None) -> PlacementStep[C]: ...

    @overload
    def landed(self, target: Address, dialled: Address, reported: Address, connection: C,
               routed: Routed | None) -> RoutedStep[C]: ...

    def landed(self, target: Address, dialled: Address, reported: Address, connection: C,
               routed: Routed | None = None) -> RoutedStep[C]:
        """The connection to ``dialled`` (aimed at ``target``) reached ``reported``.  ``routed``: it was routed by
        the name it sent, so another node than ``target`` is a misroute (:class:`Reject`)."""
        if routed is not None and (error := misroute(routed, target, dialled, reported)) is not None:
            self.landing.failed(target, dialled, error, reported)
            return Reject(connection, target, reported, error)
        if self.landing.landed(target, dialled, reported) is _Decision.ACCEPT:
            return Done(connection)
        return Keep(connection, reported, stale=dialled == target)

    def landed_untold(self, target: Address, dialled: Address, connection: C) -> PlacementStep[C]:
        """The connection to ``dialled`` (aimed at ``target``) is open, but which node it reached cannot be told now:
        taken if any node will do (``untold_ok``).

        :raises ValueError: this placement wants a node it can name (a shell's error: it must not say untold)."""
        if not self.untold_ok:
            raise ValueError(f"a landing through {dialled} whose node cannot be told, in a placement that needs one")
        self.landing.landed_untold(target, dialled)
        return Done(connection)

    def failed(self, target: Address, dialled: Address | None, error: BaseException) -> PlacementStep[C]:
        """Dialling ``target`` failed (a connection error, not a refusal that every node would repeat)."""
        self.landing.failed(target, dialled, error)
        return self.next()

    def next(self) -> PlacementStep[C]:
        """After a kept landing or a failure: dial again (maybe after a back-off), fall back, or give up."""
        step = self.landing.next_step()
        if isinstance(step, _UseFallback):
            fallback = self._offered(step.nodes)
            if fallback is not None:
                return fallback
            self.landing.forget_fallback()  # it was closed meanwhile
            step = self.landing.next_step()
        if isinstance(step, GiveUp):
            return step
        # another placement may have opened (or kept) a connection to a tier-0 node meanwhile
        offered = self._offered(self.candidates.tiers[0])
        if offered is not None:
            return offered
        delay = step.seconds if isinstance(step, _Wait) else 0.0
        return Dial(self.landing.next_target(), delay)

    @property
    def attempts(self) -> int:
        """How many attempts this placement made."""
        return len(self.landing.attempts)

    @property
    def history(self) -> list[Attempt]:
        """Every attempt so far, the latest last."""
        return self.landing.attempts

    @property
    def longest(self) -> float:
        """The longest attempt so far, in seconds."""
        return self.landing.longest


class KeptList(Generic[C]):
    """Connections kept during one placement only (the AMQP and MQTT shells), by the node they reached."""

    def __init__(self) -> None:
        self._items: list[tuple[Address, C]] = []

    def put(self, node: Address, connection: C) -> None:
        self._items.append((node, connection))

    def take(self, nodes: tuple[Address, ...]) -> C | None:
        for index, (node, connection) in enumerate(self._items):
            if node in nodes:
                del self._items[index]
                return connection
        return None

    def drain(self) -> list[C]:
        items, self._items = self._items, []
        return [connection for _, connection in items]


# -- the two drivers: one sync, one async (dnspython's _Resolution is driven the same two ways) --------------------
@dataclass(frozen=True)
class Reached(Generic[C]):
    """A dial that opened: the connection, the address dialled, the node it reports, and how it was routed (by the
    name it sent: an SNI ingress)."""

    connection: C
    dialled: Address
    reported: Address | None  # None: its node could not be told now (see Placement's ``untold_ok``)
    routed: Routed | None = None


@dataclass(frozen=True)
class Missed:
    """A dial that failed as another attempt may not (refused, reset, timed out; a resolver that failed now): the
    address dialled, if any, and why.  What every attempt would repeat (a refused login) is raised instead."""

    dialled: Address | None
    error: BaseException


class Shell(Protocol[C]):
    """What the sync driver needs of a protocol: how it dials, and what it does with a connection the placement does
    not take now (keep it, or close it) or must never take (a misroute), and how it sleeps."""

    def dial(self, target: Address) -> Reached[C] | Missed: ...

    def keep(self, step: Keep[C]) -> None: ...

    def reject(self, step: Reject[C]) -> None: ...

    def sleep(self, seconds: float) -> None: ...

    def attempted(self, attempt: Attempt) -> None: ...


class AsyncShell(Protocol[C]):
    """:class:`Shell`, for a protocol whose I/O is async (the stream connector)."""

    async def dial(self, target: Address) -> Reached[C] | Missed: ...

    async def keep(self, step: Keep[C]) -> None: ...

    async def reject(self, step: Reject[C]) -> None: ...

    async def sleep(self, seconds: float) -> None: ...

    def attempted(self, attempt: Attempt) -> None: ...


def _after(plan: Placement[C], target: Address, outcome: Reached[C] | Missed) -> RoutedStep[C]:
    if isinstance(outcome, Missed):
        return plan.failed(target, outcome.dialled, outcome.error)
    if outcome.reported is None:
        return plan.landed_untold(target, outcome.dialled, outcome.connection)
    return plan.landed(target, outcome.dialled, outcome.reported, outcome.connection, outcome.routed)


@dataclass(frozen=True)
class _Sleep:
    seconds: float


_Io = Keep[C] | Reject[C] | _Sleep | Dial | Attempt  #: what the one loop asks of a driver


def _loop(plan: Placement[C]) -> Generator[_Io[C], Reached[C] | Missed | None, Done[C]]:
    """The one placement loop both drivers run: each piece of I/O it needs is yielded to the driver (a dial's
    outcome is sent back in), and it returns the :class:`Done`."""
    step: RoutedStep[C] = plan.start()
    while not isinstance(step, Done):
        if isinstance(step, GiveUp):
            raise step.error
        if isinstance(step, Keep | Reject):
            yield step
            step = plan.next()
            continue
        if step.delay:
            yield _Sleep(step.delay)
        outcome = yield step
        assert outcome is not None
        step = _after(plan, step.target, outcome)
        yield plan.history[-1]
    return step


def _call(shell: Shell[C] | AsyncShell[C], io: _Io[C]) -> Any:
    """The shell's answer to ``io`` (an awaitable from an :class:`AsyncShell`'s I/O)."""
    if isinstance(io, Keep):
        return shell.keep(io)
    if isinstance(io, Reject):
        return shell.reject(io)
    if isinstance(io, _Sleep):
        return shell.sleep(io.seconds)
    if isinstance(io, Attempt):
        return shell.attempted(io)
    return shell.dial(io.target)


def _next(loop: Generator[_Io[C], Reached[C] | Missed | None, Done[C]], answer: Any) -> _Io[C] | Done[C]:
    """The loop's next piece of I/O after ``answer``, or its :class:`Done`."""
    try:
        return loop.send(answer)
    except StopIteration as end:
        done: Done[C] = end.value
        return done


def drive(plan: Placement[C], shell: Shell[C]) -> Done[C]:
    """Run ``plan`` to its end with ``shell``'s blocking I/O: its :class:`Done`.

    :raises PlacementError: the placement gave up (its error lists every attempt).
    :raises BaseException: whatever ``shell.dial`` raised (a refusal every attempt would repeat)."""
    loop, answer = _loop(plan), None
    while not isinstance(io := _next(loop, answer), Done):
        answer = _call(shell, io)
    return io


async def drive_async(plan: Placement[C], shell: AsyncShell[C]) -> Done[C]:
    """:func:`drive`, awaiting ``shell``'s I/O (the only difference between the two)."""
    loop, answer = _loop(plan), None
    while not isinstance(io := _next(loop, answer), Done):
        answer = _call(shell, io)
        if inspect.isawaitable(answer):
            answer = await answer
    return io

"""One deadline per placement or recovery attempt, shared by every step inside it.

A placement (``env.producer()``, ``env.consumer()``) or one recovery attempt opens a :class:`Deadline`
with :func:`attempt`.  Every step inside it (connect and TLS, authenticate and open, a metadata query,
declaring a publisher, subscribing) runs through :func:`step`, which gives the step the time the attempt
has left, never a fixed timeout of its own, and records how long it took.  A step that runs out raises
:class:`StepTimeout`, which names the step, the time it was given and the attempt.

The deadline travels in a :mod:`contextvars` variable, so code several calls down (the connector, the
rstream seam) reads it without threading it through every signature.  It belongs to the tasks that carry
the attempt: the one that opened it, and the task each :func:`step` runs its awaitable in.  A task that
merely inherits the context (a connection's reader, a consumer's delivery task, a recovery started from
either) does not see it, so a callback never runs under the deadline of the attempt that placed it.
Outside any attempt, a step gets ``default`` seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from smartclient._errors import StepTimeout

__all__ = ["DEFAULT_STEP_TIME", "TOPOLOGY_READ", "Deadline", "attempt", "current", "detach", "remaining", "step",
           "within"]

T = TypeVar("T")

#: the step a topology read is (``f"{TOPOLOGY_READ} of {stream!r}"``): a recovery that got past it knows its stream
#: has a leader again (RecoveryPolicy.next_delay's ``progressed``)
TOPOLOGY_READ = "reading the topology"

DEFAULT_STEP_TIME = 10.0
"""Seconds one step may take when no attempt bounds it (for example the Environment's first locator)."""

_current: ContextVar[Deadline | None] = ContextVar("smartclient_deadline", default=None)


@dataclass
class Deadline:
    """The time one attempt may take, and the log of its steps (``name ms outcome``)."""

    what: str
    seconds: float
    at: float
    steps: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)  # the names of the steps that finished in time
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)  # the tasks carrying the attempt

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def got_past(self, prefix: str) -> bool:
        """Whether a step whose name starts with ``prefix`` finished in time in this attempt."""
        return any(name.startswith(prefix) for name in self.passed)

    def log(self) -> str:
        return ", ".join(self.steps) or "no step"


def current() -> Deadline | None:
    """The deadline of the attempt this code runs in, if any (None in a task that only inherited it)."""
    deadline = _current.get()
    if deadline is None:
        return None
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        return None
    return deadline if task in deadline.tasks else None


def detach() -> None:
    """Run the rest of this task outside any attempt (a task that only inherited the context is outside
    already; this makes it explicit for one that may be created from an attempt's own task)."""
    _current.set(None)


def remaining(default: float = DEFAULT_STEP_TIME) -> float:
    """Seconds the current attempt has left (``default`` outside any attempt)."""
    deadline = current()
    return deadline.remaining() if deadline is not None else default


@contextmanager
def attempt(seconds: float, what: str) -> Iterator[Deadline]:
    """Open a deadline of ``seconds`` for ``what``; an enclosing attempt's earlier deadline still wins."""
    outer = current()
    at = time.monotonic() + seconds
    if outer is not None:
        at = min(at, outer.at)
    deadline = Deadline(what, seconds, at)
    task = asyncio.current_task()
    if task is not None:
        deadline.tasks.add(task)
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)
        if outer is not None:
            outer.steps.extend(deadline.steps)
            outer.passed.extend(deadline.passed)


async def step(name: str, awaitable: Awaitable[T], default: float = DEFAULT_STEP_TIME) -> T:
    """Await ``awaitable`` within the time the current attempt has left.

    :raises StepTimeout: it did not finish in time (it is cancelled).
    """
    deadline = current()
    limit = deadline.remaining() if deadline is not None else default
    started = time.monotonic()
    outcome = "ok"
    try:
        if limit <= 0:
            _abandon(awaitable)
            raise asyncio.TimeoutError
        inner = asyncio.ensure_future(awaitable)
        inner.add_done_callback(_read_outcome)
        if deadline is not None:
            deadline.tasks.add(inner)  # steps nested in it still see the deadline; tasks it spawns do not
            inner.add_done_callback(deadline.tasks.discard)
        return await within(inner, limit)
    except asyncio.TimeoutError:
        outcome = "timeout"
        bound = f"{deadline.what} ({deadline.seconds:.1f} s)" if deadline is not None else "its default bound"
        raise StepTimeout(f"{name}: no answer within {limit:.2f} s, the time left of {bound}") from None
    except BaseException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        if deadline is not None:
            deadline.steps.append(f"{name} {1000 * (time.monotonic() - started):.0f} ms {outcome}")
            if outcome == "ok":
                deadline.passed.append(name)


async def within(inner: asyncio.Future[T], limit: float) -> T:
    """``inner``'s result within ``limit`` seconds, as ``asyncio.wait_for`` gives it from Python 3.12 on: a
    cancellation of the caller is always raised (``inner`` cancelled and waited for).  Before 3.12, ``wait_for``
    cancelled at the moment ``inner`` ended returned its result and dropped the cancellation: a hedge cancelled as
    its connection's TCP open ended went on to its handshake, through an LB that held it for a dead node, and the
    dial that had won waited 3 s for it (issue 57's fleet).  A result that came with the cancellation is dropped,
    as 3.12's ``wait_for`` drops it: what a step returns is not the resource itself (a dial's client is its
    caller's, who closes it on the cancellation).

    :raises asyncio.TimeoutError: ``inner`` did not end within ``limit`` (it is cancelled and waited for)."""
    try:
        done, _ = await asyncio.wait({inner}, timeout=limit)
    except asyncio.CancelledError:
        await _cancel_and_wait(inner)
        raise
    if not done:
        await _cancel_and_wait(inner)
        if inner.cancelled():
            raise asyncio.TimeoutError
    return inner.result()  # (one that ended meanwhile: its result or its error, as wait_for)


async def _cancel_and_wait(inner: asyncio.Future[Any]) -> None:
    """Cancel ``inner`` and wait until it has ended (a cancellation of the caller meanwhile is raised); an error it
    ended with is read (nobody else will: asyncio would log it as never retrieved)."""
    if not inner.done():
        inner.cancel()
        await asyncio.wait({inner})
    if not inner.cancelled():
        inner.exception()


def _abandon(awaitable: Awaitable[Any]) -> None:
    """Let go of ``awaitable`` without awaiting it: a coroutine is closed, a task cancelled, a future (a shield's
    outer one, whose inner work goes on) left to take its outcome and have it read, or, if it is done, its error
    read: else asyncio would log "exception was never retrieved" when it is collected."""
    if asyncio.iscoroutine(awaitable):
        awaitable.close()
    elif asyncio.isfuture(awaitable):
        if not awaitable.done():
            if isinstance(awaitable, asyncio.Task):
                awaitable.cancel()
            else:  # a shield's outer future: left to take the outcome, which is read (Python 3.14 reports the
                awaitable.add_done_callback(_read_outcome)  # error of a shielded future whose shield was cancelled)
        elif not awaitable.cancelled():
            awaitable.exception()


def _read_outcome(task: asyncio.Future[Any]) -> None:
    """Read a step's error even when nobody awaits it any more: a step cancelled (its caller was, or its time ran
    out) can still end with an error of its own: Python 3.11's ``wait_for`` inside it (rstream's requests) returns
    the answer's error that arrived with the cancellation, and asyncio would log it as "never retrieved".  Whoever
    awaits the step still gets it."""
    if not task.cancelled():
        task.exception()

"""The suite's root conftest: it enables the test bed's pytest plugin, which is opt-in, and holds what both
layers (tests/unit, tests/integration) use.

The plugin brings the fixtures ``rabbitmq_testbed``, ``rabbitmq_faulty_testbed``,
``rabbitmq_unique_name`` and ``rabbitmq_spark``.

A test waits for a condition with a deadline (:func:`wait_until`), never for a fixed time, unless the passing
time is itself the scenario.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

pytest_plugins = ["smartclient.testing.pytest_plugin"]


class _Wait:
    """One wait's deadline and its last "not yet" error; :func:`wait_until` and :func:`wait_until_sync` drive it
    and differ only in how they sleep."""

    def __init__(self, timeout: float, what: str | Callable[[], str],
                 retry_on: tuple[type[BaseException], ...]) -> None:
        self.timeout, self.what, self.retry_on = timeout, what, retry_on
        self.deadline = time.monotonic() + timeout
        self.error: BaseException | None = None

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        try:
            yield
        except self.retry_on as exc:
            self.error = exc

    def check_deadline(self) -> None:
        if time.monotonic() >= self.deadline:
            what = self.what if isinstance(self.what, str) else self.what()
            raise AssertionError(f"timed out after {self.timeout:g} s waiting for {what}") from self.error


async def wait_until(check: Callable[[], Any], timeout: float, what: str | Callable[[], str], *,
                     interval: float = 0.02, retry_on: tuple[type[BaseException], ...] = ()) -> Any:
    """Poll ``check`` (a function, or a coroutine function) until it returns something true, and return
    that.  After ``timeout`` s, fail naming ``what`` (a function: called then, to say how far it got).  An
    exception of a type in ``retry_on`` means "not yet" (the last one is chained to the failure); any other
    propagates at once."""
    wait = _Wait(timeout, what, retry_on)
    while True:
        with wait.attempt():
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
        wait.check_deadline()
        await asyncio.sleep(interval)


def wait_until_sync(check: Callable[[], Any], timeout: float, what: str | Callable[[], str], *,
                    interval: float = 0.05, retry_on: tuple[type[BaseException], ...] = ()) -> Any:
    """:func:`wait_until` for code with no event loop (pika, paho, the sync facade, the management API)."""
    wait = _Wait(timeout, what, retry_on)
    while True:
        with wait.attempt():
            value = check()
            if value:
                return value
        wait.check_deadline()
        time.sleep(interval)


def bed_name(node: str) -> str:
    """The test bed's SNI rule: AMQP and MQTT hand it the Erlang name (``rabbit-2@localhost``), streams the
    advertised host (``rabbit-2.smartclient.test``); both name ``rabbit-2.smartclient.test``, which routes to
    rabbit-2."""
    return f"{node.split('@')[0].split('.')[0]}.smartclient.test"

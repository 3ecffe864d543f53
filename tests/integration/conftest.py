"""Shared helpers for tests against the real test bed (the fixtures come from the test bed's plugin, which
tests/conftest.py enables).  A test waits for a condition with a deadline (:func:`wait_until`), never for a
fixed time, unless the passing time is itself the scenario."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from smartclient.testing import TestBed
from smartclient.testing.streams import raw_stream_client

pytestmark = pytest.mark.integration


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


class _NeverRetrieved(logging.Handler):
    """What asyncio logs of a future or task whose error nobody read ("... exception was never retrieved"): a
    failure that nobody was told of.  Each one is kept to fail the test it was logged in."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "exception was never retrieved" in message:
            self.seen.append(message.splitlines()[0] + " " + " ".join(message.splitlines()[1:2])[:300])


_NEVER_RETRIEVED = _NeverRetrieved()
logging.getLogger("asyncio").addHandler(_NEVER_RETRIEVED)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """After every fixture of the test has ended (its event loop closed too): collect the garbage, so that what it
    left unread is logged now, and fail the test if asyncio said of anything that its exception was never
    retrieved (issue 53)."""
    result = yield
    gc.collect()
    seen, _NEVER_RETRIEVED.seen[:] = list(_NEVER_RETRIEVED.seen), []
    if seen:
        pytest.fail(f"asyncio logged {len(seen)} exception(s) nobody retrieved: " + "; ".join(seen[:3]),
                     pytrace=False)
    return result


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


def load_example(name: str) -> Any:
    """``examples/<name>.py`` as a module, to drive its functions from a test."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def open_stream_client(rabbitmq_testbed: TestBed) -> Callable[..., Any]:
    def opener(host: str, port: int, name: str = "") -> Any:
        return raw_stream_client(rabbitmq_testbed, host, port, name)

    return opener

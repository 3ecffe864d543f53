"""Shared helpers for tests against the real test bed (the fixtures come from the test bed's plugin, which
tests/conftest.py enables).  A test waits for a condition with a deadline (:func:`wait_until`), never for a
fixed time, unless the passing time is itself the scenario."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

import pytest

from smartclient.testing import TestBed
from smartclient.testing.streams import raw_stream_client

pytestmark = pytest.mark.integration


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


async def wait_until(check: Callable[[], Any], timeout: float, what: str | Callable[[], str], *,
                     interval: float = 0.02, retry_on: tuple[type[BaseException], ...] = ()) -> Any:
    """Poll ``check`` (a function, or a coroutine function) until it returns something true, and return
    that.  After ``timeout`` s, fail naming ``what`` (a function: called then, to say how far it got).  An
    exception of a type in ``retry_on`` means "not yet" (the last one is chained to the failure); any other
    propagates at once."""
    deadline = time.monotonic() + timeout
    error: BaseException | None = None
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
        except retry_on as exc:
            error = exc
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what) from error
        await asyncio.sleep(interval)


def wait_until_sync(check: Callable[[], Any], timeout: float, what: str | Callable[[], str], *,
                    interval: float = 0.05, retry_on: tuple[type[BaseException], ...] = ()) -> Any:
    """:func:`wait_until` for code with no event loop (pika, paho, the sync facade, the management API)."""
    deadline = time.monotonic() + timeout
    error: BaseException | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except retry_on as exc:
            error = exc
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what) from error
        time.sleep(interval)


def _timed_out(timeout: float, what: str | Callable[[], str]) -> AssertionError:
    return AssertionError(f"timed out after {timeout:g} s waiting for {what if isinstance(what, str) else what()}")


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

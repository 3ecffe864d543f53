"""One event loop per Python worker, in a background thread, with the StreamWings it opened.

Spark runs ``foreachPartition`` functions and data-source readers in Python worker processes that
are reused across tasks; the StreamWing (and its connections) of a given :class:`StreamConnection`
is opened once per worker and closed when the worker exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from smartclient.spark.config import StreamConnection
from smartclient.stream.wing import StreamWing

__all__ = ["run_with_environment"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_envs: dict[tuple[Any, ...], StreamWing] = {}


def _get_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="smartclient-spark-loop", daemon=True).start()
            _loop = loop
            atexit.register(_shutdown)
        return _loop


async def _environment(connection: StreamConnection) -> StreamWing:
    env = _envs.get(connection.key)
    if env is None or env.closed:
        env = connection.environment()
        await env.start()
        _envs[connection.key] = env
    return env


def run_with_environment(connection: StreamConnection, work: Callable[[StreamWing], Awaitable[T]]) -> T:
    """Run ``work(env)`` on the worker's loop with the worker's StreamWing for ``connection``; block."""

    async def call() -> T:
        return await work(await _environment(connection))

    return asyncio.run_coroutine_threadsafe(call(), _get_loop()).result()


def _shutdown() -> None:
    loop = _loop
    if loop is None or loop.is_closed():
        return

    async def close_all() -> None:
        for env in list(_envs.values()):
            with contextlib.suppress(Exception):  # the worker is exiting: nothing left to report to
                await env.close()
        _envs.clear()

    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(close_all(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)

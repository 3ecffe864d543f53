"""``Flag``: an ``asyncio.Event`` for objects there are thousands of (a producer's room and idle flags).

``asyncio.Event`` builds a ``collections.deque`` for its waiters when it is made, 760 bytes before anyone waits;
two per producer, with the producer's two other deques, were more than half of a ``PublishBuffer`` (5.5 KiB), at
a few hundred producers in a process (a super stream of hundreds of partitions, issue 57).  A ``Flag`` makes its
waiters' list when someone first waits; setting one that nobody waits for costs what ``Event.set`` does.
"""

from __future__ import annotations

import asyncio

__all__ = ["Flag"]


class Flag:
    """Set or clear, and ``await wait()`` until set; made set unless ``value`` is False."""

    __slots__ = ("_value", "_waiters")

    def __init__(self, value: bool = True) -> None:
        self._value = value
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        if not self._value:
            self._value = True
            waiters, self._waiters = self._waiters, None
            for waiter in waiters or ():
                if not waiter.done():
                    waiter.set_result(None)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> None:
        """Return once the flag is set (at once if it is); cancelled, the wait leaves nothing behind."""
        if self._value:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)

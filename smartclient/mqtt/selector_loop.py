"""One thread driving many paho clients on one ``selectors`` selector (paho's external-loop interface).

paho runs one network thread per client (``loop_start``).  :class:`SelectorLoop` instead registers every client's
socket with one selector (``on_socket_open``, ``on_socket_register_write``, ...), and its one thread calls
``loop_read``/``loop_write`` on the ready ones and ``loop_misc`` (keepalive) on every client once a second.  No thread
per client, no socket pair per client: one file descriptor each.  Calls from other threads are handed to it
(:meth:`SelectorLoop.call`), and it runs timers (:meth:`SelectorLoop.later`).
:class:`~smartclient.mqtt.fleet.MqttFleet` drives its clients on one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import heapq
import itertools
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["Driven", "SelectorLoop"]

T = TypeVar("T")


class Driven(Protocol):
    """What the loop drives: something holding a paho client (a fleet's member)."""

    @property
    def client(self) -> Any: ...


class SelectorLoop:
    """The loop thread of many paho clients.

    :param name: the thread's name.
    :param driven: the things driven, each holding a client (read at every keepalive round: it may grow).
    :param driven_by: the thing a client's ``userdata`` names (paho hands it to the socket callbacks).
    """

    def __init__(self, name: str, driven: Callable[[], Sequence[Driven]], driven_by: Callable[[Any], Driven]) -> None:
        self.name = name
        self._driven = driven
        self._driven_by = driven_by
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._calls: deque[Callable[[], None]] = deque()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._ident = 0
        self.stopped = False

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (within 5 s) and close the selector."""
        self.stopped = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        self._thread = None

    def attach(self, client: Any) -> None:
        """Register ``client``'s sockets with the selector as paho opens and closes them."""
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write

    def mute(self, client: Any) -> None:
        """Stop reading ``client``'s socket (on the loop thread), until it is opened again."""
        sock = client.socket()
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)

    # -- calls and timers ----------------------------------------------------------------------------------
    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread, soon (from any thread)."""
        self._calls.append(fn)
        self.wake()

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"x")

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread in ``delay`` seconds (from the loop thread)."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), fn))

    def on_loop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` now if this is the loop thread, else soon on it."""
        if threading.get_ident() == self._ident:
            fn()
        else:
            self.call(fn)

    def on_loop_wait(self, fn: Callable[[], T], deadline: float) -> T:
        """``fn()`` run on the loop thread, its result (or exception) handed back to this one."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        self.call(run)
        return future.result(timeout=max(0.0, deadline - time.monotonic()) + 5.0)

    # -- the thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        self._ident = threading.get_ident()
        next_slice, misc_slice = time.monotonic() + 0.1, 0
        while not self.stopped:
            wake_at = min(next_slice, self._timers[0][0]) if self._timers else next_slice
            for key, mask in self._selector.select(timeout=max(0.0, wake_at - time.monotonic())):
                driven = key.data
                if driven is None:
                    self._drain_wake()
                    continue
                client = driven.client
                if mask & selectors.EVENT_READ:
                    client.loop_read()
                if mask & selectors.EVENT_WRITE and client.socket() is not None:
                    client.loop_write()
            while self._calls:
                self._calls.popleft()()
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                heapq.heappop(self._timers)[2]()
            if now >= next_slice:
                # keepalive (PINGREQ when idle): a tenth of the clients every 100 ms, each once a second
                for driven in self._driven()[misc_slice::10]:
                    if driven.client.socket() is not None:
                        driven.client.loop_misc()
                misc_slice = (misc_slice + 1) % 10
                next_slice = now + 0.1

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    # -- paho's socket callbacks (the loop thread, except register_write from a publishing thread) -------------
    def _on_socket_open(self, client: Any, userdata: Any, sock: Any) -> None:
        driven = self._driven_by(userdata)

        def register() -> None:
            self._selector.register(sock, selectors.EVENT_READ, driven)

        self.on_loop(register)

    def _on_socket_close(self, client: Any, userdata: Any, sock: Any) -> None:
        def unregister() -> None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)

        self.on_loop(unregister)

    def _on_register_write(self, client: Any, userdata: Any, sock: Any) -> None:
        self._modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, self._driven_by(userdata))

    def _on_unregister_write(self, client: Any, userdata: Any, sock: Any) -> None:
        self._modify(sock, selectors.EVENT_READ, self._driven_by(userdata))

    def _modify(self, sock: Any, events: int, driven: Driven) -> None:
        def modify() -> None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.modify(sock, events, driven)

        self.on_loop(modify)

"""What this process holds, for the soak (:mod:`smartclient.testing.soak`): its RSS, descriptors (and sockets left
half-closed), asyncio tasks and threads, and the attribute sets each OpenTelemetry instrument reports."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import socket
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Collection
from typing import Any

from smartclient.allocator import trim_free_memory

__all__ = ["half_closed_sockets", "heap_in_use", "metric_points", "node_sockets", "process_resources", "rss_after_trim"]


def process_resources() -> dict[str, int]:
    """This process's RSS (KiB), open file descriptors, asyncio tasks and threads (call it on the loop)."""
    rss = _rss()
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        fds = -1
    return {"rss kib": rss, "file descriptors": fds, "half-closed sockets": half_closed_sockets(),
            "asyncio tasks": len(asyncio.all_tasks()), "threads": threading.active_count(),
            **heap_in_use()}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc() -> Any:
    with contextlib.suppress(OSError):
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return None


def _mallinfo2() -> Any:
    with contextlib.suppress(AttributeError, TypeError):
        function = _LIBC.mallinfo2
        function.restype = _MallInfo2
        return function
    return None


_LIBC = _libc()
_MALLINFO2 = _mallinfo2()


def heap_in_use() -> dict[str, int]:
    """What is allocated and not freed, apart from what the allocators keep: glibc malloc's bytes in use (every
    arena's chunks plus its mmapped blocks, ``mallinfo2``; KiB) and Python's allocated blocks.  RSS also counts
    the freed memory an allocator keeps (an arena's free chunks below a live one), so RSS that rises while these
    stay flat is fragmentation, not a leak.  Empty where there is no glibc ``mallinfo2`` (2.33+)."""
    values = {"python blocks": sys.getallocatedblocks()}
    if _MALLINFO2 is not None:
        info = _MALLINFO2()
        values["malloc in use kib"] = (info.uordblks + info.hblkhd) // 1024
        values["malloc free kept kib"] = info.fordblks // 1024
    return values


def half_closed_sockets(ports: Collection[int] = ()) -> int:
    """This process's TCP sockets whose peer has closed and that nobody closed (CLOSE_WAIT): each holds a
    descriptor until it is closed or collected; only those to ``ports`` (remote), when given.

    Each socket descriptor is asked for its own state (``TCP_INFO``): reading ``/proc/net/tcp`` instead lists
    every socket of the machine (thousands in TIME_WAIT under load), and its buffers made a 2-hour soak's RSS
    follow the machine's connection churn."""
    count, fds = 0, []
    with contextlib.suppress(OSError):
        fds = os.listdir("/proc/self/fd")
    for fd in fds:
        with contextlib.suppress(OSError, ValueError):
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:["):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))  # (a copy: closing it leaves the owner's open)
            with sock:
                if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
                if state == _CLOSE_WAIT and (not ports or sock.getpeername()[1] in ports):
                    count += 1
    return count


_CLOSE_WAIT = 8  # tcpi_state (linux/tcp_states.h)


def metric_points(reader: Any) -> dict[str, int]:
    """The data points (attribute sets) each instrument reports now, and their total, read from ``reader`` (an
    OpenTelemetry ``InMemoryMetricReader``)."""
    points: dict[str, int] = defaultdict(int)
    data = reader.get_metrics_data()
    for resource in getattr(data, "resource_metrics", None) or ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[f"metric {metric.name}"] += len(list(metric.data.data_points))
    points["metric attribute sets"] = sum(points.values())
    return dict(points)


def rss_after_trim() -> tuple[int, int]:
    """This process's RSS (KiB) now, and after glibc's ``malloc_trim(0)`` has handed the free memory of every
    arena back to the system: the difference is memory freed but kept by the allocator (fragmentation), not
    memory in use.  ``(rss, rss)`` where there is no ``malloc_trim``.  A diagnostic: it costs a walk of the
    heap, so only at the end of a run."""
    before = _rss()
    trim_free_memory()
    return before, _rss()


def _rss() -> int:
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def node_sockets(node: str) -> list[str]:
    """The TCP connections to ``node``'s port (``host:port``) with their queues (``ss``): bytes the client has
    not read (its Recv-Q) or the broker has not (the other end's), so that a silent connection says which side
    stopped reading (both ends are seen when the broker shares this host's network, as the local bed's does).
    The 2-hour soak's one silence came with every request on its connection unanswered.  (``ss`` takes a few
    milliseconds; it is called once per rescue.)"""
    port = node.rpartition(":")[2]
    if not port.isdigit():
        return []
    try:
        out = subprocess.run(["ss", "-tnH", "state", "established", f"( sport = :{port} or dport = :{port} )"],
                             capture_output=True, text=True, timeout=2).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return [f"ss: {exc}"]
    return [" ".join(line.split()) for line in out.splitlines()][:200]

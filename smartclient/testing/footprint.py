"""What this process holds, for the soak (:mod:`smartclient.testing.soak`): its RSS, descriptors (and sockets left
half-closed), asyncio tasks and threads, and the attribute sets each OpenTelemetry instrument reports."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import defaultdict
from collections.abc import Collection
from typing import Any

__all__ = ["half_closed_sockets", "metric_points", "process_resources"]


def process_resources() -> dict[str, int]:
    """This process's RSS (KiB), open file descriptors, asyncio tasks and threads (call it on the loop)."""
    rss = 0
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        fds = -1
    return {"rss kib": rss, "file descriptors": fds, "half-closed sockets": half_closed_sockets(),
            "asyncio tasks": len(asyncio.all_tasks()), "threads": threading.active_count()}


def half_closed_sockets(ports: Collection[int] = ()) -> int:
    """This process's TCP sockets whose peer has closed and that nobody closed (CLOSE_WAIT): each holds a
    descriptor until it is closed or collected; only those to ``ports`` (remote), when given."""
    inodes: set[str] = set()
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/self/net/{name}") as table:
            for line in list(table)[1:]:
                fields = line.split()
                if fields[3] == "08" and (not ports or int(fields[2].rsplit(":", 1)[1], 16) in ports):
                    inodes.add(fields[9])
    count = 0
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/self/fd/{fd}")
                count += link.startswith("socket:[") and link[8:-1] in inodes
    return count


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

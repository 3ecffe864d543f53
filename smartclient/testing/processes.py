"""PIDs, ports and waiting: the small I/O the test bed's controllers share."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from smartclient._errors import TestBedError

__all__ = [
    "cpu_by_process",
    "ephemeral_port_range",
    "find_pids_with_env",
    "kill_pid",
    "pid_alive",
    "port_accepts",
    "port_is_free",
    "read_pid",
    "wait_until",
]


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def pid_alive(pid: int | None, must_contain: str | None = None, env_entry: str | None = None) -> bool:
    """True if ``pid`` runs, its command line contains ``must_contain`` and its environment
    holds the exact entry ``env_entry`` (``NAME=value``): both guard against PID reuse."""
    if pid is None or pid <= 0:
        return False
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        # a zombie is not alive: the field after the command name is the state
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
        if must_contain is not None:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if must_contain not in cmdline:
                return False
        if env_entry is not None and env_entry.encode() not in (proc / "environ").read_bytes().split(b"\0"):
            return False
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return True


def find_pids_with_env(env_entry: str, must_contain: str) -> list[int]:
    """PIDs whose command line contains ``must_contain`` and whose environment holds ``env_entry``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and pid_alive(int(entry.name), must_contain, env_entry):
            found.append(int(entry.name))
    return found


def kill_pid(pid: int, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
    """Send ``sig`` to one process (by PID, never by name) and wait until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    wait_until(lambda: not pid_alive(pid), timeout, f"process {pid} to exit after signal {sig}")
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def port_accepts(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ephemeral_port_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (Linux default 32768-60999)."""
    try:
        low, high = path.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


_T = TypeVar("_T")


def wait_until(check: Callable[[], _T], timeout: float, what: str, interval: float = 0.1) -> _T:
    """Poll ``check`` until it returns something true, and return that; raise :class:`TestBedError` naming
    ``what`` after ``timeout`` s (chained to the check's last error, if it raised)."""
    deadline = time.monotonic() + timeout
    error: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # a check that raises is a check that is not yet true
            error = exc
        if time.monotonic() >= deadline:
            raise TestBedError(f"timed out after {timeout:.0f}s waiting for {what}") from error
        time.sleep(interval)


def cpu_by_process(marks: Mapping[str, str]) -> dict[int, tuple[str, float]]:
    """The CPU seconds (user and system) each process has spent so far, by pid, with the name of the first of
    ``marks`` (name -> what its command line contains; "" matches every process) it matches; the others are left
    out, and so are processes gone meanwhile."""
    tick = os.sysconf("SC_CLK_TCK")
    spent: dict[int, tuple[str, float]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            whose = next((name for name, mark in marks.items() if mark.encode() in command), None)
            if whose is None:
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        spent[int(pid)] = (whose, (int(fields[11]) + int(fields[12])) / tick)  # utime + stime
    return spent

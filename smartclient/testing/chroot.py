"""RabbitMQ from a newer Debian suite, installed once into a cached chroot.

Debian bookworm ships RabbitMQ 3.10, which lacks single active consumer,
super-stream creation, the local random exchange and native MQTT, so the test
bed runs ``rabbitmq-server`` from a chroot made by ``debootstrap --variant=minbase``:
forky's 4.3.x (Erlang 29, the default) or trixie's 4.0.5 (Erlang 27), each in its
own chroot.  A chroot is built in a temporary directory and renamed into place,
so a half-built one is never used, under a lock beside it, so a second process that provisions the same
chroot (``./dev test`` builds both in the background while a test session may ask for one) waits for the
first and finds it built.  It gets the host's ``/etc/hosts`` (without it
forky's epmd cannot resolve ``localhost`` and the node fails with ``nxdomain``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from smartclient._errors import PrerequisiteMissing, TestBedError

__all__ = ["RabbitChroot", "debian_mirror"]

log = logging.getLogger(__name__)

MARKER = ".smartclient-provisioned"
RABBITMQ_BIN = "/usr/lib/rabbitmq/bin"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def debian_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt uses (deb822 ``URIs:`` or one-line ``deb``)."""
    candidates = [sources_dir / "sources.list", *sorted((sources_dir / "sources.list.d").glob("*"))]
    for path in candidates:
        with contextlib.suppress(OSError):
            text = path.read_text()
            for match in re.finditer(r"^\s*(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.M):
                uri = match.group(1)
                if "debian" in uri and "security" not in uri:
                    return uri.rstrip("/")
    return DEFAULT_MIRROR


class RabbitChroot:
    """The cached chroot: provision it, mount ``/proc`` in it, run RabbitMQ's tools in it."""

    def __init__(self, root: Path, suite: str, script: str | None = None) -> None:
        self.root = root
        self.suite = suite
        self.script = script

    @property
    def provisioned(self) -> bool:
        return (self.root / MARKER).exists()

    def rabbitmq_version(self) -> str:
        marker = self.root / MARKER
        return marker.read_text().strip() if marker.exists() else "?"

    def provision(self) -> float:
        """Build the chroot if it is not cached; return the seconds it took (0.0 when cached, or when another
        process built it while this one waited for the lock)."""
        if self.provisioned:
            return 0.0
        self.root.parent.mkdir(parents=True, exist_ok=True)
        with open(self.root.with_name(self.root.name + ".lock"), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.warning("another process is provisioning %s: waiting for it", self.root)
                fcntl.flock(lock, fcntl.LOCK_EX)
            if self.provisioned:  # built by the process this one waited for
                return 0.0
            return self._build()

    def _build(self) -> float:
        if shutil.which("debootstrap") is None:
            raise PrerequisiteMissing(
                f"debootstrap is not installed, and the test bed needs it to install RabbitMQ from {self.suite}: "
                "run `apt-get install -y debootstrap` (or ./dev, which does it)."
            )
        started = time.monotonic()
        staging = self.root.with_name(self.root.name + ".staging")
        if staging.exists():
            self._unmount_proc(staging)
            shutil.rmtree(staging)
        mirror = debian_mirror()
        log.info("debootstrap %s with rabbitmq-server from %s into %s", self.suite, mirror, staging)
        cmd = ["debootstrap", "--variant=minbase", "--include=rabbitmq-server", self.suite, str(staging), mirror]
        if self.script:
            cmd.append(self.script)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
            raise TestBedError(f"debootstrap of Debian {self.suite} failed (exit {proc.returncode}):\n{tail}")
        version = self._read_version(staging)
        (staging / MARKER).write_text(version + "\n")
        self._unmount_proc(staging)
        if self.root.exists():  # the remains of an unfinished or interrupted chroot
            self._unmount_proc(self.root)
            shutil.rmtree(self.root)
        os.replace(staging, self.root)
        return time.monotonic() - started

    @staticmethod
    def _read_version(root: Path) -> str:
        libs = sorted((root / "usr/lib/rabbitmq/lib").glob("rabbitmq_server-*"))
        if not libs:
            raise TestBedError(f"no rabbitmq_server in {root}: the Debian package layout changed")
        return libs[-1].name.split("-", 1)[1]

    def ensure_proc(self) -> None:
        """Mount ``/proc`` in the chroot and give it the host's ``/etc/hosts`` (both idempotent)."""
        self.copy_hosts()
        proc = self.root / "proc"
        if not os.path.ismount(proc):
            proc.mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=True)

    def copy_hosts(self, hosts: Path = Path("/etc/hosts")) -> None:
        inner = self.root / "etc/hosts"
        with contextlib.suppress(OSError):
            text = hosts.read_text()
            if not inner.exists() or inner.read_text() != text:
                inner.write_text(text)

    def release(self) -> None:
        """Unmount ``/proc`` from the chroot (``down`` calls it; ``up`` mounts it again), unless a process
        still runs inside it: test beds on other port bases share the cached chroot, and a node whose
        ``/proc`` vanishes crashes its memory monitor and, with it, its management API."""
        users = self.processes_inside()
        if users:
            log.info("leaving /proc mounted in %s: %d process(es) still run there (another test bed?)",
                     self.root, len(users))
            return
        self._unmount_proc(self.root)

    def processes_inside(self, proc: Path = Path("/proc")) -> list[int]:
        """PIDs of the processes whose root directory is this chroot."""
        inside = []
        root = str(self.root.resolve())
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(entry / "root") == root:
                    inside.append(int(entry.name))
            except OSError:
                continue
        return inside

    @staticmethod
    def _unmount_proc(root: Path) -> None:
        if os.path.ismount(root / "proc"):
            subprocess.run(["umount", "-l", str(root / "proc")], check=False)

    def env(self, extra: Mapping[str, str]) -> dict[str, str]:
        """A clean environment for RabbitMQ inside the chroot (nothing of the caller's leaks in)."""
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", **extra}

    def command(self, tool: str, args: Sequence[str], netns: str = "") -> list[str]:
        """The command line of ``tool`` in the chroot (and in network namespace ``netns``, if given)."""
        inner = ["chroot", str(self.root), f"{RABBITMQ_BIN}/{tool}", *args]
        return ["ip", "netns", "exec", netns, *inner] if netns else inner

    def run_tool(
        self, tool: str, args: Sequence[str], env: Mapping[str, str], timeout: float = 60.0, netns: str = ""
    ) -> subprocess.CompletedProcess[str]:
        """Run ``rabbitmqctl``/``rabbitmq-streams``/... inside the chroot; raise with its output on failure."""
        cmd = self.command(tool, args, netns)
        try:
            proc = subprocess.run(cmd, env=self.env(env), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise TestBedError(f"{tool} {' '.join(args)} did not finish in {timeout:.0f}s") from exc
        if proc.returncode != 0:
            out = (proc.stdout + proc.stderr).strip()
            raise TestBedError(f"{tool} {' '.join(args)} failed (exit {proc.returncode}): {out[-600:]}")
        return proc

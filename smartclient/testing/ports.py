"""Who holds the test bed's ports: a bed whose port another process holds refuses at once, naming both.

Without this check a bed brought up beside another one whose ports overlap it starts its nodes anyway, and the
node that cannot bind waits out its 90 s ("timed out after 90s waiting for broker-1@localhost to listen on all
its ports") with the real cause, ``eaddrinuse``, left in its log.

The kernel says who holds a port: each row of ``/proc/net/tcp``, ``tcp6``, ``udp`` and ``udp6`` gives a socket's
local port, state and inode, and a process holds the socket when one of its ``/proc/<pid>/fd`` links reads
``socket:[<inode>]``.  :func:`find_taken_ports` reads that; the rules (which sockets block a bind, which holder is
the bed's own, the one-line refusal) are pure: :func:`parse_socket_table`, :class:`BedIdentity`,
:func:`taken_ports` and :func:`refusal`.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from smartclient.testing.layout import PORT_SPAN, Layout, PortUse

__all__ = [
    "BedIdentity",
    "ProcessInfo",
    "SocketRow",
    "TakenPort",
    "find_taken_ports",
    "parse_socket_table",
    "refusal",
    "taken_ports",
]

TCP_LISTEN = 0x0A
TCP_CLOSE = 0x07  # a TCP socket bound and not (or no longer) listening; a UDP socket bound and not connected
#: the longest command line a refusal quotes
COMMAND_CHARS = 200


@dataclass(frozen=True)
class SocketRow:
    """One row of a ``/proc/net`` socket table."""

    port: int
    state: int
    inode: int


def parse_socket_table(text: str) -> list[SocketRow]:
    """The rows of ``/proc/net/tcp`` (or ``tcp6``, ``udp``, ``udp6``): local port, state, inode."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            rows.append(SocketRow(int(fields[1].rsplit(":", 1)[1], 16), int(fields[3], 16), int(fields[9])))
        except (IndexError, ValueError):
            continue
    return rows


def blocking_sockets(rows: Iterable[SocketRow], transport: str) -> dict[int, set[int]]:
    """Port -> the inodes of the sockets that keep a listener from binding it: a TCP socket listening, or bound
    and not listening; any UDP socket bound to it.  (Connections a listener accepted share its port and do not
    block a bind with ``SO_REUSEADDR``, which RabbitMQ and HAProxy set; a socket on any address counts, as the
    bed's distribution ports and epmd bind every address.)"""
    found: dict[int, set[int]] = {}
    for row in rows:
        if row.inode and (transport == "udp" or row.state in (TCP_LISTEN, TCP_CLOSE)):
            found.setdefault(row.port, set()).add(row.inode)
    return found


@dataclass(frozen=True)
class ProcessInfo:
    """What a refusal names, and what tells the bed's own processes from the others: command line, root
    directory (``None`` when unreadable), environment entries (``NAME=value``)."""

    pid: int
    argv: tuple[str, ...]
    root: str | None = None
    environ: frozenset[str] = frozenset()

    @property
    def command(self) -> str:
        line = " ".join(self.argv) or "?"
        return line if len(line) <= COMMAND_CHARS else line[: COMMAND_CHARS - 3] + "..."

    def describe(self) -> str:
        """``pid 8801 (<command line>)``, and for a RabbitMQ process, the node it was started for and its home
        (a test bed's says its base: ``/srv/smartclient-testbed/20000``), which a beam's command line omits."""
        env = dict(e.split("=", 1) for e in self.environ if "=" in e)
        node = env.get("RABBITMQ_NODENAME")
        started = f"; started for RabbitMQ node {node}, HOME {env.get('HOME', '?')}" if node else ""
        return f"pid {self.pid} ({self.command}{started})"


@dataclass(frozen=True)
class BedIdentity:
    """What marks a process as one this bed started.

    A bed is its release's chroot and its port base, so its processes are known by those, not by its PID files
    (a PID file is stale after a crash, and HAProxy's names only the newest of the processes of a reload):

    * HAProxy and the DNS server run on the host, from files in the bed's run directory: their command lines name
      it (``haproxy -f <run_dir>/haproxy/haproxy.cfg``, ``dns_server --zone <run_dir>/dns/zone.json``), and the
      run directory is the chroot's ``srv/smartclient-testbed/<base>``, one per release and base;
    * the nodes, the extra brokers and their epmd run in the chroot (their root directory) with the bed's epmd
      port in their environment (``ERL_EPMD_PORT``, ``base + 43``): another base has another port, and another
      release another chroot.

    So an ``up()`` on a running bed finds every port held by its own processes and passes, while a bed of another
    base or release, or anything else, holding one of its ports is foreign.
    """

    run_dir: str
    chroot: str
    epmd_port: int

    @classmethod
    def of(cls, layout: Layout) -> BedIdentity:
        return cls(str(layout.run_dir), os.path.realpath(layout.chroot), layout.epmd_port)

    def owns(self, process: ProcessInfo) -> bool:
        prefix = self.run_dir.rstrip("/") + "/"
        if any(arg.startswith(prefix) for arg in process.argv):
            return True
        return process.root == self.chroot and f"ERL_EPMD_PORT={self.epmd_port}" in process.environ


@dataclass(frozen=True)
class TakenPort:
    """A port the bed needs, and the process holding it (``None``: a socket no process visible here holds)."""

    use: PortUse
    holder: ProcessInfo | None

    def describe(self) -> str:
        holder = "an unknown process" if self.holder is None else self.holder.describe()
        return f"port {self.use.port}{'/udp' if self.use.transport == 'udp' else ''} ({self.use.what}) is taken " \
               f"by {holder}"


def taken_ports(uses: Iterable[PortUse], blocking: Mapping[tuple[str, int], Collection[int]],
                holders: Mapping[int, Sequence[ProcessInfo]], identity: BedIdentity) -> list[TakenPort]:
    """The ports of ``uses`` (in port order) that a socket holds that none of the bed's own processes holds.

    :param blocking: (transport, port) -> the inodes of the sockets that block a bind on it
    :param holders: inode -> the processes holding that socket
    """
    taken = []
    for use in sorted(uses):
        for inode in sorted(blocking.get((use.transport, use.port), ())):
            processes = sorted(holders.get(inode, ()), key=lambda p: p.pid)
            if not any(identity.owns(p) for p in processes):
                taken.append(TakenPort(use, processes[0] if processes else None))
                break
    return taken


def refusal(taken: Sequence[TakenPort], base: int) -> str:
    """One line: the first port taken and its holder, how many more, and the ways out."""
    more = [t.use.port for t in taken[1:]]
    also = f"; {len(more)} more of its ports are taken too ({', '.join(map(str, more[:8]))}" \
           f"{', ...' if len(more) > 8 else ''})" if more else ""
    return (f"the test bed on port base {base} cannot start: {taken[0].describe()}{also}. Free it, or move the "
            f"test bed with SMARTCLIENT_TESTBED_PORT_BASE (now {base}): a bed spans {PORT_SPAN} ports from its "
            f"base, so beds side by side need bases at least {PORT_SPAN} apart")


# -- reading /proc ------------------------------------------------------------------------
def _read_blocking(transports: Collection[str], proc: Path) -> dict[tuple[str, int], set[int]]:
    found: dict[tuple[str, int], set[int]] = {}
    for transport in transports:
        for table in (transport, f"{transport}6"):
            try:
                text = (proc / "net" / table).read_text()
            except OSError:  # no IPv6
                continue
            for port, inodes in blocking_sockets(parse_socket_table(text), transport).items():
                found.setdefault((transport, port), set()).update(inodes)
    return found


def _read_process(entry: Path) -> ProcessInfo | None:
    try:
        argv = tuple(a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a)
    except OSError:
        return None
    try:
        root: str | None = os.readlink(entry / "root")
    except OSError:
        root = None
    try:
        environ = frozenset(e.decode(errors="replace") for e in (entry / "environ").read_bytes().split(b"\0") if e)
    except OSError:
        environ = frozenset()
    return ProcessInfo(int(entry.name), argv, root, environ)


def _read_holders(inodes: Collection[int], proc: Path) -> dict[int, list[ProcessInfo]]:
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    holders: dict[int, list[ProcessInfo]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        held = set()
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link in wanted:
                held.add(wanted[link])
        if held and (process := _read_process(entry)) is not None:
            for inode in held:
                holders.setdefault(inode, []).append(process)
    return holders


def find_taken_ports(uses: Iterable[PortUse], identity: BedIdentity, proc: Path = Path("/proc")) -> list[TakenPort]:
    """The ports of ``uses`` that a process other than the bed's own holds (see :class:`BedIdentity`), from
    ``/proc``; the processes are looked for only when some socket holds a wanted port."""
    uses = list(uses)
    blocking = _read_blocking({u.transport for u in uses}, proc)
    wanted = {inode for u in uses for inode in blocking.get((u.transport, u.port), ())}
    if not wanted:
        return []
    return taken_ports(uses, blocking, _read_holders(wanted, proc), identity)

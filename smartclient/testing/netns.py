"""The namespaced test bed's network: each node in a network namespace of its own, and silent partitions.

A bed at port base ``B`` (see :mod:`smartclient.testing.layout`) gets, all named from ``B`` so that beds side by
side never share one::

    host (client, HAProxy, DNS)          router namespace scB-rt            node namespaces scB-n1 .. scB-n3
      scB-h0  10.231.X.1  (the client)  ── bridge scB-br ──────────────  scB-e0  10.231.X.11 .. 13
              10.231.X.2  (the LB's source address)

The bridge lives in a namespace of its own, not in the host's: deleting that namespace removes the bridge and
every link on it at once, and bridged traffic never meets the host's firewall (``br_netfilter`` is on in every
namespace of this kernel).  The nodes have no default route: nothing leaves the private network.

**lb-only** (the default): an nftables table on the host rejects, as "network unreachable", every new connection
to the nodes' network whose source is not the LB's address, as a client outside a Kubernetes cluster finds it;
HAProxy dials from the LB's address (``source`` in its server lines).  **routable**: no such table.

Partitions are nftables rules inside a node's namespace (table ``smartclient_fault``) that *drop*: no reset,
no FIN, the connection just goes quiet, as on a real network.  :meth:`BedNetwork.heal` removes every one.
Everything here is rendered as data first (commands, rule sets), so the unit tests read it without root.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from smartclient._errors import ConfigurationError, PrerequisiteMissing, TestBedError

__all__ = ["FAULTS", "BedNetwork", "Fault", "listening_ports", "parse_listening"]

FAULT_TABLE = "smartclient_fault"


@dataclass(frozen=True)
class Fault:
    """One partition: drop rules for some node namespaces (``rules[i]`` for node ``i``, 1-based)."""

    what: str
    rules: dict[int, tuple[str, ...]]


@dataclass(frozen=True)
class BedNetwork:
    """The private network of the bed at port base ``base``: names, addresses, and what makes and unmakes it."""

    base: int
    nodes: int = 3
    routable: bool = False  #: the client may dial the nodes' addresses too (else only the LB reaches them)

    def __post_init__(self) -> None:
        if not 1024 <= self.base <= 65535 or self.base % 100:
            raise ConfigurationError(f"a namespaced bed's port base must be a multiple of 100 in 1024-65535, "
                                     f"not {self.base!r}")
        if not 1 <= self.nodes <= 9:
            raise ConfigurationError(f"a namespaced bed holds 1 to 9 nodes, not {self.nodes!r}")

    # -- names and addresses ---------------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        return f"sc{self.base // 100}"  # "sc200" for base 20000: interface names stay under 15 characters

    @property
    def subnet(self) -> str:
        return f"10.231.{(self.base // 100) % 256}"

    @property
    def router(self) -> str:
        return f"{self.prefix}-rt"

    @property
    def host_link(self) -> str:
        return f"{self.prefix}-h0"

    @property
    def client_address(self) -> str:
        return f"{self.subnet}.1"

    @property
    def lb_address(self) -> str:
        return f"{self.subnet}.2"

    def namespace(self, node: int) -> str:
        self._check(node)
        return f"{self.prefix}-n{node}"

    def address(self, node: int) -> str:
        self._check(node)
        return f"{self.subnet}.{10 + node}"

    def namespaces(self) -> list[str]:
        return [self.router, *(self.namespace(i) for i in range(1, self.nodes + 1))]

    def _check(self, node: int) -> None:
        if not 1 <= node <= self.nodes:
            raise ConfigurationError(f"node {node!r}: this bed's nodes are 1 to {self.nodes}")

    # -- what makes it ---------------------------------------------------------------------------------
    def setup_commands(self) -> list[list[str]]:
        """The ``ip`` commands that make the network, in order (the fence is :meth:`fence_rules`)."""
        rt, br = self.router, f"{self.prefix}-br"
        cmds = [["ip", "netns", "add", rt], ["ip", "-n", rt, "link", "set", "lo", "up"],
                ["ip", "-n", rt, "link", "add", br, "type", "bridge"], ["ip", "-n", rt, "link", "set", br, "up"],
                ["ip", "link", "add", self.host_link, "type", "veth", "peer", "name", f"{self.host_link}p",
                 "netns", rt],
                ["ip", "-n", rt, "link", "set", f"{self.host_link}p", "master", br, "up"],
                ["ip", "addr", "add", f"{self.client_address}/24", "dev", self.host_link],
                ["ip", "addr", "add", f"{self.lb_address}/24", "dev", self.host_link],
                ["ip", "link", "set", self.host_link, "up"]]
        for i in range(1, self.nodes + 1):
            ns, peer = self.namespace(i), f"{self.prefix}-n{i}p"
            cmds += [["ip", "netns", "add", ns], ["ip", "-n", ns, "link", "set", "lo", "up"],
                     ["ip", "-n", ns, "link", "add", f"{self.prefix}-e0", "type", "veth", "peer", "name", peer,
                      "netns", rt],
                     ["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", f"{self.prefix}-e0"],
                     ["ip", "-n", ns, "link", "set", f"{self.prefix}-e0", "up"],
                     ["ip", "-n", rt, "link", "set", peer, "master", br, "up"]]
        return cmds

    def fence_rules(self) -> str:
        """The host's nftables table of lb-only mode: only the LB's address opens connections to the nodes."""
        net = f"{self.subnet}.0/24"
        return (f"table inet {self.prefix} {{\n  chain output {{\n"
                "    type filter hook output priority 0; policy accept;\n"
                f"    ip daddr {net} ct state established,related accept\n"
                f"    ip daddr {net} ip saddr {self.lb_address} accept\n"
                f"    ip daddr {net} reject with icmp type net-unreachable\n  }}\n}}\n")

    # -- partitions (pure) -----------------------------------------------------------------------------
    def fault(self, what: str, node: int = 1, *, minority: Sequence[int] = (), direction: str = "both") -> Fault:
        """The drop rules of one partition (see :data:`FAULTS`)."""
        if what not in FAULTS:
            raise ConfigurationError(f"no partition {what!r}: choose one of {', '.join(FAULTS)}")
        if direction not in ("both", "in", "out"):
            raise ConfigurationError(f"direction must be 'both', 'in' or 'out', not {direction!r}")
        self._check(node)
        peers = [self.address(i) for i in range(1, self.nodes + 1) if i != node]
        if what == "isolate-from-peers":
            return Fault(what, {node: _drop(peers, direction)})
        if what == "isolate":
            return Fault(what, {node: _drop_all(direction)})
        if what == "cut-client":
            return Fault(what, {node: _drop([self.client_address], direction)})
        if what == "cut-lb":
            return Fault(what, {node: _drop([self.lb_address], direction)})
        # split: the minority's nodes drop the majority's, both ways
        small = sorted(set(minority or (node,)))
        for i in small:
            self._check(i)
        if 2 * len(small) >= self.nodes:
            raise ConfigurationError(f"minority {small} is not a minority of {self.nodes} nodes")
        majority = [self.address(i) for i in range(1, self.nodes + 1) if i not in small]
        return Fault(what, {i: _drop(majority, direction) for i in small})

    def fault_ruleset(self, rules: Iterable[str]) -> str:
        lines = "\n".join(f"    {r}" for r in rules if r.startswith("input "))
        outs = "\n".join(f"    {r}" for r in rules if r.startswith("output "))
        chain = "  chain {0} {{\n    type filter hook {0} priority 0; policy accept;\n{1}\n  }}\n"
        body = chain.format("input", lines.replace("input ", "")) if lines else ""
        body += chain.format("output", outs.replace("output ", "")) if outs else ""
        return f"table inet {FAULT_TABLE} {{\n{body}}}\n"

    def hosts_block(self) -> str:
        """The lines naming each node's address by its host name (the namespace's name), between markers."""
        lines = "".join(f"{self.address(i)} {self.namespace(i)}\n" for i in range(1, self.nodes + 1))
        return f"# {self.prefix} begin: smartclient's namespaced test bed\n{lines}# {self.prefix} end\n"

    def with_hosts(self, text: str, present: bool) -> str:
        """``text`` (an ``/etc/hosts``) with this network's block in it (``present``) or without it."""
        begin, end = f"# {self.prefix} begin:", f"# {self.prefix} end\n"
        if begin in text:
            head, _, rest = text.partition(begin)
            text = head + rest.partition(end)[2]
        if present:
            text = (text if not text or text.endswith("\n") else text + "\n") + self.hosts_block()
        return text

    def write_hosts(self, present: bool, path: str = "/etc/hosts") -> None:
        """Name the nodes in ``path`` (or stop naming them), so that the chroot's copy and the client know them."""
        with open(path) as f:
            text = f.read()
        wanted = self.with_hosts(text, present)
        if wanted != text:
            with open(path, "w") as f:
                f.write(wanted)

    # -- doing it (root, ip, nft) ----------------------------------------------------------------------
    def exists(self) -> bool:
        return self.router in _netns_list()

    def up(self) -> None:
        """Make the network (and the fence unless routable); idempotent.  A machine where namespaces cannot be
        made gets :class:`PrerequisiteMissing` in one line, and nothing is left behind."""
        check_prerequisites()
        if not self.exists():
            try:
                for cmd in self.setup_commands():
                    _run(cmd)
            except TestBedError as exc:
                self.down()
                raise PrerequisiteMissing(f"network namespaces cannot be made here: {exc}") from None
        self.set_fence(not self.routable)

    def set_fence(self, on: bool) -> None:
        _run(["nft", "delete", "table", "inet", self.prefix], missing_ok=True)
        if on:
            _run(["nft", "-f", "-"], stdin=self.fence_rules())

    def apply(self, fault: Fault) -> None:
        """Add ``fault``'s drops (beside any already in place)."""
        for node, rules in fault.rules.items():
            _run(["ip", "netns", "exec", self.namespace(node), "nft", "-f", "-"], stdin=self.fault_ruleset(rules))

    def heal(self) -> None:
        """Remove every partition."""
        for i in range(1, self.nodes + 1):
            if self.namespace(i) in _netns_list():
                _run(["ip", "netns", "exec", self.namespace(i), "nft", "delete", "table", "inet", FAULT_TABLE],
                     missing_ok=True)

    def pids(self) -> list[int]:
        """Every process running in one of this network's namespaces."""
        found: list[int] = []
        present = _netns_list()
        for ns in self.namespaces():
            if ns in present:
                out = _run(["ip", "netns", "pids", ns], missing_ok=True)
                found += [int(p) for p in out.split()]
        return found

    def down(self) -> None:
        """Remove every namespace, link and rule of this network, even after a crash: the processes still in a
        namespace are killed by PID first (a namespace with a process in it outlives ``ip netns del``)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        present = _netns_list()
        for ns in reversed(self.namespaces()):
            if ns in present:
                _run(["ip", "netns", "del", ns], missing_ok=True)
        _run(["ip", "link", "del", self.host_link], missing_ok=True)
        _run(["nft", "delete", "table", "inet", self.prefix], missing_ok=True)


#: The partitions :meth:`BedNetwork.fault` makes, each a silent drop (never a reset).
FAULTS = {
    "isolate-from-peers": "the node drops its peers (clients and the LB still reach it)",
    "isolate": "the node drops everyone",
    "split": "the minority's nodes drop the majority's",
    "cut-client": "the node drops the client's address (the LB still reaches it)",
    "cut-lb": "the node drops the LB's address",
}


def _drop(addresses: Sequence[str], direction: str) -> tuple[str, ...]:
    rules = []
    for a in addresses:
        if direction in ("both", "in"):
            rules.append(f"input ip saddr {a} drop")
        if direction in ("both", "out"):
            rules.append(f"output ip daddr {a} drop")
    return tuple(rules)


def _drop_all(direction: str) -> tuple[str, ...]:
    return tuple(r for d, r in (("in", 'input iifname != "lo" drop'), ("out", 'output oifname != "lo" drop'))
                 if direction in ("both", d))


def check_prerequisites() -> None:
    """Root, ``ip`` and ``nft``: else :class:`PrerequisiteMissing`, naming what is missing."""
    if os.geteuid() != 0:
        raise PrerequisiteMissing("a namespaced test bed needs root (network namespaces, links and nftables)")
    import shutil

    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") is None:
            raise PrerequisiteMissing(f"a namespaced test bed needs {tool!r}: apt-get install -y {package}")


def _netns_list() -> set[str]:
    out = _run(["ip", "netns", "list"], missing_ok=True)
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _run(cmd: list[str], *, stdin: str | None = None, missing_ok: bool = False) -> str:
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0 and not missing_ok:
        raise TestBedError(f"{' '.join(cmd)} failed (exit {done.returncode}): "
                                  f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or ['no output']}")
    return done.stdout


def parse_listening(table: str) -> set[int]:
    """The ports in state LISTEN in a ``/proc/net/tcp`` (or ``tcp6``) table."""
    ports = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A":
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def listening_ports(netns: str) -> set[int]:
    """The TCP ports something listens on inside network namespace ``netns`` (empty if it is gone)."""
    try:
        out = subprocess.run(["ip", "netns", "exec", netns, "cat", "/proc/net/tcp", "/proc/net/tcp6"],
                             capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return parse_listening(out)


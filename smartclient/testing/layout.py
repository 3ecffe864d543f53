"""Where everything of the test bed lives: node names, ports and directories.

Pure arithmetic, no I/O.  Every port is ``base + slot * 100 + offset``:

* slot 0 holds the round-robin load-balancer listeners, the DNS server and epmd;
* slots 1..3 are the cluster nodes ``rabbit-1..3@localhost``;
* slots 11..16 are the extra independent brokers ``broker-1..6@localhost``;
* slots 20..22 hold the extra LB listeners (``random``, ``source`` and ``random1`` balance);
* slot 23 holds the SNI frontends: one TLS port per protocol, routed to the node the client names in its SNI.

With ``network="namespaces"`` (``SMARTCLIENT_TESTBED_NETWORK=namespaces``) the cluster nodes are
``rabbit-N@scB-nN`` instead, each in a network namespace of its own on its own address (see
:mod:`smartclient.testing.netns`), on the same port numbers; the rest stays on 127.0.0.1.

So a bed spans ``PORT_SPAN`` (2,400) ports, ``[base, base + 2400)``, and two beds side by side need bases at least
2,400 apart: the defaults, 20000 (4.3: 20000-22399) and 23000 (4.0: 23000-25399), are.  With the default base
20000, rabbit-2's stream port is 20252 and the round-robin LB's stream port is 20052.  The default stays below
Linux's ephemeral range (32768-60999): a listener whose port lies inside it can find that port taken by the source
port of some outgoing connection.  :meth:`Layout.port_uses` lists every port, and what it is for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from smartclient._errors import ConfigurationError
from smartclient.testing.netns import BedNetwork

__all__ = [
    "BALANCE_EXPRESSIONS",
    "BALANCE_SLOTS",
    "DEFAULT_PORT_BASE",
    "DEFAULT_RELEASE",
    "NETWORKS",
    "PROTOCOL_OFFSETS",
    "RELEASES",
    "SNI_PROTOCOLS",
    "BrokerSpec",
    "Layout",
    "PortUse",
    "Release",
    "release_named",
]

DEFAULT_PORT_BASE = 20000
#: where the cluster's nodes listen: all on 127.0.0.1 (the default), or each in a network namespace of its own
NETWORKS = ("loopback", "namespaces")


@dataclass(frozen=True)
class Release:
    """A RabbitMQ line the test bed can run: the Debian suite that ships it, debootstrap's script for that
    suite when bookworm's debootstrap has none, and the line's own default port base, so that a bed of
    each line can run at once."""

    line: str
    suite: str
    script: str | None
    default_base: int
    conf: tuple[str, ...] = ()  #: lines of ``rabbitmq.conf`` only this line takes


#: the lines the local test bed provisions; the first is the default
RELEASES: dict[str, Release] = {
    # Debian forky (testing) ships rabbitmq-server 4.3.x on Erlang 29; bookworm's debootstrap has no forky
    # script, and sid's works for it
    # A quorum queue holds the messages of a consumer whose node went down for consumer_disconnected_timeout
    # (rabbit_fifo: 60 s from 4.3; 4.0 has no such setting and returns them at once), in case the node comes
    # back.  The bed's nodes come back within seconds or are killed on purpose: 5 s keeps the MQTT failover
    # tests from waiting a minute on it, and still shows that the messages come back.
    "4.3": Release("4.3", "forky", "/usr/share/debootstrap/scripts/sid", DEFAULT_PORT_BASE,
                   ("consumer_disconnected_timeout = 5000",)),
    # Debian trixie ships 4.0.5 on Erlang 27
    "4.0": Release("4.0", "trixie", None, 23000),
}
DEFAULT_RELEASE = "4.3"
#: every port of the test bed lies in [base, base + PORT_SPAN)
PORT_SPAN = 2400
CLUSTER_SIZE = 3
MAX_EXTRA_BROKERS = 6

#: offset of each listener inside a slot of 100 ports
PROTOCOL_OFFSETS: dict[str, int] = {
    "stream": 52,
    "stream_tls": 51,
    "amqp": 72,
    "amqp_tls": 71,
    "mqtt": 83,
    "mqtt_tls": 82,
    "management": 15,
    "dist": 25,
}
#: LB balance algorithm -> slot of its listeners
BALANCE_SLOTS: dict[str, int] = {"roundrobin": 0, "random": 20, "source": 21, "random1": 22}
#: HAProxy's ``balance`` line for a balance name (``random`` alone is power-of-two-choices, nearly even;
#: ``random1`` draws once, so it spreads unevenly, as a plain random load balancer does)
BALANCE_EXPRESSIONS: dict[str, str] = {"random1": "random(1)"}
LB_PROTOCOLS = ("stream", "stream_tls", "amqp", "mqtt", "mqtt_tls")
#: the TLS listeners the SNI frontends route; their slot
SNI_PROTOCOLS = ("stream_tls", "amqp_tls", "mqtt_tls")
SNI_SLOT = 23


def release_named(line: str) -> Release:
    """The :class:`Release` for ``4.3`` or ``4.0`` (a patch version such as ``4.3.6`` names its line)."""
    key = ".".join(line.strip().split(".")[:2])
    if key not in RELEASES:
        raise ConfigurationError(
            f"SMARTCLIENT_TESTBED_RABBITMQ={line!r} is not a line the test bed provisions; use one of "
            f"{', '.join(RELEASES)}"
        )
    return RELEASES[key]


@dataclass(frozen=True, order=True)
class PortUse:
    """One port the bed listens on, and what for: ``transport`` is ``tcp`` (the DNS server binds ``udp`` too)."""

    port: int
    transport: str
    what: str


@dataclass(frozen=True)
class BrokerSpec:
    """One RabbitMQ node of the test bed: its Erlang node name, the address it listens on, and its ports."""

    name: str  # e.g. "rabbit-1@localhost"
    slot: int
    base: int
    clustered: bool
    host: str = "127.0.0.1"  #: the address its listeners bind (the node's own in a namespaced bed)
    netns: str = ""  #: the network namespace it runs in ("": the host's)

    @property
    def hostname(self) -> str:
        """``localhost``, or the namespaced node's own host name (``sc200-n1``): the host part of its name."""
        return self.name.split("@", 1)[1]

    def port(self, protocol: str) -> int:
        return self.base + self.slot * 100 + PROTOCOL_OFFSETS[protocol]

    @property
    def short(self) -> str:
        """``rabbit-1`` for ``rabbit-1@localhost``: the HAProxy server name and the data directory."""
        return self.name.split("@", 1)[0]

    @property
    def stream_port(self) -> int:
        return self.port("stream")

    @property
    def stream_tls_port(self) -> int:
        return self.port("stream_tls")

    @property
    def tls_name(self) -> str:
        """What the TLS listener advertises: a name only the test bed's DNS server knows, as in a container."""
        return f"{self.short}.smartclient.test"

    @property
    def amqp_port(self) -> int:
        return self.port("amqp")

    @property
    def amqp_tls_port(self) -> int:
        return self.port("amqp_tls")

    @property
    def mqtt_port(self) -> int:
        return self.port("mqtt")

    @property
    def mqtt_tls_port(self) -> int:
        return self.port("mqtt_tls")

    @property
    def management_port(self) -> int:
        return self.port("management")

    @property
    def dist_port(self) -> int:
        return self.port("dist")

    def port_uses(self) -> tuple[PortUse, ...]:
        """Every port the node listens on (its distribution port on every address, the others on 127.0.0.1)."""
        return tuple(PortUse(self.port(p), "tcp", f"the {p} port of {self.name}") for p in PROTOCOL_OFFSETS)


@dataclass(frozen=True)
class Layout:
    """The whole plan: port base, cache directory of the chroot, runtime directory."""

    base: int = DEFAULT_PORT_BASE
    cache_dir: Path = Path("/var/cache/smartclient")
    release: Release = RELEASES[DEFAULT_RELEASE]
    network: str = "loopback"  #: one of NETWORKS
    #: a namespaced bed's nodes may be dialled directly too (not lb-only), for the tests that dial them
    routable: bool = False

    def __post_init__(self) -> None:
        if self.network not in NETWORKS:
            raise ConfigurationError(f"SMARTCLIENT_TESTBED_NETWORK={self.network!r} is not a test-bed network; "
                                     f"use one of {', '.join(NETWORKS)}")
        if self.namespaced:
            BedNetwork(self.base)  # its own checks of the base
        if not 1024 <= self.base <= 65535 - PORT_SPAN:
            raise ConfigurationError(
                f"port base {self.base} is out of range: it must leave room for {PORT_SPAN} ports "
                f"between 1024 and 65535"
            )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Layout:
        """Read ``SMARTCLIENT_TESTBED_RABBITMQ`` (``4.3``, the default, or ``4.0``),
        ``SMARTCLIENT_TESTBED_PORT_BASE`` (by default the line's own: 20000 for 4.3, 23000 for 4.0; a bed spans
        ``PORT_SPAN``, 2,400 ports, from it, so beds side by side need bases at least that far apart),
        ``SMARTCLIENT_TESTBED_NETWORK`` (``loopback``, the default, or ``namespaces``),
        ``SMARTCLIENT_TESTBED_ROUTABLE`` (``1``: a namespaced bed's nodes may be dialled directly too) and
        ``SMARTCLIENT_TESTBED_CACHE``."""
        env = os.environ if environ is None else environ
        release = release_named(env.get("SMARTCLIENT_TESTBED_RABBITMQ") or DEFAULT_RELEASE)
        raw_base = env.get("SMARTCLIENT_TESTBED_PORT_BASE") or str(release.default_base)
        try:
            base = int(raw_base)
        except ValueError:
            raise ConfigurationError(
                f"SMARTCLIENT_TESTBED_PORT_BASE={raw_base!r} is not a whole number"
            ) from None
        cache = Path(env.get("SMARTCLIENT_TESTBED_CACHE", "/var/cache/smartclient"))
        network = env.get("SMARTCLIENT_TESTBED_NETWORK") or "loopback"
        flag = (env.get("SMARTCLIENT_TESTBED_ROUTABLE") or "").strip().lower()
        if flag not in ("", "0", "1", "no", "yes", "false", "true"):
            raise ConfigurationError(f"SMARTCLIENT_TESTBED_ROUTABLE={flag!r} is not a flag: use 1 or 0")
        return cls(base=base, cache_dir=cache, release=release, network=network,
                   routable=flag in ("1", "yes", "true"))

    @property
    def namespaced(self) -> bool:
        return self.network == "namespaces"

    @property
    def bed_network(self) -> BedNetwork:
        """The namespaced bed's private network (its names and addresses follow the port base)."""
        return BedNetwork(self.base, routable=self.routable)

    def overlaps(self, low: int, high: int) -> bool:
        """True if any port of the plan may fall in ``[low, high]``."""
        return self.base <= high and low < self.base + PORT_SPAN

    # -- the chroot and where the nodes keep their data -------------------------------
    @property
    def chroot(self) -> Path:
        return self.cache_dir / f"rabbitmq-{self.release.line}-{self.release.suite}"

    #: runtime directory, as seen from inside the chroot
    inner_run_dir = Path("/srv/smartclient-testbed")

    @property
    def run_dir(self) -> Path:
        """The runtime directory as seen from the host (inside the chroot)."""
        return self.chroot / str(self.inner_run_dir).lstrip("/") / self._run_name

    @property
    def inner_base_dir(self) -> Path:
        return self.inner_run_dir / self._run_name

    @property
    def _run_name(self) -> str:  # a namespaced bed's nodes have other names: their data lives apart
        return f"{self.base}-ns" if self.namespaced else str(self.base)

    # -- brokers -----------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[BrokerSpec, ...]:
        if self.namespaced:
            net = self.bed_network
            return tuple(
                BrokerSpec(f"rabbit-{i}@{net.namespace(i)}", slot=i, base=self.base, clustered=True,
                           host=net.address(i), netns=net.namespace(i))
                for i in range(1, CLUSTER_SIZE + 1)
            )
        return tuple(
            BrokerSpec(f"rabbit-{i}@localhost", slot=i, base=self.base, clustered=True)
            for i in range(1, CLUSTER_SIZE + 1)
        )

    def extra_broker(self, index: int) -> BrokerSpec:
        if not 1 <= index <= MAX_EXTRA_BROKERS:
            raise ConfigurationError(
                f"extra broker index {index} is out of range 1..{MAX_EXTRA_BROKERS}"
            )
        return BrokerSpec(f"broker-{index}@localhost", slot=10 + index, base=self.base, clustered=False)

    def node(self, name: str) -> BrokerSpec:
        """Find a cluster node or extra broker by ``rabbit-2``, its full name (``rabbit-2@localhost``) or
        ``broker-1``."""
        candidates = list(self.nodes) + [self.extra_broker(i) for i in range(1, MAX_EXTRA_BROKERS + 1)]
        for spec in candidates:
            if name in (spec.name, spec.short):
                return spec
        known = ", ".join(s.short for s in candidates)
        raise ConfigurationError(f"unknown test-bed node {name!r}; known nodes: {known}")

    # -- shared services ---------------------------------------------------------------
    @property
    def epmd_port(self) -> int:
        return self.base + 43

    @property
    def dns_port(self) -> int:
        return self.base + 53

    def lb_port(self, protocol: str, balance: str = "roundrobin") -> int:
        if protocol not in LB_PROTOCOLS:
            raise ConfigurationError(f"no LB listener for protocol {protocol!r}; use one of {LB_PROTOCOLS}")
        if balance not in BALANCE_SLOTS:
            raise ConfigurationError(
                f"unsupported LB balance {balance!r}; use one of {tuple(BALANCE_SLOTS)}"
            )
        return self.base + BALANCE_SLOTS[balance] * 100 + PROTOCOL_OFFSETS[protocol]

    def sni_port(self, protocol: str) -> int:
        """The SNI frontend's port for ``stream_tls``, ``amqp_tls`` or ``mqtt_tls``."""
        if protocol not in SNI_PROTOCOLS:
            raise ConfigurationError(f"no SNI frontend for protocol {protocol!r}; use one of {SNI_PROTOCOLS}")
        return self.base + SNI_SLOT * 100 + PROTOCOL_OFFSETS[protocol]

    def port_uses(self) -> tuple[PortUse, ...]:
        """Every port the bed may listen on, in port order: epmd, the DNS server (TCP and UDP), every LB listener
        (those started on demand too), the SNI frontends, and every port of the cluster's nodes and of the extra
        brokers (started on demand).  HAProxy's admin socket is a Unix socket: no port."""
        uses = [PortUse(self.epmd_port, "tcp", "the nodes' epmd"),
                PortUse(self.dns_port, "tcp", "the DNS server"), PortUse(self.dns_port, "udp", "the DNS server")]
        uses += [PortUse(self.lb_port(p, b), "tcp", f"the {p}_{b} LB listener")
                 for b in BALANCE_SLOTS for p in LB_PROTOCOLS]
        uses += [PortUse(self.sni_port(p), "tcp", f"the {p} SNI frontend") for p in SNI_PROTOCOLS]
        brokers = [*self.nodes, *(self.extra_broker(i) for i in range(1, MAX_EXTRA_BROKERS + 1))]
        uses += [use for spec in brokers for use in spec.port_uses()]
        return tuple(sorted(uses))

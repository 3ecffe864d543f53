"""The ``smartclient`` command: where connections land, read in a terminal.

    smartclient topology orders payments          # leader and replicas, advertised and dialled
    smartclient probe --via lb:5552 -n 30         # which nodes a load balancer reaches, how often
    smartclient place orders                      # where a producer and a consumer land now, and why
    smartclient bench publish                     # run bench/publish.py with a progress display
    smartclient top --metrics http://svc:9464/metrics   # a live view of a service's smartclient metrics

Every subcommand reads the same settings: ``--uri`` (or ``SMARTCLIENT_URI``), a resolver from ``--lb``
(``SMARTCLIENT_LB``), ``--dns`` (``SMARTCLIENT_DNS``, ``host:port`` of a nameserver) or ``--map
advertised=dialled`` (repeatable), and ``--management`` (``SMARTCLIENT_MANAGEMENT``) where needed.
Without ``--uri`` or ``SMARTCLIENT_URI``, the entry point is the address that ``--via`` (probe) or
``--lb`` names, else ``localhost:5552``, with the default credentials guest/guest.  ``probe`` always
dials ``--via``, with the user, password, vhost and TLS of the URI when one is given.
Needs ``pip install 'smartclient[cli]'`` (rich).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from smartclient._errors import SmartClientError
from smartclient.core.address import Address
from smartclient.core.settings import ConnectionOptions
from smartclient.core.topology import Candidates, PlacementPolicy, Role

__all__ = ["main"]

DEFAULT_URI = "rabbitmq-stream://guest:guest@localhost:5552/"


def _console() -> Any:
    try:
        from rich.console import Console
    except ImportError:  # pragma: no cover - depends on the extras installed
        sys.exit("the smartclient command needs rich: pip install 'smartclient[cli]'")
    return Console()


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--uri", default=os.environ.get("SMARTCLIENT_URI") or None,
                        help="entry point, rabbitmq-stream[+tls]://user:pass@host:port/vhost (SMARTCLIENT_URI); "
                             "default: the --via or --lb address, else localhost:5552, as guest/guest")
    common.add_argument("--lb", default=os.environ.get("SMARTCLIENT_LB"),
                        help="dial every node through this load balancer, host:port (SMARTCLIENT_LB)")
    common.add_argument("--dns", default=os.environ.get("SMARTCLIENT_DNS"),
                        help="resolve advertised names with this nameserver, host:port (SMARTCLIENT_DNS)")
    common.add_argument("--map", action="append", default=[], metavar="ADVERTISED=DIALLED",
                        help="static remap of an advertised host[:port] (repeatable)")
    common.add_argument("--management", default=os.environ.get("SMARTCLIENT_MANAGEMENT"),
                        help="management API URL (SMARTCLIENT_MANAGEMENT)")
    parser = argparse.ArgumentParser(prog="smartclient", description="Where RabbitMQ connections land.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("topology", parents=[common], help="each stream's leader and replicas")
    p.add_argument("streams", nargs="+")
    p = sub.add_parser("probe", parents=[common], help="which nodes a load balancer reaches")
    p.add_argument("--via", required=True, help="the load balancer's stream address, host:port")
    p.add_argument("-n", "--connections", type=int, default=30)
    p = sub.add_parser("place", parents=[common], help="where a producer and a consumer of a stream land")
    p.add_argument("stream")
    p.add_argument("--force-leader-for-producers", action=argparse.BooleanOptionalAction, default=True,
                   help="the PlacementPolicy: producers only on the leader (default), or on any member as a fallback")
    p.add_argument("--force-replica-for-consumers", action=argparse.BooleanOptionalAction, default=False,
                   help="the PlacementPolicy: consumers only on replicas, or the leader as a fallback (default)")
    p = sub.add_parser("bench", parents=[common], help="run a benchmark script with a progress display")
    p.add_argument("name", help="a script of bench/, without .py (e.g. publish, failover, mqtt_fleet)")
    p = sub.add_parser("top", help="a live view of a service's smartclient metrics (its Prometheus endpoint)")
    p.add_argument("--metrics", default=os.environ.get("SMARTCLIENT_METRICS", "http://localhost:9464/metrics"),
                   help="the service's Prometheus endpoint (SMARTCLIENT_METRICS; default http://localhost:9464/metrics)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
    p.add_argument("--once", action="store_true", help="poll twice, print one frame and exit (no terminal codes)")
    return parser


def _resolver(args: argparse.Namespace) -> Any:
    from resolvers import Chain, DnsResolver, Identity, LoadBalancer, StaticMap

    parts: list[Any] = []
    if args.map:
        mapping: dict[str, str] = {}
        for item in args.map:
            if "=" not in item:
                raise SystemExit(f"--map {item!r}: write ADVERTISED=DIALLED")
            left, right = item.split("=", 1)
            mapping[left] = right
        parts.append(StaticMap(mapping))
    if args.dns:
        nameserver = Address.parse(args.dns, default_port=53)
        parts.append(DnsResolver([nameserver.host], port=nameserver.port))
    if args.lb:
        parts.append(LoadBalancer(Address.parse(args.lb, default_port=5552)))
    if not parts:
        return Identity()
    return parts[0] if len(parts) == 1 else Chain(*parts)


def _entry_uri(args: argparse.Namespace) -> str:
    """The entry point: ``--uri`` (or ``SMARTCLIENT_URI``); else the ``--via`` or ``--lb`` address as
    guest/guest, so that ``probe --via lb:5552`` or ``topology s --lb lb:5552`` is enough on its own."""
    if args.uri:
        return str(args.uri)
    for option in ("via", "lb"):
        value = getattr(args, option, None)
        if value:
            address = Address.parse(value, default_port=5552)
            return f"rabbitmq-stream://guest:guest@{address}/"
    return DEFAULT_URI


def _policy(args: argparse.Namespace) -> PlacementPolicy:
    return PlacementPolicy(force_leader_for_producers=getattr(args, "force_leader_for_producers", True),
                           force_replica_for_consumers=getattr(args, "force_replica_for_consumers", False))


def _environment(args: argparse.Namespace) -> Any:
    from smartclient.environment import Environment

    return Environment(_entry_uri(args), resolver=_resolver(args), placement=_policy(args),
                       connection=ConnectionOptions(name="smartclient-cli"))


def _as_wanted(candidates: Candidates, node: Address) -> str:
    """How the library's own placement decision judges where a connection landed: its candidates, tier by tier."""
    tier = candidates.tier_of(node)
    if tier == 0:
        return "[green]yes[/green]"
    if tier is not None:
        return f"[yellow]fallback (tier {tier})[/yellow]"
    return "[red]no: not a candidate[/red]"


def _probe_environment(args: argparse.Namespace, lb: Address) -> Any:
    """An Environment whose one entry point is the LB under test: the URI (if any) gives only the user,
    password, vhost and TLS."""
    from resolvers import Identity
    from smartclient.core.settings import parse_stream_uri
    from smartclient.environment import Environment

    uri = parse_stream_uri(_entry_uri(args))
    return Environment(f"rabbitmq-stream{'+tls' if uri.tls else ''}://{lb}/", credentials=uri.credentials,
                       vhost=uri.vhost, resolver=Identity(), connection=ConnectionOptions(name="smartclient-probe"))


async def _topology(args: argparse.Namespace, console: Any) -> int:
    from rich.table import Table

    table = Table(title="stream topology", header_style="bold")
    for column in ("stream", "role", "advertised", "dialled"):
        table.add_column(column)
    async with _environment(args) as env:
        for stream in args.streams:
            topo = await env.topology(stream)
            for role, node in [("leader", topo.leader), *(("replica", r) for r in topo.replicas)]:
                dialled = await env.streams.connector.resolve(node)
                style = "green" if role == "leader" else None
                table.add_row(stream, role, str(node), str(dialled) + ("" if dialled != node else " (same)"),
                              style=style)
            table.add_section()
    console.print(table)
    return 0


async def _probe(args: argparse.Namespace, console: Any) -> int:
    from rich.progress import Progress
    from rich.table import Table

    lb = Address.parse(args.via, default_port=5552)
    reached: Counter[Address] = Counter()
    failures: list[str] = []
    async with _probe_environment(args, lb) as env:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"connecting through {lb}", total=args.connections)
            for _ in range(args.connections):
                try:
                    conn = await env.streams.connector.dial(lb, f"smartclient-probe-{uuid.uuid4().hex[:6]}")
                    reached[conn.node] += 1
                    await env.streams.connector.close_connection(conn)
                except SmartClientError as exc:
                    failures.append(str(exc))
                progress.advance(task)
    table = Table(title=f"{args.connections} connections through {lb}", header_style="bold")
    table.add_column("node reached (advertised)")
    table.add_column("connections", justify="right")
    table.add_column("share", justify="right")
    for node, count in reached.most_common():
        table.add_row(str(node), str(count), f"{100 * count / args.connections:.0f}%")
    if failures:
        table.add_row("[red]failed[/red]", str(len(failures)), f"{100 * len(failures) / args.connections:.0f}%")
    console.print(table)
    if len(reached) == 1 and sum(reached.values()) >= 3:
        console.print(f"[bold yellow]warning:[/] every connection reached {next(iter(reached))}: the load balancer "
                      f"looks sticky (balance source, or persistence), or has one backend. Placement through it "
                      f"can only reach that node.")
    elif reached and max(reached.values()) > 2 * min(reached.values()):
        console.print("[yellow]uneven:[/] some nodes are reached much more often than others")
    for failure in failures[:3]:
        console.print(f"[red]{failure}[/red]")
    return 0 if reached else 1


async def _place(args: argparse.Namespace, console: Any) -> int:
    from rich.table import Table

    policy = _policy(args)
    async with _environment(args) as env:
        # the Environment's own decision, under the policy given: each role's candidates before it is placed
        candidates = {role: await env.streams.candidates(args.stream, role) for role in (Role.PRODUCER, Role.CONSUMER)}
        started = time.monotonic()
        producer = await env.producer(args.stream)
        consumer = await env.consumer(args.stream, lambda message, context: None, offset="next")
        seconds = time.monotonic() - started
        table = Table(title=f"placement of {args.stream} ({seconds:.2f} s)", header_style="bold")
        for column in ("role", "node (reported)", "dialled", "as wanted"):
            table.add_column(column)
        for record in env.placements():
            table.add_row(record.role.value, str(record.node), str(record.dialled),
                          _as_wanted(candidates[record.role], record.node))
        await consumer.close()
        await producer.close()
    console.print(table)
    console.print(f"policy: force_leader_for_producers={policy.force_leader_for_producers}, "
                  f"force_replica_for_consumers={policy.force_replica_for_consumers}", highlight=False)
    for role, tiers in candidates.items():
        console.print(f"candidates of the {role.value}, tier by tier: {tiers}", highlight=False, markup=False,
                      soft_wrap=True)
    return 0


def _bench(args: argparse.Namespace, console: Any) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    script = Path("bench") / f"{args.name}.py"
    if not script.exists():
        available = sorted(p.stem for p in Path("bench").glob("*.py"))
        console.print(f"[red]no bench/{args.name}.py here[/red] (run from the repository root; have: {available})")
        return 2
    env = {**os.environ, "SMARTCLIENT_URI": _entry_uri(args)}
    lines: list[str] = []
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), TimeElapsedColumn(),
                  TextColumn("{task.fields[last]}"), console=console) as progress:
        task = progress.add_task(f"bench {args.name}", total=None, last="")
        with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip()
                lines.append(line)
                progress.console.print(f"  {line}", markup=False, highlight=False)
                progress.update(task, last=line[-60:])
            code = proc.wait()
    verdict = lines[-1] if lines else ""
    style = "green" if verdict.endswith("PASS") else "red"
    console.print(f"[bold {style}]{verdict}[/]")
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "top":  # plain text: no rich needed
        from smartclient.top import run

        try:
            return run(args.metrics, args.interval, args.once)
        except SmartClientError as exc:
            print(f"smartclient top: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
    console = _console()
    try:
        if args.command == "bench":
            return _bench(args, console)
        runner = {"topology": _topology, "probe": _probe, "place": _place}[args.command]
        return asyncio.run(runner(args, console))
    except SmartClientError as exc:
        console.print(f"[bold red]{type(exc).__name__}:[/] {exc}")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""bench/placement_cost.py: what one placement decision costs, without I/O, from 1,000 to 1,000,000 handles.

The stream wing's own placement (``StreamPlacement``, its ``TopologyCache`` and the core's ``Placement`` loop
behind the real ``StreamConnector``) is driven with fakes: a network of 100 nodes where every dial reaches the
node it aims at, 100,000 streams (a leader and two replicas each, spread round the nodes, cached as the broker
would have answered), and producers and consumers placed one after another up to 1,000,000 handles (ten per
stream; producers and consumers in turn, a carrier per role and round of the streams).  Each handle takes a
publisher or subscription id on its connection, as the rstream seam does, so connections fill up to
``PoolLimits.max_streams_per_connection`` and new ones are dialled (by the fake) as they would be.

Every placement is timed.  At 1,000, 10,000, 100,000 and 1,000,000 handles it gives the mean of the next 1,000
placements that share a connection (the marginal cost at that size: what the 1,001st or the 1,000,001st handle
pays), that of the placements that dialled a connection since the last checkpoint (one in 200 at scale), and the
pure decision alone (the candidates of a random
stream and a look for a shared connection with room, 10,000 times); then, on probes of their own under
tracemalloc, the memory each keeps; and the RSS per handle so far.  Last, the loss of one node at 1,000,000
handles: every connection to it closes, and the time the placement's bookkeeping takes for all of them.

Anchor: the 1,000-handle figures of the same run.  Target: a placement at 1,000,000 handles, sharing or dialling,
costs at most 1.5x what it costs at 1,000.

Run from the repository root (no test bed needed): python bench/placement_cost.py [--handles 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import resource
import statistics
import sys
import time
import tracemalloc
from types import SimpleNamespace
from typing import Any

from smartclient import Address, RetryPolicy, StreamTopology
from smartclient.core.recovery import RecoveryPolicy
from smartclient.core.settings import Credentials, PoolLimits
from smartclient.core.topology import PlacementPolicy, Role
from smartclient.options import ClientSettings
from smartclient.resolution import Resolution
from smartclient.stream.connector import StreamConnector
from smartclient.stream.host import Connection
from smartclient.stream.placement import StreamPlacement
from smartclient.stream.topology_cache import TopologyCache

NODES = 100
STREAMS = 100_000
PER_STREAM = 10  # handles per stream at the full count (so 1,000,000)
PROBE = 1_000
DECISIONS = 10_000
TARGET = 1.5
CHECKPOINTS = (1_000, 10_000, 100_000, 1_000_000)


class FakeClient:
    """What the placement touches of an rstream client."""

    def __init__(self) -> None:
        self.closed = False
        self.streams = 0

    def is_connection_alive(self) -> bool:
        return not self.closed

    def add_handler(self, frame: Any, handler: Any, name: str) -> None:
        pass

    def add_stream(self, stream: str) -> None:
        self.streams += 1

    async def close(self) -> None:
        self.closed = True


class FakeConnector(StreamConnector):
    """The real stream shell; a dial reaches the node it aims at, at once."""

    def __init__(self) -> None:
        super().__init__(ClientSettings(Credentials(), "/", None), Resolution(None),
                         retry=RetryPolicy(backoff_initial=0.0, backoff_max=0.0), limits=PoolLimits(idle_timeout=60))
        self.dials = 0

    async def dial(self, target: Address, name: str, client_class: Any = None) -> Connection:
        self.dials += 1
        conn = Connection(FakeClient(), target, target, f"{name}-{self.dials}",
                          max_ids=self.limits.max_streams_per_connection)
        self.connections.add(conn)
        return conn


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Fleet:
    """The placement under test, its topologies, and the handles placed so far."""

    def __init__(self) -> None:
        nodes = [Address(f"node-{i}.bench", 5552) for i in range(NODES)]
        self.connector = FakeConnector()
        self.topologies = TopologyCache(self.connector, (), None, "bench", 1e12, PlacementPolicy(), RetryPolicy())
        for s in range(STREAMS):
            self.topologies._keep(StreamTopology(f"s{s}", nodes[s % NODES],
                                                 (nodes[(s + 1) % NODES], nodes[(s + 2) % NODES])))
        self.placement = StreamPlacement(self.connector, self.topologies, RetryPolicy(), RecoveryPolicy(), "bench")
        self.pools: dict[int, Any] = {}
        self.placed = 0

    def pool(self, key: int) -> Any:
        if key not in self.pools:
            role = Role.PRODUCER if key % 2 == 0 else Role.CONSUMER
            self.pools[key] = SimpleNamespace(role=role, carrier=object(), names={}, apart=())
        return self.pools[key]

    async def place(self, count: int) -> list[tuple[float, bool]]:
        """Place the next ``count`` handles: each one's seconds, and whether it dialled."""
        times: list[tuple[float, bool]] = []
        clock, placement = time.perf_counter, self.placement
        for index in range(self.placed, self.placed + count):
            # producers and consumers in turn; a carrier per role and round of the streams (one handle per stream)
            pair = index // 2
            pool = self.pool(pair // STREAMS * 2 + index % 2)
            dials, began = self.connector.dials, clock()
            conn = await placement.place(pool, f"s{pair % STREAMS}", None)
            times.append((clock() - began, self.connector.dials > dials))
            conn.take_id()  # the seam takes its publisher or subscription id on it
        self.placed += count
        return times

    async def decide(self, count: int, rng: random.Random) -> float:
        """``count`` pure decisions: a random stream's candidates and a shared connection with room for it."""
        streams = [f"s{rng.randrange(STREAMS)}" for _ in range(count)]
        began = time.perf_counter()
        for i, stream in enumerate(streams):
            role = Role.PRODUCER if i % 2 == 0 else Role.CONSUMER
            candidates = await self.topologies.candidates(stream, role, self.placement.consumer_load(stream))
            self.placement.shared[(role, False)].take(candidates.tiers[0])
        return time.perf_counter() - began

    async def lose_node(self, node: Address) -> tuple[int, float]:
        """Every connection to ``node`` closes: how many, and the seconds the bookkeeping took for all."""
        closing = [c for c in self.connector.connections if c.node == node]
        began = time.perf_counter()
        for conn in closing:
            conn.client.closed = conn.closed = True
            await self.placement.on_connection_closed(conn, None)
        return len(closing), time.perf_counter() - began


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--handles", type=int, default=CHECKPOINTS[-1], help="the largest count (1000000)")
    args = parser.parse_args()
    checkpoints = [c for c in CHECKPOINTS if c <= args.handles] or [args.handles]
    rng = random.Random(7)
    fleet = Fleet()
    print(f"{NODES} nodes, {STREAMS:,} streams (topologies cached), handles to {checkpoints[-1]:,}; "
          f"a connection holds {fleet.connector.limits.max_streams_per_connection} streams")
    print(f"{'handles':>10} {'share µs':>9} {'dial µs':>8} {'B/place':>8} {'decide µs':>10} {'B/decide':>9} "
          f"{'conns':>7} {'RSS MiB':>8} {'KiB/handle':>10}")
    rss0 = rss_mib()
    rows: dict[int, tuple[float, float, float]] = {}
    for target in checkpoints:
        gc.collect()
        times = await fleet.place(target - fleet.placed)
        times += await fleet.place(PROBE)
        # a placement that shares a connection: the next 1,000's; one that dials: those since the last checkpoint
        shared = [t for t, dialled in times[-PROBE:] if not dialled] or [float("nan")]
        dialled = [t for t, dialled in times if dialled]
        decide_s = await fleet.decide(DECISIONS, rng)
        # the memory: on probes of their own (tracemalloc slows what it traces several times over)
        tracemalloc.start()
        await fleet.place(PROBE)
        place_b = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        tracemalloc.start()
        await fleet.decide(DECISIONS, rng)
        decide_b = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        rss = rss_mib()
        dial_us = statistics.fmean(dialled) * 1e6 if dialled else float("nan")
        rows[target] = (statistics.fmean(shared) * 1e6, dial_us, decide_s / DECISIONS * 1e6)
        print(f"{target:>10,} {rows[target][0]:>9.1f} {rows[target][1]:>8.0f} {place_b / PROBE:>8.0f} "
              f"{rows[target][2]:>10.1f} {decide_b / DECISIONS:>9.0f} {len(fleet.connector.connections):>7,} "
              f"{rss:>8.0f} {(rss - rss0) * 1024 / fleet.placed:>10.2f}   ({len(dialled)} dials)")
    lost, lose_s = await fleet.lose_node(Address("node-0.bench", 5552))
    print(f"a node lost at {fleet.placed:,} handles: {lost} connections closed, their bookkeeping "
          f"{lose_s * 1e3:.1f} ms in all ({lose_s / max(lost, 1) * 1e6:.0f} µs each)")
    minimum = -(-fleet.placed // fleet.connector.limits.max_streams_per_connection)
    print(f"connections {len(fleet.connector.connections) + lost:,} before the loss, against a floor of "
          f"{minimum:,} (handles / per-connection cap; each node and role fills its own)")
    first, last = rows[checkpoints[0]], rows[checkpoints[-1]]
    shares, dials, decides = (last[i] / first[i] for i in range(3))
    print(f"at {checkpoints[-1]:,} / at {checkpoints[0]:,} handles: a placement that shares {shares:.2f}, one that "
          f"dials {dials:.2f}, the decision alone {decides:.2f}")
    ratio = max(shares, dials) if dials == dials else float("nan")  # (nan: no dial at one end)
    verdict = "PASS" if ratio <= TARGET else "MISS"  # (nan compares false: MISS)
    print(f"placement_cost: growth_1M_over_1k={ratio:.2f} target <= {TARGET} {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

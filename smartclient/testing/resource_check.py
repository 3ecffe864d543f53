"""The soak's judgement of its resource samples (pure): each count must come back to its baseline after every
rollout, within a slack for what follows the leaders; RSS must grow less than a share.  See
:mod:`smartclient.testing.soak`."""

from __future__ import annotations

import itertools
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FIXED", "IN_FLIGHT", "PER_NODE", "REFILLED", "UNJUDGED", "ResourceReport", "check_resources", "slack"]

#: what depends on where the leaders and replicas are (they move at each rollout), per node of the cluster: a
#: connection per node and role, and what each connection holds (descriptors, tasks, frame handlers), and the
#: topologies a lost node invalidated, read again when next needed
PER_NODE = {"connections": 2, "shared connections": 2, "connection forwards": 2, "file descriptors": 4,
            "asyncio tasks": 8, "client tasks": 6, "client handlers": 10, "metric smartclient.connections": 2,
            "metric attribute sets": 12, "metadata cache entries": 1, "dialled targets": 2,
            # the management API's pooled HTTP connections (placers, RPC) that the broker closed while idle: httpx
            # drops each at its next use, so they are bounded by its pool
            "half-closed sockets": 1}
#: what may settle this much higher whatever the cluster: the event loop's default executor grows to its cap
#: (``min(32, cores + 4)`` threads) in a burst of reconnects, and keeps its threads
FIXED = {"threads": min(32, (os.cpu_count() or 1) + 4)}
#: shown, not judged: parked connections come and go with each placement through the LB (those past their idle
#: time are judged), the reaper with them, and each instrument's sets are judged in their total
UNJUDGED = ("parked connections", "reaper running", "rss kib", "connections parked twice (events)",
            "stale parking entries (events)", "malloc in use kib", "malloc free kept kib", "python blocks")


#: what is in flight at any moment under load: never compared with one baseline sample, only judged growing
IN_FLIGHT = ("pending confirms", "confirm waiters", "client waiters", "metadata reads in flight")
#: what a fault empties and use fills again, judged from the larger of its first sample and its baseline: a
#: baseline taken just after a fault is not its level (CI, seed 18: 6 of 11 metadata cache entries)
REFILLED = ("metadata cache entries",)


def slack(name: str, nodes: int) -> int | None:
    """How far above its baseline ``name`` may settle after a rollout (None: not judged)."""
    if name in IN_FLIGHT:
        return 1 << 30  # (the trend rule still judges it)
    if name in UNJUDGED or (name.startswith("metric ") and name != "metric attribute sets"
                            and name != "metric smartclient.connections"):
        return None
    return PER_NODE.get(name, 0) * nodes + FIXED.get(name, 0)



@dataclass
class ResourceReport:
    baseline: dict[str, int]
    start: dict[str, int]
    peak: dict[str, int]
    end: dict[str, int]
    #: name -> the rollouts (by start t, or "end") after which it never came back to its baseline, or "growing"
    #: when its lowest value rose from each settled window to the next (3 or more): a leak under the slack
    not_back: dict[str, list[str]] = field(default_factory=dict)
    rss_growth: float = 0.0  # judged: from the first settled sample after the first rollout to the end
    rss_baseline: int = 0  # (KiB)
    rss_growth_since_warmup: float = 0.0  # shown: from the baseline at the end of the warm-up
    #: shown: the lowest RSS (KiB) in each rollout's settled window.  RSS swings with each full garbage collection
    #: (by 8 MiB, a tenth of it, in a 2-hour run), so one sample at the end may land high or low on that swing;
    #: the lows are what stays
    rss_lows: list[int] = field(default_factory=list)
    samples: int = 0
    unjudged: list[str] = field(default_factory=list)  # rollouts with no settled sample after them

    def flat(self, limit: float) -> bool:
        return self.samples > 0 and not self.not_back and not self.unjudged and self.rss_growth < limit

    def table(self) -> str:
        names = sorted(set(self.start) | set(self.end))
        width = max((len(n) for n in names), default=10)
        lines = [f"  {'resource':<{width}}  {'start':>9}  {'baseline':>9}  {'peak':>9}  {'end':>9}"]
        for name in names:
            flag = f"  NOT BACK after {', '.join(self.not_back[name])}" if name in self.not_back else ""
            lines.append(f"  {name:<{width}}  {self.start.get(name, 0):>9}  {self.baseline.get(name, 0):>9}  "
                         f"{self.peak.get(name, 0):>9}  {self.end.get(name, 0):>9}{flag}")
        return "\n".join(lines)


def check_resources(records: Iterable[Mapping[str, Any]], warmup: float, settle: float,
                    nodes: int = 3) -> ResourceReport:
    """Judge the ``resources`` samples of a history against its ``rollout`` records (pure): a count is back when
    some sample after the rollout has settled is at or below its baseline (plus its :func:`slack` for ``nodes``
    nodes, for what follows the leaders)."""
    samples = [(float(r["t"]), dict(r["values"]), bool(r.get("rolling"))) for r in records
               if r.get("kind") == "resources"]
    spans = [(float(r["began"]), float(r["t"])) for r in records if r.get("kind") == "rollout"]
    if not samples:
        return ResourceReport({}, {}, {}, {})
    settled = [s for s in samples if s[0] >= warmup and not s[2]]
    base_t, baseline, _ = settled[0] if settled else samples[0]
    names = sorted({k for _, values, _ in samples for k in values})
    peak = {n: max(v.get(n, 0) for _, v, _ in samples) for n in names}
    report = ResourceReport(baseline, samples[0][1], peak, samples[-1][1], samples=len(samples))
    windows: list[tuple[str, float, float]] = []
    for i, (began, ended) in enumerate(spans):
        if ended < base_t:
            continue
        until = spans[i + 1][0] if i + 1 < len(spans) else math.inf
        windows.append((f"the rollout at {began:.0f} s", ended + settle, until))
    windows.append(("the end", max([base_t, *(e + settle for _, e in spans)]), math.inf))
    lows: dict[str, list[int]] = defaultdict(list)  # name -> its lowest value in each settled window
    for label, since, until in windows:
        judged = [v for t, v, rolling in samples if since <= t < until and not rolling]
        if not judged:
            report.unjudged.append(label)
            continue
        if label != "the end" and all("rss kib" in v for v in judged):
            report.rss_lows.append(min(v["rss kib"] for v in judged))
        for name in names:
            allowed = slack(name, nodes)
            if allowed is None:
                continue
            low = min(v.get(name, 0) for v in judged)
            if label != "the end":  # (the end's window is the last rollout's, again)
                lows[name].append(low)
            base = baseline.get(name, 0)
            if name in REFILLED:
                base = max(base, report.start.get(name, 0))
            if low > base + allowed:
                report.not_back.setdefault(name, []).append(label)
    for name, values in lows.items():
        if len(values) >= 3 and all(b > a for a, b in itertools.pairwise(values)):
            report.not_back.setdefault(name, []).append("growing")
    # RSS from the first settled sample after the first rollout judged: by then every path has run once (failover,
    # a certificate rotation, the modules imported on first use, the allocator's arenas of each thread); it is
    # also given from the warm-up's baseline
    first = next((since for label, since, _ in windows if label != "the end"), base_t)
    rss_base = next((v for t, v, rolling in samples if t >= first and not rolling), baseline).get("rss kib", 0)
    end_rss = samples[-1][1].get("rss kib", 0)
    if rss_base and baseline.get("rss kib"):
        report.rss_baseline = rss_base
        report.rss_growth = end_rss / rss_base - 1
        report.rss_growth_since_warmup = end_rss / baseline["rss kib"] - 1
    return report

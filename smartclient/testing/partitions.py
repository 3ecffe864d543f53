"""The namespaced bed's partitions, as test bed faults (issue 55): each a silent drop inside a node's namespace
(:mod:`smartclient.testing.netns`), never a reset; ``heal()`` removes every one."""

from __future__ import annotations

from collections.abc import Sequence

from smartclient._errors import FaultUnavailable
from smartclient.testing.layout import Layout
from smartclient.testing.netns import FAULTS, Fault

__all__ = ["FAULTS", "PartitionableBed"]


class PartitionableBed:
    """What a local bed adds for partitions; only a namespaced one can make them."""

    layout: Layout

    def partition(self, what: str, node: str, *, minority: Sequence[str] = (), direction: str = "both") -> Fault:
        """Cut ``node`` (a name, short or full) silently, as ``what`` says (:data:`FAULTS`): ``isolate-from-peers``,
        ``isolate``, ``split`` (``minority``'s nodes, by default ``node`` alone, from the rest), ``cut-client`` or
        ``cut-lb``; ``direction`` ``in`` or ``out`` drops one way only.  Several add up; ``heal()`` ends them all.

        :raises FaultUnavailable: the bed's nodes share the loopback address (no namespaces to cut between).
        :raises ConfigurationError: no such partition, node or direction, or a minority that is not one.
        """
        if not self.layout.namespaced:
            raise FaultUnavailable(f"a partition ({what}) needs the namespaced bed: bring it up with `python -m "
                                   f"smartclient.testing up --network namespaces` (SMARTCLIENT_TESTBED_NETWORK)")
        net = self.layout.bed_network
        fault = net.fault(what, self.layout.node(node).slot, minority=[self.layout.node(n).slot for n in minority],
                          direction=direction)
        net.apply(fault)
        return fault

    def heal_partitions(self) -> None:
        """Remove every partition (nothing to do on a loopback bed)."""
        if self.layout.namespaced and self.layout.bed_network.exists():
            self.layout.bed_network.heal()

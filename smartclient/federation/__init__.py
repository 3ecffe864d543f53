"""Federation: topologies and their exactly-once ``max_hops`` (pure, :mod:`.topology`), and applying them
to brokers through the management API (:mod:`.apply`)."""

from smartclient.federation.apply import ApplyReport, LinkStatus, apply, remove, status, wait_running
from smartclient.federation.topology import *  # noqa: F403
from smartclient.federation.topology import __all__ as _topology_names

__all__ = ["ApplyReport", "LinkStatus", "apply", "remove", "status", "wait_running", *_topology_names]

"""Streams laid out on purpose: leaders on chosen nodes, for tests and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from smartclient._errors import TestBedError
from smartclient.core.address import Address
from smartclient.testing.testbed import TestBed

__all__ = ["Held", "coordinator_leader", "create_stream_led_by", "delete_streams", "hold_coordinator", "hold_member",
           "raw_stream_client", "stream_members"]

# hold the process PID (an expression) on this node for HOLDMS ms: suspended by a process of its own, which lets it
# go or kills it after that (the suspension also ends if that process dies); a member's reader context out of
# osiris' cache meanwhile if UNCACHE.  Prints the pid and when the hold ends (the node's clock, ms since the epoch)
_HOLD = r"""
P = PID,
Tab = osiris_reader_context_cache,
Cached = ets:lookup(Tab, P),
Me = self(),
spawn(fun() ->
    erlang:suspend_process(P),
    case UNCACHE of true -> ets:delete(Tab, P); false -> ok end,
    Me ! {held, os:system_time(millisecond) + HOLDMS},
    receive after HOLDMS -> ok end,
    case OUTCOME of
        release -> [ets:insert(Tab, E) || E <- Cached], erlang:resume_process(P);
        kill -> exit(P, kill)
    end end),
Ends = receive {held, E} -> E after 5000 -> 0 end,
io:format("~p ~p~n", [P, Ends]).
"""
_MEMBER = 'element(2, {ok, _} = rabbit_stream_manager:lookup_local_member(<<"/">>, <<"STREAM">>))'


@asynccontextmanager
async def raw_stream_client(bed: TestBed, host: str, port: int, name: str = "") -> AsyncIterator[Any]:
    """A plain rstream client, authenticated; ``server_properties`` then holds the node it reached.  A namespaced
    node that the client cannot dial is reached through its forward (the test bed's probes see what the LB sees)."""
    from smartclient.stream._rstream import new_client

    host = next((n.management_host for n in bed.nodes if (n.host, n.stream_port) == (host, port) and n.management_host),
                host)
    client = new_client(None, host=host, port=port, tls=None, frame_max=1048576, heartbeat=60, name=name,
                        on_closed=None, max_ids=200, server_hostname=None)
    await client.start()
    try:
        await client.authenticate(vhost="/", username=bed.username, password=bed.password)
        yield client
    finally:
        await client.close()


async def create_stream_led_by(bed: TestBed, stream: str, node_index: int, size: int = 3) -> None:
    """Create ``stream`` through a connection to node ``node_index`` (the leader is client-local) and wait
    until all ``size`` members are up.  Note the stream protocol's argument keys have no ``x-`` prefix."""
    node = bed.nodes[node_index]
    async with raw_stream_client(bed, node.host, node.stream_port) as client:
        await client.create_stream(stream, {"initial-cluster-size": size})
        for _ in range(200):
            try:
                _, replicas = await client.query_leader_and_replicas(stream)
                if len(replicas) == size - 1:
                    return
            except Exception:  # no leader yet
                pass
            await asyncio.sleep(0.05)
    raise TestBedError(f"{stream} did not get {size - 1} replicas within 10s")


async def delete_streams(bed: TestBed, *streams: str) -> None:
    node = bed.nodes[0]
    async with raw_stream_client(bed, node.host, node.stream_port) as client:
        for stream in streams:
            with contextlib.suppress(Exception):  # already gone
                await client.delete_stream(stream)


def stream_members(bed: TestBed, stream: str) -> tuple[Address, set[Address]]:
    """Leader and replicas (advertised addresses) as the management API reports them."""
    with bed.management() as api:
        info = api.queue("/", stream)
    by_name = {n.name: Address(*n.advertised) for n in bed.nodes}
    leader = by_name[info["leader"]]
    return leader, {by_name[m] for m in info["members"]} - {leader}


@dataclass(frozen=True)
class Held:
    """A process held by :func:`hold_member`: its pid as the node prints it, and when the hold ends
    (``time.time()``, as the node's clock has it: the same machine's)."""

    pid: str
    ends_at: float

    def left(self) -> float:
        """Seconds of the hold left now (a caller that only knows when it asked cannot tell: the rabbitmqctl call
        takes seconds on a loaded machine, and the hold begins somewhere inside it)."""
        return self.ends_at - time.time()


def hold_member(bed: TestBed, node_index: int, stream: str, seconds: float, outcome: str = "release",
                uncache: bool = False) -> Held:
    """Hold ``stream``'s member on node ``node_index`` (its writer or a replica) as one still initialising after a
    restart is: alive, answering nothing, for ``seconds``; then let it go (``outcome="release"``) or kill it
    (``"kill"``: the coordinator starts another).  ``uncache``: its reader context is also taken out of osiris'
    cache until then, as before a member's initialisation ends, so that a Subscribe to it waits for it (a
    cached one is read without asking the member).  Returns the member's pid, and when its hold ends.

    :raises TestBedError: ``outcome`` is neither, or the node could not hold it (no member there)."""
    pid, ends = _hold(bed, node_index, _MEMBER.replace("STREAM", stream), f"the member of {stream!r}", seconds,
                      outcome, uncache).split()
    return Held(pid, int(ends) / 1000)


def coordinator_leader(bed: TestBed) -> int:
    """The index of the node whose stream coordinator (the Ra cluster that also decides single active consumers)
    leads now."""
    out = _ctl(bed, 0, "{ok, _, {_, Leader}} = ra:members({rabbit_stream_coordinator, node()}), "
                       'io:format("~s~n", [Leader]).')
    name = out.splitlines()[0].split("@")[0]
    names = [n.name.split("@")[0] for n in bed.nodes]
    if name not in names:
        raise TestBedError(f"the stream coordinator's leader {out!r} is not a node of the bed ({names})")
    return names.index(name)


def hold_coordinator(bed: TestBed, seconds: float) -> int:
    """Hold the stream coordinator's leader as one busy electing is: suspended for ``seconds``, then let go.  Every
    single active consumer's Subscribe and Unsubscribe waits for it (a Ra command, up to 30 s on each coordinator
    server).  Returns the index of its node."""
    node = coordinator_leader(bed)
    _hold(bed, node, "whereis(rabbit_stream_coordinator)", "the stream coordinator", seconds, "release", False)
    return node


def _hold(bed: TestBed, node_index: int, pid: str, what: str, seconds: float, outcome: str, uncache: bool) -> str:
    if outcome not in ("release", "kill"):
        raise TestBedError(f"hold: outcome must be 'release' or 'kill', not {outcome!r}")
    text = (_HOLD.replace("PID", pid).replace("HOLDMS", str(int(seconds * 1000))).replace("OUTCOME", outcome)
            .replace("UNCACHE", "true" if uncache else "false"))
    out = _ctl(bed, node_index, text)
    if not out.startswith("<") or out.split()[1:2] in ([], ["0"]):
        raise TestBedError(f"{bed.nodes[node_index].name} could not hold {what}: {out}")
    return out.splitlines()[0]


def _ctl(bed: TestBed, node_index: int, text: str) -> str:
    broker = getattr(bed, "broker", None)
    if broker is None:
        raise TestBedError("holding a broker process needs the local test bed (it runs rabbitmqctl eval in the node)")
    return str(broker(bed.nodes[node_index].name).ctl(["eval", " ".join(text.split())], timeout=30)).strip()

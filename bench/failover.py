"""bench/failover.py: the leader of a stream is killed (kill -9) under a named producer, several times.

Each round creates a 3-node stream led by one node, starts a named producer publishing a steady
stream of numbered messages, kills the leader node by PID, keeps publishing for a few seconds, stops,
brings the node back, and reads the stream from the start.  It measures, for smartclient and for raw
rstream (its default ``BackOffRecoveryStrategy``) in the same run:

* recovery: seconds from the kill to the first confirm of a message sent after it;
* lost: messages confirmed that are not in the stream;
* duplicated: messages stored more than once;
* failed: messages that ended failed (the application would have to send them again) and messages
  that ended in no state at all.

Target (issue 6): smartclient recovers in under 2 s (worst round) with 0 lost and 0 duplicated.
Run from the repository root with the test bed up (./dev demo): python bench/failover.py
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from smartclient import Confirmation, Environment
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams, raw_stream_client

ROUNDS = 3
AFTER_KILL = 5.0  # seconds of publishing after the kill
TARGET = 2.0


@dataclass
class Round:
    sent: int = 0
    confirmed: set[int] = field(default_factory=set)
    failed: int = 0
    first_after_kill: float | None = None
    killed_at: float = 0.0
    elected_after: float | None = None  # the broker's part: kill -> Metadata names a new leader
    stored: list[int] = field(default_factory=list)

    def on_confirm(self, publishing_id: int, ok: bool) -> None:
        if ok:
            self.confirmed.add(publishing_id)
            if self.killed_at and self.first_after_kill is None and publishing_id > self.last_before_kill:
                self.first_after_kill = time.monotonic() - self.killed_at
        else:
            self.failed += 1

    last_before_kill: int = 1 << 62

    @property
    def lost(self) -> int:
        return len(self.confirmed - set(self.stored))

    @property
    def duplicated(self) -> int:
        return len(self.stored) - len(set(self.stored))

    @property
    def no_state(self) -> int:
        return self.sent - len(self.confirmed) - self.failed


async def publish_until(stop: asyncio.Event, send: Any, state: Round) -> None:
    while not stop.is_set():
        try:
            await send(state.sent)
        except Exception:  # rstream raises while its publisher is gone: the message was not sent
            state.failed += 1
            await asyncio.sleep(0.05)
        state.sent += 1
        if state.sent % 50 == 0:
            await asyncio.sleep(0.002)


async def run_round(bed: LocalTestBed, client: str, leader: int) -> Round:
    stream = f"bench-failover-{uuid.uuid4().hex[:8]}"
    await create_stream_led_by(bed, stream, leader)
    state = Round()
    stop = asyncio.Event()
    victim = bed.nodes[leader]
    uris = [bed.stream_uri(n.host, n.stream_port) for n in bed.nodes]
    try:
        if client == "smartclient":
            async with Environment(uris) as env:
                producer = await env.producer(stream, name="bench")

                def on_confirm(c: Confirmation) -> None:
                    state.on_confirm(c.publishing_id, c.confirmed)

                async def send(i: int) -> None:
                    await producer.send(b"%d" % i, publishing_id=i + 1, on_confirm=on_confirm)

                await kill_during(bed, victim.name, stop, send, state, stream)
                await asyncio.wait_for(producer.flush(), 60)
        else:
            from rstream import ConfirmationStatus, Producer

            entry = bed.nodes[(leader + 1) % 3]
            async with Producer(entry.host, entry.stream_port, username=bed.username,
                                password=bed.password) as producer:

                def on_publish(status: ConfirmationStatus) -> None:
                    state.on_confirm(status.message_id, status.is_confirmed)

                async def send(i: int) -> None:
                    from rstream import AMQPMessage

                    message = AMQPMessage(body=b"%d" % i)
                    message.publishing_id = i + 1  # rstream's AMQPMessage takes it as an attribute only
                    await producer.send(stream, message, publisher_name="bench", on_publish_confirm=on_publish)

                await kill_during(bed, victim.name, stop, send, state, stream)
                deadline = time.monotonic() + 15
                while state.no_state and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
        bed.heal()
        state.stored = await read_back(bed, stream)
    finally:
        bed.heal()
        await delete_streams(bed, stream)
    return state


async def kill_during(bed: LocalTestBed, node: str, stop: asyncio.Event, send: Any, state: Round,
                      stream: str) -> None:
    task = asyncio.create_task(publish_until(stop, send, state))
    survivor = next(n for n in bed.nodes if n.name != node)
    async with raw_stream_client(bed, survivor.host, survivor.stream_port) as watcher:
        await asyncio.sleep(1.5)
        old_leader = (await watcher.query_leader_and_replicas(stream))[0]
        state.last_before_kill = state.sent  # publishing ids are i + 1: anything above was sent after the kill
        state.killed_at = time.monotonic()
        bed.kill_node(node)
        election = asyncio.create_task(watch_election(watcher, stream, old_leader, state))
        await asyncio.sleep(AFTER_KILL)
        election.cancel()
    stop.set()
    await task


async def watch_election(watcher: Any, stream: str, old_leader: Any, state: Round) -> None:
    """Poll Metadata on a surviving node until it names another leader: how long the broker took."""
    while True:
        try:
            leader = (await watcher.query_leader_and_replicas(stream))[0]
            if (leader.host, leader.port) != (old_leader.host, old_leader.port):
                state.elected_after = time.monotonic() - state.killed_at
                return
        except Exception:  # no leader yet
            pass
        await asyncio.sleep(0.02)


async def read_back(bed: LocalTestBed, stream: str) -> list[int]:
    stored: list[int] = []

    def on_message(message: Any, context: Any) -> None:
        # rstream's round publishes AMQP 1.0 messages (to set the publishing id): one data section, which a
        # smartclient consumer hands over as the body
        stored.append(int(bytes(message)) + 1)

    async with Environment([bed.stream_uri(n.host, n.stream_port) for n in bed.nodes]) as env:
        await env.consumer(stream, on_message, offset="first")
        last = -1
        while len(stored) != last:  # until nothing arrives for a second
            last = len(stored)
            await asyncio.sleep(1.0)
    return stored


async def main() -> int:
    logging.basicConfig(level=logging.ERROR)
    bed = LocalTestBed.from_env()
    bed.up()
    results: dict[str, list[Round]] = {"smartclient": [], "rstream": []}
    for round_no in range(ROUNDS):
        for client in (["smartclient", "rstream"] if round_no % 2 == 0 else ["rstream", "smartclient"]):
            state = await run_round(bed, client, leader=round_no % 3)
            results[client].append(state)
            recovery = f"{state.first_after_kill:.2f} s" if state.first_after_kill is not None else "never"
            elected = f"{state.elected_after:.2f} s" if state.elected_after is not None else "never"
            print(f"round {round_no + 1} {client:<11}: sent {state.sent:6d}, recovery {recovery:>7} (broker elected "
                  f"a leader after {elected}), lost "
                  f"{state.lost}, duplicated {state.duplicated}, failed {state.failed}, no state {state.no_state}")
    print()
    for client, rounds in results.items():
        times = [r.first_after_kill for r in rounds if r.first_after_kill is not None]
        print(f"{client:<11}: recovery median {statistics.median(times) if times else float('nan'):.2f} s, "
              f"worst {max(times) if times else float('nan'):.2f} s, recovered {len(times)}/{len(rounds)}; "
              f"lost {sum(r.lost for r in rounds)}, duplicated {sum(r.duplicated for r in rounds)}, "
              f"failed {sum(r.failed for r in rounds)}, no state {sum(r.no_state for r in rounds)}")
    ours = results["smartclient"]
    worst = max((r.first_after_kill or float("inf")) for r in ours)
    overhead = max((r.first_after_kill or float("inf")) - (r.elected_after or 0.0) for r in ours)
    print(f"smartclient's own part (recovery minus the broker's election), worst: {overhead:.2f} s")
    clean = all(r.lost == 0 and r.duplicated == 0 and r.failed == 0 and r.no_state == 0 for r in ours)
    verdict = "PASS" if worst < TARGET and clean else "MISS"
    print(f"failover: worst_recovery_s={worst:.2f} target < {TARGET} (lost=dup=0: {clean}) {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

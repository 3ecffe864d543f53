"""bench/mqtt_fleet.py: 10,000 idle MQTT connections from one process, held for a minute.

Seed 003 (native MQTT) measured about 7 GB per node for 1 million idle connections on 3 nodes, i.e.
about 21 KiB per connection on the node that holds it (97 GB per node, about 291 KiB, before native
MQTT), with management metrics off and 2 KiB socket buffers.

This bench opens ``FLEET`` (10,000) connections with :class:`MqttFleet` (one selector thread), spread
directly over the 3 nodes, holds them for ``HOLD`` seconds with a 20 s keepalive (so PINGREQs flow), and
reports:

* the time to connect them all, and how many dropped during the hold;
* this process's RSS per connection;
* the brokers' memory per connection: the management API's ``mem_used`` per node, before and after
  (median of 3 samples), over the connections each node holds, beside the seed's figure.  The test bed
  keeps management metrics on, which the seed says doubles or triples it.

The anchor, measured side by side: paho's own model, one ``loop_start`` thread (and a socket pair) per
client, for ``ANCHOR`` (300) clients: its RSS per connection.  Not more: paho's loop waits with
select(), so a plain paho client whose socket is numbered 1024 or higher never connects (about 340
threaded clients per process; eclipse-paho/paho.mqtt.python#238).  Target: the fleet's client RSS per
connection is at most half of paho's.

Run from the repository root with the test bed up (./dev demo): python bench/mqtt_fleet.py
"""

from __future__ import annotations

import gc
import resource
import statistics
import sys
import time
import uuid

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from smartclient.mqtt.fleet import MqttFleet, process_rss
from smartclient.mqtt.placement import MqttOptions, MqttPlacer
from smartclient.testing.local import LocalTestBed

FLEET = 10_000
ANCHOR = 300
HOLD = 60.0
TARGET = 0.5
SEED_KIB_PER_CONNECTION = 7 * 1024 * 1024 / (1_000_000 / 3)  # 7 GB per node, a third of 1M on each


def broker_memory(api: object) -> dict[str, float]:
    samples: dict[str, list[int]] = {}
    for i in range(3):
        for node in api.nodes():  # type: ignore[attr-defined]
            samples.setdefault(node["name"], []).append(int(node.get("mem_used") or 0))
        if i < 2:
            time.sleep(2.5)
    return {name: statistics.median(values) for name, values in samples.items()}


def paho_threaded(placer: MqttPlacer, count: int) -> float:
    """RSS per connection of ``count`` plain paho clients, each with its own loop_start thread."""
    nodes = list(placer.targets())
    gc.collect()
    before = process_rss()
    clients = []
    for i in range(count):
        address = nodes[i % len(nodes)]
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"anchor-{uuid.uuid4().hex[:6]}-{i}")
        c.username_pw_set("guest", "guest")
        c.connect(address.host, address.port, keepalive=20)
        c.loop_start()
        clients.append(c)
    deadline = time.monotonic() + 60
    while sum(c.is_connected() for c in clients) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    connected = sum(c.is_connected() for c in clients)
    per = (process_rss() - before) / max(1, connected)
    for c in clients:
        c.disconnect()
    for c in clients:
        c.loop_stop()
    print(f"anchor: paho loop_start, {connected}/{count} clients: {per / 1024:.1f} KiB RSS per connection")
    return per


def main() -> int:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < FLEET + 3 * ANCHOR + 200:
        print(f"mqtt_fleet: the file-descriptor limit {hard} is below {FLEET + 3 * ANCHOR + 200}")
    bed = LocalTestBed.from_env()
    api = bed.management()
    placer = MqttPlacer(api, options=MqttOptions(protocol="3.1.1", keepalive=20))
    anchor = paho_threaded(placer, ANCHOR)
    time.sleep(3)
    memory_before = broker_memory(api)
    gc.collect()
    fleet = MqttFleet(placer, FLEET, client_id_prefix=f"bench-{uuid.uuid4().hex[:6]}", window=512)
    report = fleet.start(timeout=600)
    print(f"fleet: {report.connected} connections in {report.connect_seconds:.1f} s "
          f"({report.connected / report.connect_seconds:.0f}/s), per node {report.per_node}, "
          f"max/min {report.spread:.3f}")
    print(f"fleet: {report.rss_per_connection / 1024:.1f} KiB client RSS per connection (one selector thread)")
    held_from = time.monotonic()
    lowest = report.connected
    while time.monotonic() - held_from < HOLD:
        time.sleep(2)
        lowest = min(lowest, fleet.connected)
    time.sleep(3)  # the management API's next statistics round
    memory_after = broker_memory(api)
    per_node = fleet.per_node()
    print(f"held {HOLD:.0f} s: lowest connected {lowest}, disconnects {fleet.disconnects}, "
          f"reconnects {fleet.reconnects}")
    for name in sorted(memory_after):
        grew = memory_after[name] - memory_before.get(name, 0)
        held = per_node.get(name, 0)
        print(f"broker {name}: +{grew / 2**20:.0f} MiB for {held} connections = "
              f"{grew / max(1, held) / 1024:.1f} KiB per connection "
              f"(seed, native MQTT, metrics off: ~{SEED_KIB_PER_CONNECTION:.0f} KiB; before it: ~291 KiB)")
    started = time.monotonic()
    fleet.close(timeout=60)
    print(f"closed in {time.monotonic() - started:.1f} s")
    ratio = report.rss_per_connection / anchor
    ok = ratio <= TARGET and lowest == FLEET and report.connected == FLEET
    print(f"mqtt_fleet: client_rss_ratio={ratio:.2f} target <= {TARGET} {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

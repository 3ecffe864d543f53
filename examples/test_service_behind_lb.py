"""How a user tests their own service behind a load balancer with smartclient's fixtures.

``pip install 'smartclient[testbed]'`` installs the fixtures, and the plugin is opt-in:
this module enables it with ``pytest_plugins`` below (in your own project, put that
line in the root ``conftest.py``, or run ``pytest -p smartclient.testing``).  This
file is a plain pytest module that CI runs against the same test bed as
smartclient's own tests.  It asks: does every node behind the round-robin LB serve my
stream clients, and does my client survive one node being taken out of it?
"""

from __future__ import annotations

from collections import Counter

from rstream.client import Client

from smartclient.testing import TestBed

pytest_plugins = ["smartclient.testing.pytest_plugin"]


async def _node_reached(bed: TestBed, host: str, port: int) -> str:
    client = Client(host=host, port=port, frame_max=1048576, heartbeat=60)
    await client.start()
    try:
        await client.authenticate(vhost="/", username=bed.username, password=bed.password)
        props = client.server_properties or {}
        return bed.node_by_advertised(props["advertised_host"], int(props["advertised_port"])).short
    finally:
        await client.close()


async def test_lb_spreads_my_connections(rabbitmq_testbed: TestBed) -> None:
    host, port = rabbitmq_testbed.lb("stream")
    every = {n.short for n in rabbitmq_testbed.nodes}
    seen: Counter[str] = Counter()
    # a shared LB takes other clients' sessions in turn, and one whose backend just came back may skip it
    # for a health check or two: keep connecting (bounded) until every node has served one
    for _ in range(30):
        seen[await _node_reached(rabbitmq_testbed, host, port)] += 1
        if set(seen) == every:
            break
    assert set(seen) == every, seen


async def test_my_client_still_connects_with_a_backend_out(rabbitmq_faulty_testbed: TestBed) -> None:
    rabbitmq_faulty_testbed.disable_lb_backend(rabbitmq_faulty_testbed.nodes[0].name)  # healed after the test
    host, port = rabbitmq_faulty_testbed.lb("stream")
    seen = {await _node_reached(rabbitmq_faulty_testbed, host, port) for _ in range(4)}
    assert rabbitmq_faulty_testbed.nodes[0].short not in seen

"""An MQTT client placed on a node that another wing found cut off from its peers since (its placer's CutOffNodes)
loses its connection at the silence watch's next look: a subscriber there hears the node and has nothing to
compare."""

from __future__ import annotations

import time

from smartclient.mqtt.placement import MqttPlacer


def test_a_client_on_a_node_found_cut_off_since_it_was_kept_loses_its_connection() -> None:
    placer = MqttPlacer(entry_points=["x:1883"])
    client = placer.new_client("cut-off-test")
    lost: list[bool] = []
    client.is_connected = lambda: True  # type: ignore[method-assign]
    client.lose_connection = lambda: lost.append(client.lost_cut_off)  # type: ignore[method-assign]
    client.dead_after, client.node, client._kept_at = 10.0, "a@h", time.monotonic()
    placer.cut_off.found("a@h", "the queue watch of AMQP connection c1")
    assert client.found_cut_off() is None  # not placed yet (no reconnect of its own to go through)
    client._failover = True
    assert client.found_cut_off() == ("its node a@h was found cut off since it was kept there, by the queue watch of "
                                      "AMQP connection c1")
    client._check_keepalive()
    assert lost == [False]  # lost, not by its own PUBACK watch: its reconnect keeps its first landing (through an LB)

    client.lost_cut_off, client._kept_at = False, time.monotonic()  # kept there after the finding: stays
    client._check_keepalive()
    assert lost == [False] and client.found_cut_off() is None
    client.node = None  # a node not known (a reconnect kept a landing the LB chose): it may be that one
    assert client.found_cut_off() is None  # (kept after the finding)
    client._kept_at -= 60
    assert client.found_cut_off() == ("a node (its own is not known) was found cut off since it was kept there, by "
                                      "the queue watch of AMQP connection c1")
    client._placing = True  # not while its reconnect places it
    assert client.found_cut_off() is None

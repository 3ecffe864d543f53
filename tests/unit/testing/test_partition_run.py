"""The partition run's measure of when each silent drop was found (pure, from hand-made histories)."""

from __future__ import annotations

from types import SimpleNamespace

from smartclient.testing.partition_run import bounds, client_of, detections


def _history() -> list[dict[str, object]]:
    return [
        {"kind": "fault", "t": 10.0, "what": "cut-lb", "target": "rabbit-1"},
        {"kind": "found", "t": 21.0, "client": "p0", "wing": "stream", "started": 20.0},
        {"kind": "found", "t": 26.0, "client": "p0", "wing": "stream", "started": 25.0},  # its retry: not counted
        {"kind": "found", "t": 24.0, "client": "c-plain", "wing": "stream", "started": 22.5},  # past its bound
        {"kind": "found", "t": 19.0, "client": "amqp-p", "wing": "amqp", "started": 19.0},
        {"kind": "heal", "t": 30.0, "what": "cut-lb", "target": "rabbit-1"},
        {"kind": "found", "t": 31.0, "client": "c-sac", "wing": "stream", "started": 31.0},  # after the heal
        {"kind": "fault", "t": 40.0, "what": "kill", "target": "rabbit-2"},  # not a partition
        {"kind": "found", "t": 41.0, "client": "p1", "wing": "stream", "started": 41.0},
    ]


def test_each_clients_first_finding_before_the_heal_is_timed_from_its_partition() -> None:
    found = detections(_history(), bounds(dead_after=10))
    assert found.faults == 1
    assert found.times == {"stream": [10.0, 12.5], "amqp": [9.0]}  # (found when the recovery started)
    assert found.beyond == [("stream", 10.0, "cut-lb", 12.5)]
    assert found.worst("stream") == 12.5 and found.worst("mqtt") == 0.0
    assert any("beyond its bound: stream" in line for line in found.summary())


def test_the_bounds_are_the_documented_ones() -> None:
    assert bounds(10) == {"stream": 10, "mqtt": 10, "amqp": 10, "amqp10": 10, "rpc": 10, "mqtt-fleet": 10}


def test_a_partition_that_leaves_the_clients_links_alone_is_not_a_silent_drop_and_one_way_has_no_more_time() -> None:
    history = [{"kind": "fault", "t": 0.0, "what": "isolate-from-peers", "target": "r1"},
               {"kind": "found", "t": 16.0, "client": "p0", "wing": "stream", "started": 16.0},  # its watch: no link
               {"kind": "heal", "t": 20.0, "what": "isolate-from-peers", "target": "r1"},
               {"kind": "fault", "t": 30.0, "what": "cut-lb-one-way", "target": "r1"},
               {"kind": "found", "t": 40.0, "client": "p0", "wing": "stream", "started": 40.0},
               {"kind": "found", "t": 41.0, "client": "p1", "wing": "stream", "started": 41.0},
               {"kind": "heal", "t": 50.0, "what": "cut-lb-one-way", "target": "r1"}]
    found = detections(history, bounds(dead_after=10))
    assert found.faults == 1 and found.times == {"stream": [10.0, 11.0]}
    assert found.beyond == [("stream", 30.0, "cut-lb-one-way", 11.0)]


def test_a_handle_is_named_as_the_nemesis_names_its_client() -> None:
    assert client_of(SimpleNamespace(name="nemesis-p-super", stream="x-super-1")) == "p-super"
    assert client_of(SimpleNamespace(name="nemesis-sac", stream="s-1")) == "c-sac"
    assert client_of(SimpleNamespace(name=None, stream="n-1-super-2")) == "c-super-n-1-super-2"
    assert client_of(SimpleNamespace(client_id="nemesis-1-q1-s")) == "mqtt-c"
    assert client_of(SimpleNamespace()) == ""


def test_mqtts_silence_watch_is_a_finding_as_its_log_says() -> None:
    import logging

    from smartclient.testing.nemesis import History
    from smartclient.testing.partition_run import MQTT_WATCH_LOGGER, _MqttFindings

    history = History()
    watch = _MqttFindings(history)
    logger = logging.getLogger(MQTT_WATCH_LOGGER)
    logger.addHandler(watch)
    try:
        logger.warning("MQTT client %s: nothing received for %.1f s (dead_after): the connection is lost",
                       "nemesis-7-q1-s", 9.0)
        logger.warning("MQTT client %s: nothing received for %.1f s (dead_after): the connection is lost",
                       "nemesis-7-3", 9.1)
        logger.warning("MQTT client %s: something else", "nemesis-7-q1-p")
        # a publisher's watch ends its connection on the PUBACK that does not come (that check comes first)
        logger.warning("MQTT client %s: %s: is its node cut off? The connection is lost", "nemesis-7-q1-p",
                       "no PUBACK for 8.0 s (dead_after) while the broker answers")
        # another wing found its node cut off: not this watch's finding (that wing's is recorded)
        logger.warning("MQTT client %s: %s: is its node cut off? The connection is lost", "nemesis-7-q1-s",
                       "its node a@h was found cut off since it was kept there, by the queue watch of c1")
    finally:
        logger.removeHandler(watch)
    found = [(r["client"], r["wing"]) for r in history.records if r["kind"] == "found"]
    assert found == [("mqtt-c", "mqtt"), ("mqtt", "mqtt-fleet"), ("mqtt-p", "mqtt")]
    assert all(0 <= r["started"] <= r["t"] + 0.01 for r in history.records)


def test_the_findings_prefixes_are_the_watchs_own_words() -> None:
    """The handler matches the watch's log by its format strings' beginnings: those must be the watch's."""
    import inspect

    from smartclient.mqtt._paho import PahoClient
    from smartclient.testing.partition_run import MQTT_WATCH_ENDINGS

    source = inspect.getsource(PahoClient._check_keepalive)
    for prefix in MQTT_WATCH_ENDINGS:
        assert f'"MQTT client %s: {prefix}' in source or f'f"{prefix} ' in source, prefix

"""The DNS server's zone file and the default records of the test bed."""

from pathlib import Path

import pytest

from smartclient.testing.dns_server import DnsRecord, ZoneFile
from smartclient.testing.layout import Layout
from smartclient.testing.nameserver import default_records


def test_zone_file_round_trip_and_normalisation(tmp_path: Path) -> None:
    zone = ZoneFile(tmp_path / "zone.json")
    assert zone.read() == []
    zone.add(DnsRecord("Node-1.Example.", "a", "127.0.0.1", 5))
    zone.add(DnsRecord("_s._tcp.example", "SRV", "0 10 5552 node-1.example."))
    records = zone.read()
    assert records[0] == DnsRecord("node-1.example.", "A", "127.0.0.1", 5)
    assert records[1].type == "SRV"
    zone.remove("node-1.example", "A")
    assert [r.name for r in zone.read()] == ["_s._tcp.example."]


@pytest.mark.parametrize("record, message", [
    (DnsRecord("x", "MX", "1 mail"), "unsupported DNS record type"),
    (DnsRecord("x", "SRV", "10 5552 host"), "priority weight port target"),
    (DnsRecord("x", "A", "127.0.0.1", -1), "negative TTL"),
])
def test_bad_records_are_refused(record: DnsRecord, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        record.normalised()


def test_default_records_cover_nodes_lb_and_srv_per_protocol() -> None:
    layout = Layout()
    records = default_records(layout, layout.nodes)
    names = {(r.name, r.type) for r in records}
    assert ("rabbit-2.smartclient.test.", "A") in names
    assert ("lb.smartclient.test.", "A") in names
    srv = [r for r in records if r.name == "_rabbitmq-stream._tcp.smartclient.test."]
    assert sorted(r.value for r in srv) == [
        "0 10 20152 rabbit-1.smartclient.test.",
        "0 10 20252 rabbit-2.smartclient.test.",
        "0 10 20352 rabbit-3.smartclient.test.",
    ]
    lb_srv = [r for r in records if r.name == "_amqp._tcp.lb.smartclient.test."]
    assert [r.value for r in lb_srv] == ["0 10 20072 lb.smartclient.test."]

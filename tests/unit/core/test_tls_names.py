"""Which name a TLS connection verifies: the one the user meant, not necessarily the address dialled."""

import inspect

import pytest
from rstream.client import Client

from resolvers import Chain, DnsResolver, Identity, LoadBalancer, StaticMap
from smartclient import Address
from smartclient.core.tls_names import tls_server_name

NODE = Address("rabbit-2.internal", 5551)
IP = Address("10.0.0.2", 5551)


@pytest.mark.parametrize("target, dialled, resolver, override, expected", [
    (NODE, NODE, Identity(), None, "rabbit-2.internal"),                       # direct: the node's name
    (NODE, IP, StaticMap({"rabbit-2.internal": "10.0.0.2"}), None, "rabbit-2.internal"),  # remapped to an IP
    (NODE, Address("nat-2.example", 30001), StaticMap({}), None, "nat-2.example"),  # remapped to another name
    (NODE, Address("lb.example", 5551), LoadBalancer("lb.example:5551"), None, "lb.example"),  # LB: its name
    (NODE, IP, Chain(LoadBalancer("lb.example:5551"), DnsResolver(["127.0.0.1"])), None, "lb.example"),
    (Address("10.0.0.9", 5551), IP, Identity(), None, "10.0.0.2"),             # nothing but IPs
    (NODE, IP, StaticMap({}), "override.example", "override.example"),          # explicit override wins
])
def test_tls_server_name(target: Address, dialled: Address, resolver: object, override: str | None,
                         expected: str) -> None:
    assert tls_server_name(target, dialled, resolver, override) == expected


def test_named_client_start_mirrors_rstream() -> None:
    source = inspect.getsource(Client.start)
    for line in ("self._conn = Connection(self.host, self.port, self._ssl_context)", "await self._conn.open()",
                 'self.start_task("listener", self._listener())', "self.add_handler(schema.Heartbeat",
                 "self.add_handler(schema.Close"):
        assert line in source, f"rstream's Client.start changed: {line!r} is gone; update smartclient.stream.tls"


def test_a_client_that_verifies_dns_names_only_verifies_the_nodes_host_for_an_ip() -> None:
    from smartclient import ConfigurationError
    from smartclient.core.tls_names import dns_tls_name

    assert dns_tls_name("rabbit-2.example", "rabbit@elsewhere") == "rabbit-2.example"  # a name: as it is
    assert dns_tls_name("10.0.0.7", "rabbit@rabbit-server-0.rabbit-nodes.ns") == "rabbit-server-0.rabbit-nodes.ns"
    assert dns_tls_name("[::1]", "rabbit-1@localhost") == "localhost"
    for node in (None, "rabbit@10.0.0.7", "10.0.0.7"):
        with pytest.raises(ConfigurationError, match=r"verify the IP address 10\.0\.0\.8.*tls_server_name="):
            dns_tls_name("10.0.0.8", node)

"""The declared resolver contract (issue 54): every optional member a resolver may offer is declared in
``resolvers/base.py`` with a default, a Chain forwards all of it, and nothing of a resolver is probed."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from resolvers import Chain, DnsResolver, Identity, LoadBalancer, Resolver, SniRouter, StaticMap, as_resolver
from smartclient import Address, ConfigurationError
from smartclient.resolution import Resolution, through

ROOT = Path(__file__).resolve().parents[3]
LB = LoadBalancer("lb:5552", amqp=5672, mqtt=1883)


def test_every_optional_member_has_its_default() -> None:
    plain = as_resolver(lambda address: address)
    target = Address("n1", 5552)
    assert (plain.listens(), plain.address_for("amqp"), plain.option_for("mqtt/ssl"), plain.tls_name(target),
            plain.routes_by_name(), plain.parts(), plain.cache_counts()) == (
        False, None, "mqtt_tls", None, False, (), None)
    with pytest.raises(ConfigurationError, match="does not route connections by name"):
        plain.sni_name("rabbit@n1", "stream")


def test_a_chain_holding_a_load_balancer_listens_per_protocol_and_names_tls_as_it_does() -> None:
    chain = Chain(StaticMap({"n1": "10.0.0.1"}), LB)
    assert chain.listens() and chain.address_for("amqp") == Address("lb", 5672)
    assert chain.address_for("mqtt/ssl") is None and chain.option_for("mqtt/ssl") == "mqtt_tls"
    assert chain.tls_name(Address("n1", 5552)) == "lb" and chain.parts()[1] is LB
    assert through(chain, "amqp") == Address("lb", 5672)  # (it was not seen as listening: issue 54)
    with pytest.raises(ConfigurationError, match=r"no mqtt/ssl listener: Chain\(\.\.\., mqtt_tls=PORT\)"):
        through(chain, "mqtt/ssl")
    assert Resolution(chain, protocol="mqtt").lb == Address("lb", 1883)
    assert not Chain(StaticMap({"n1": "n2"})).listens()


def test_a_chain_refuses_a_resolver_that_routes_by_name() -> None:
    with pytest.raises(ConfigurationError, match="give it as the resolver itself, not in a Chain"):
        Chain(SniRouter("ingress:5551"))


def test_what_a_resolver_declares_is_read_only_from_the_declaration() -> None:
    class Named(Resolver):  # declares a TLS name
        blocking = False

        def resolve(self, address: Address) -> Address:
            return Address("dial", address.port)

        def tls_name(self, address: Address) -> str | None:
            return "named.example"

    class Undeclared:  # the same method, not declared: only resolve() is part of its contract
        def resolve(self, address: Address) -> Address:
            return address

        def tls_name(self, address: Address) -> str | None:
            return "ignored.example"

    target = Address("n1", 5552)
    assert Resolution(Named(), tls=True).tls_name(target, Address("dial", 5552)) == "named.example"
    assert Resolution(Undeclared(), tls=True).tls_name(target, target) == "n1"
    assert asyncio.run(Resolution(Named()).dial_address(target)) == Address("dial", 5552)


def test_the_built_ins_declare_what_they_do() -> None:
    dns = DnsResolver(["127.0.0.1"])
    assert dns.cache_counts() == (0, 0) and Chain(Identity(), dns).parts()[1].cache_counts() == (0, 0)
    assert LB.listens() and not LB.routes_by_name() and not Identity().listens()
    sni = SniRouter("ingress:5551", mqtt_tls=8883)
    assert sni.listens() and sni.routes_by_name() and sni.option_for("amqp/ssl") == "amqp"
    assert all(not r.blocking for r in (Identity(), StaticMap({}), LB, sni))


def test_nothing_reads_a_resolver_with_getattr_or_hasattr() -> None:
    """The done-means of issue 54: where resolvers are handled, no attribute is probed."""
    files = [*sorted((ROOT / "resolvers").glob("*.py")), ROOT / "smartclient" / "resolution.py",
             ROOT / "smartclient" / "core" / "tls_names.py", ROOT / "smartclient" / "stream" / "telemetry.py"]
    probes = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
                text = ast.unparse(node.args[0]) if node.args else ""
                if "resolv" in text:
                    probes.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert probes == []

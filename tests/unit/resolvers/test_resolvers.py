"""The resolvers package: the contract, each resolver, the allow-list. No network."""

from __future__ import annotations

import asyncio
import threading

import pytest

from resolvers import AllowList, Chain, DnsResolver, Identity, LoadBalancer, StaticMap, as_async
from smartclient import Address, AddressNotAllowed, ConfigurationError, ResolutionError

A = Address("rabbit-1", 5552)


async def test_identity_and_load_balancer() -> None:
    assert await as_async(Identity())(A) == A
    assert await as_async(LoadBalancer("lb:6000"))(A) == Address("lb", 6000)


async def test_static_map_exact_host_and_strict() -> None:
    m = StaticMap({"rabbit-1:5552": "10.0.0.1:30001", "rabbit-2": "10.0.0.2", "[::1]:5552": "[::2]:1"})
    assert m.resolve(A) == Address("10.0.0.1", 30001)
    assert m.resolve(Address("RABBIT-2", 5553)) == Address("10.0.0.2", 5553)
    assert m.resolve(Address("::1", 5552)) == Address("::2", 1)
    assert m.resolve(Address("other", 1)) == Address("other", 1)
    with pytest.raises(ResolutionError, match="no entry for other:1"):
        StaticMap({}, strict=True).resolve(Address("other", 1))
    with pytest.raises(ConfigurationError):
        StaticMap({"": "x"})


async def test_plain_callables_sync_and_async() -> None:
    threads = []

    def sync(address: Address) -> str:
        threads.append(threading.current_thread())
        return f"{address.host}.internal:{address.port + 1}"

    async def coro(address: Address) -> tuple[str, int]:
        await asyncio.sleep(0)
        return ("x", address.port)

    assert await as_async(sync)(A) == Address("rabbit-1.internal", 5553)
    assert threads[0] is not threading.main_thread()  # a blocking callable never runs on the loop
    assert await as_async(coro)(A) == Address("x", 5552)
    assert await Chain(sync, coro, StaticMap({"x": "y"})).resolve(A) == Address("y", 5553)


@pytest.mark.parametrize("resolver, message", [
    (lambda a: 42, "returned 42 .int.; a resolver must return"),
    (lambda a: "no-port", "not a usable address"),
    (lambda a: 1 / 0, "failed on rabbit-1:5552: ZeroDivisionError"),
])
async def test_garbage_and_errors_become_resolution_errors(resolver: object, message: str) -> None:
    with pytest.raises(ResolutionError, match=message):
        await as_async(resolver)(A)  # type: ignore[arg-type]


def test_not_a_resolver() -> None:
    with pytest.raises(ResolutionError, match="is not a resolver"):
        as_async(42)  # type: ignore[arg-type]


def test_allow_list() -> None:
    allow = AllowList(["127.0.0.0/8", "::1", "lb.example", "*.internal"])
    for ok in ("127.0.0.5", "::1", "LB.example", "rabbit-1.internal"):
        assert allow.allows(Address(ok, 1)), ok
    for bad in ("10.0.0.1", "evil.example", "internal", "localhost"):
        assert not allow.allows(Address(bad, 1)), bad
    with pytest.raises(AddressNotAllowed, match=r"evil.example:1 \(resolved from x:1\) is outside the allow-list"):
        allow.check(Address("evil.example", 1), why="resolved from x:1")
    with pytest.raises(ConfigurationError, match="not a valid network"):
        AllowList(["10.0.0.0/99"])
    with pytest.raises(ConfigurationError, match="empty"):
        AllowList([])


async def test_dns_resolver_passes_ip_literals_and_validates() -> None:
    resolver = DnsResolver(["127.0.0.1"], port=1)
    assert await resolver.resolve(Address("10.1.2.3", 5552)) == Address("10.1.2.3", 5552)
    assert await resolver.resolve(Address("LocalHost", 1)) == Address("127.0.0.1", 1)  # RFC 6761, no query
    assert await resolver.resolve(Address("a.localhost.", 2)) == Address("127.0.0.1", 2)
    with pytest.raises(ConfigurationError, match="at least one name server"):
        DnsResolver([])
    with pytest.raises(ConfigurationError, match="timeout must be a positive number"):
        DnsResolver(["127.0.0.1"], timeout=0)


def test_built_in_resolvers_are_values() -> None:
    import pickle

    for resolver in (Identity(), LoadBalancer("lb:1"), StaticMap({"a": "b:2", "c:1": "d"})):
        assert pickle.loads(pickle.dumps(resolver)) == resolver
        assert hash(pickle.loads(pickle.dumps(resolver))) == hash(resolver)
    assert LoadBalancer("lb:1") != LoadBalancer("lb:2") and StaticMap({"a": "b"}) != StaticMap({"a": "c"})


def test_the_cli_builds_its_resolver_from_the_same_settings() -> None:
    from resolvers import Chain, DnsResolver, Identity, LoadBalancer, StaticMap
    from smartclient.cli import _parser, _resolver

    assert isinstance(_resolver(_parser().parse_args(["topology", "s", "--lb", ""])), Identity)
    lb = _resolver(_parser().parse_args(["topology", "s", "--lb", "lb:5552"]))
    assert isinstance(lb, LoadBalancer)
    chain = _resolver(_parser().parse_args(["topology", "s", "--map", "rabbit-1=127.0.0.1:1", "--dns", "127.0.0.1:53",
                                            "--lb", ""]))
    assert isinstance(chain, Chain) and [type(r) for r in chain.resolvers] == [StaticMap, DnsResolver]


@pytest.mark.parametrize("nameservers, message", [
    (["not-an-ip"], r"bad name server 'not-an-ip'"),
    (["127.0.0.1", "1.2.3.4.5"], r"bad name server '1.2.3.4.5'"),  # the bad one, not the list
    ([""], r"bad name server ''"),
    ([53], r"bad name server 53"),
    ("127.0.0.1", r"nameservers must be a list .*, not '127.0.0.1' \(a str\)"),
])
def test_dns_resolver_and_srv_discovery_refuse_bad_name_servers_with_a_configuration_error(
    nameservers: object, message: str
) -> None:
    from resolvers import SrvDiscovery

    for build in (lambda: DnsResolver(nameservers),  # type: ignore[arg-type]
                  lambda: SrvDiscovery("_rabbitmq-stream._tcp.example", nameservers)):  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=message) as info:
            build()
        assert not type(info.value).__module__.startswith("dns")


@pytest.mark.parametrize("kwargs, message", [
    ({"port": 0}, "port must be an int from 1 to 65535 .*, not 0"), ({"port": "53"}, r"port .*not '53' \(a str\)"),
    ({"timeout": -1}, "timeout must be a positive number"), ({"timeout": "2"}, "timeout must be a positive number"),
])
def test_dns_resolver_refuses_bad_ports_and_timeouts(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        DnsResolver(["127.0.0.1"], **kwargs)  # type: ignore[arg-type]


def test_every_dnspython_error_is_mapped_in_one_place() -> None:
    """dnspython's exceptions become smartclient's, each named, chained with ``from``."""
    import dns.exception
    import dns.name
    import dns.resolver

    from resolvers._dnspython import dnspython_errors
    from smartclient import ResolutionTimeout, SmartClientError

    cases: list[tuple[BaseException, type[SmartClientError], str]] = [
        (dns.resolver.NXDOMAIN(), ResolutionError, r"^rabbit-9\.example does not exist \(NXDOMAIN from ns\)$"),
        (dns.resolver.LifetimeTimeout(timeout=2.0, errors=[]), ResolutionTimeout,
         r"no answer for rabbit-9\.example from ns within the timeout"),
        (dns.resolver.NoAnswer(), ResolutionError, r"rabbit-9\.example has no record"),
        (dns.resolver.NoNameservers(), ResolutionError, r"no name server answered for rabbit-9\.example"),
        (dns.name.EmptyLabel(), ResolutionError, r"rabbit-9\.example could not be resolved \(ns\): EmptyLabel"),
        (dns.resolver.NoResolverConfiguration(), ConfigurationError, r"rabbit-9\.example is unusable"),
        (ValueError("nameserver x is not ..."), ConfigurationError, r"bad rabbit-9\.example: nameserver x"),
        (ConnectionRefusedError(111, "refused"), ResolutionError, r"ConnectionRefusedError"),
    ]
    for raised, expected, message in cases:
        with pytest.raises(expected, match=message) as info, dnspython_errors("rabbit-9.example", "ns"):
            raise raised
        assert info.value.__cause__ is raised
    mine = ResolutionError("already ours")
    with pytest.raises(ResolutionError) as info, dnspython_errors("x", "ns"):
        raise mine
    assert info.value is mine  # smartclient's own errors pass through untouched


async def test_a_malformed_name_is_a_resolution_error_not_a_dnspython_one() -> None:
    resolver = DnsResolver(["127.0.0.1"], port=1)
    with pytest.raises(ResolutionError, match=r"a\.\.b could not be resolved .*EmptyLabel"):
        await resolver.resolve(Address("a..b", 5552))
    with pytest.raises(ResolutionError, match="LabelTooLong"):
        await resolver.resolve(Address("x" * 64 + ".example", 5552))


def test_dnspython_is_imported_in_one_module_only() -> None:
    """The seam: no other module of the library imports dnspython."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    importers = sorted(
        str(path.relative_to(root))
        for package in ("resolvers", "smartclient") for path in (root / package).rglob("*.py")
        if "testing" not in path.parts and re.search(r"^\s*(import dns\b|from dns\b)", path.read_text(), re.M)
    )
    assert importers == ["resolvers/_dnspython.py"]


def test_a_load_balancer_names_a_listener_per_protocol_amqps_too() -> None:
    from resolvers import LoadBalancer
    from smartclient.resolution import through

    lb = LoadBalancer("lb:5551", amqp=5672, amqp_tls=5671, mqtt=1883, mqtt_tls="lb2:8883")
    assert through(lb, "amqp/ssl") == Address("lb", 5671)
    assert through(lb, "amqp") == Address("lb", 5672)
    assert through(lb, "mqtt/ssl") == Address("lb2", 8883)
    assert repr(lb) == ("LoadBalancer('lb:5551', amqp='lb:5672', mqtt='lb:1883', mqtt_tls='lb2:8883', "
                        "amqp_tls='lb:5671')")
    with pytest.raises(ConfigurationError, match=r"LoadBalancer\(\.\.\., amqp_tls=PORT\)"):
        through(LoadBalancer("lb:5551", amqp=5672), "amqp/ssl")

"""Address parsing, stream URIs and the small settings objects."""

import pytest

from smartclient import Address, ConfigurationError, Credentials, PoolLimits, parse_stream_uri


@pytest.mark.parametrize("text, expected", [
    ("node-1:5552", Address("node-1", 5552)),
    ("[::1]:5551", Address("::1", 5551)),
    (" 10.0.0.1:1 ", Address("10.0.0.1", 1)),
])
def test_parse(text: str, expected: Address) -> None:
    assert Address.parse(text) == expected


def test_parse_default_port_and_str() -> None:
    assert Address.parse("node-1", default_port=5552) == Address("node-1", 5552)
    assert str(Address("::1", 5552)) == "[::1]:5552" and str(Address("a", 1)) == "a:1"


@pytest.mark.parametrize("text, message", [
    ("", "empty address"), ("node-1", "has no port"), ("node:abc", "is not a number"),
    ("[::1", "without closing"), ("node:70000", "port of node must be an int from 1 to 65535, not 70000"),
    (":5552", "Address.host must be a non-empty str"),
])
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Address.parse(text)


def test_stream_uris() -> None:
    uri = parse_stream_uri("rabbitmq-stream://app:s%40cret@lb.example:6000/%2F")
    assert (uri.address, uri.tls, uri.vhost) == (Address("lb.example", 6000), False, "/")
    assert uri.credentials == Credentials("app", "s@cret")
    assert "s@cret" not in repr(uri) and "s@cret" not in repr(uri.credentials) and "***" in str(uri.credentials)
    tls = parse_stream_uri("rabbitmq-stream+tls://lb.example/prod")
    assert (tls.address.port, tls.tls, tls.vhost, tls.credentials) == (5551, True, "prod", None)
    assert parse_stream_uri("rabbitmq-stream://h").address == Address("h", 5552)


@pytest.mark.parametrize("uri, message", [
    ("amqp://h:5672", "unsupported URI scheme 'amqp'"),
    ("rabbitmq-stream://user@h", "names user 'user' without a password"),
    ("rabbitmq-stream://h:99999", "malformed stream URI"),
    ("rabbitmq-stream://:5552", "has no host"),
    ("rabbitmq-stream://h/a/b", "more than a vhost"),
    ("rabbitmq-stream://h/?x=1", "query or fragment"),
])
def test_bad_uris(uri: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_stream_uri(uri)


def test_bad_uri_messages_never_show_the_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_stream_uri("rabbitmq-stream://u:topsecret@h/a/b")
    assert "topsecret" not in str(info.value) and "u:***@h" in str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_streams_per_connection": 0}, "max_streams_per_connection must be an int from 1 to 200, not 0"),
    ({"max_streams_per_connection": 201}, "from 1 to 200"),
    ({"idle_timeout": -1}, "idle_timeout must be a non-negative number"),
])
def test_pool_limits_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        PoolLimits(**kwargs)  # type: ignore[arg-type]

"""``StreamConnection``: how executors reach the cluster; small, frozen and picklable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from smartclient._errors import ConfigurationError
from smartclient.core.address import Address
from smartclient.core.settings import ConnectionOptions, Credentials, parse_stream_uri
from smartclient.core.validation import resolver, text

if TYPE_CHECKING:
    from smartclient.stream.wing import StreamWing

__all__ = ["StreamConnection", "flag_option"]


@dataclass(frozen=True)
class StreamConnection:
    """What an executor needs to open an Environment: an entry-point URI (credentials may be in it or
    given apart) and a picklable resolver (``LoadBalancer``, ``StaticMap``, ``Identity`` or your own).

    The password never appears in ``repr``.  The object crosses to executors with the Spark job.
    """

    uri: str = field(repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    resolver: Any = None

    def __post_init__(self) -> None:
        parse_stream_uri(self.uri)  # a bad URI fails on the driver, not on every executor
        text("StreamConnection.username", self.username, optional=True)
        text("StreamConnection.password", self.password, empty=True, optional=True, secret=True)
        resolver("StreamConnection.resolver", self.resolver)

    @classmethod
    def from_options(cls, options: dict[str, str], role: str) -> StreamConnection:
        """The connection the ``rabbitmq_stream`` format's options describe (keys lower-cased, as Spark passes them):
        ``uri``, and ``loadBalancer`` (``host:port``) for a :class:`~resolvers.LoadBalancer`.

        :raises ConfigurationError: no ``uri``, or either malformed."""
        uri = options.get("uri")
        if not uri:
            raise ConfigurationError(f"the rabbitmq_stream {role} needs option('uri', 'rabbitmq-stream://...')")
        resolver = None
        if options.get("loadbalancer"):
            from resolvers import LoadBalancer

            resolver = LoadBalancer(Address.parse(options["loadbalancer"]))
        return cls(uri, resolver=resolver)

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.uri, self.username, self.password, repr(self.resolver))

    def environment(self) -> StreamWing:
        """The stream wing this connection describes (a task's only need: no other wing is built)."""
        from smartclient.options import ClientSettings, client_settings
        from smartclient.stream.wing import StreamWing

        given = parse_stream_uri(self.uri).credentials or Credentials()
        credentials = Credentials(self.username if self.username is not None else given.username,
                                  self.password if self.password is not None else given.password)
        named = ConnectionOptions(name="smartclient-spark")
        settings, entries, _ = client_settings(
            self.uri, ClientSettings(credentials, resolver=self.resolver, connection=named), vhost_given=False)
        return StreamWing(settings, entries)


def flag_option(options: dict[str, str], name: str, default: bool) -> bool:
    """The ``rabbitmq_stream`` format's option ``name`` (as documented, ``failOnDataLoss``; Spark passes the keys
    lower-cased) as a boolean.

    :raises ConfigurationError: neither ``true`` nor ``false``, naming the option."""
    raw = options.get(name.lower())
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigurationError(f"rabbitmq_stream option {name}={raw!r}: use 'true' or 'false'")
    return value == "true"

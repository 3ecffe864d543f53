"""The one seam to dnspython: build its resolver, and map its errors onto smartclient's tree.

Every call into dnspython (:class:`~resolvers.DnsResolver`, :class:`~resolvers.SrvDiscovery`) runs inside
:func:`dnspython_errors`, so no dnspython exception reaches a caller:

* bad input (a name server that is neither an IP address nor an ``https://`` URL, a bad port, no system
  configuration) is :class:`ConfigurationError`, naming the value;
* NXDOMAIN, no answer, no name server answering, a malformed name are :class:`ResolutionError`;
* no answer within the lifetime is :class:`ResolutionTimeout`.

dnspython is imported here, lazily, and nowhere else in the library (the ``[dns]`` extra).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from smartclient._errors import ConfigurationError, ResolutionError, ResolutionTimeout, SmartClientError
from smartclient.core.validation import number, refuse, whole

__all__ = ["dns_resolver_for", "dnspython_errors", "servers_asked"]


def servers_asked(nameservers: Sequence[str] | None, port: int) -> str:
    """Which name servers a lookup asks, for messages: ``name servers 10.0.0.2 port 53`` or ``system DNS``."""
    return f"name servers {', '.join(nameservers)} port {port}" if nameservers else "system DNS"


@contextmanager
def dnspython_errors(subject: str, where: str = "system DNS") -> Iterator[None]:
    """Run a dnspython call, raising smartclient's errors instead of dnspython's (``raise ... from exc``).

    :param subject: what was being configured or looked up, for the message (``name server 'x'``,
        ``rabbit-1.example``, ``SRV _rabbitmq-stream._tcp.example``).
    :param where: which name servers were asked, for the message.
    :raises ConfigurationError: dnspython refused a value it was given (the message names it).
    :raises ResolutionTimeout: no name server answered within the timeout.
    :raises ResolutionError: the name does not exist, has no such record, is malformed, or every name
        server failed.
    """
    import dns.exception
    import dns.resolver

    try:
        yield
    except SmartClientError:
        raise
    except dns.resolver.NXDOMAIN as exc:
        raise ResolutionError(f"{subject} does not exist (NXDOMAIN from {where})") from exc
    except dns.exception.Timeout as exc:
        raise ResolutionTimeout(f"no answer for {subject} from {where} within the timeout") from exc
    except dns.resolver.NoAnswer as exc:
        raise ResolutionError(f"{subject} has no record of the type asked ({where})") from exc
    except dns.resolver.NoNameservers as exc:
        raise ResolutionError(f"no name server answered for {subject} ({where}): {exc}") from exc
    except dns.resolver.NoResolverConfiguration as exc:
        raise ConfigurationError(f"{subject} is unusable ({exc}); give the name servers explicitly") from exc
    except dns.exception.DNSException as exc:  # a malformed name (empty or too long label), YXDOMAIN...
        raise ResolutionError(f"{subject} could not be resolved ({where}): {type(exc).__name__}: {exc}") from exc
    except (ValueError, TypeError) as exc:  # dnspython refused a setting
        raise ConfigurationError(f"bad {subject}: {exc}") from exc
    except OSError as exc:  # a socket error dnspython did not turn into NoNameservers
        raise ResolutionError(f"{subject} could not be resolved ({where}): {type(exc).__name__}: {exc}") from exc


def dns_resolver_for(nameservers: Sequence[str] | None, port: int, timeout: float) -> Any:
    """A ``dns.asyncresolver.Resolver`` for these name servers (the system's when None).

    :raises ConfigurationError: dnspython is not installed; no name server, a name server that is not an IP
        address (or an ``https://`` URL), a port outside 1-65535, a timeout that is not positive; or, with
        None, no system DNS configuration.
    """
    try:
        import dns.asyncresolver
    except ImportError as exc:  # pragma: no cover - depends on the extras installed
        raise ConfigurationError("DNS resolution needs dnspython: pip install 'smartclient[dns]'") from exc
    number("timeout", timeout, above=0, note="seconds, for one lookup")
    whole("port", port, low=1, high=65535, note="the name servers' port")
    if nameservers is not None and (isinstance(nameservers, str | bytes | Mapping) or
                                    not isinstance(nameservers, Collection)):
        refuse("nameservers", "a list of name servers' IP addresses, or None (the system's)", nameservers)
    with dnspython_errors("the system's DNS configuration"):
        resolver = dns.asyncresolver.Resolver(configure=nameservers is None)
    if nameservers is not None:
        servers = list(nameservers)
        if not servers:
            raise ConfigurationError("DnsResolver needs at least one name server")
        for server in servers:  # one at a time, so that the error names the bad one
            if not isinstance(server, str):
                raise ConfigurationError(f"bad name server {server!r} in nameservers {servers!r}: give an IP "
                                         f"address as a str")
            with dnspython_errors(f"name server {server!r}"):
                resolver.nameservers = [server]
        resolver.nameservers = servers
        resolver.port = port
    resolver.lifetime = timeout
    resolver.timeout = timeout
    return resolver

"""The resolver contract: one method, ``resolve(address) -> address``, and what a resolver may declare beside it.

A resolver is any callable of an address, any object with ``resolve`` (either may be a coroutine function), or a
:class:`Resolver`.  :func:`as_resolver` turns each into a :class:`Resolver`, whose every optional member has a
default; smartclient reads only those, never an attribute it has to probe for.  To declare more than ``resolve``,
derive from :class:`Resolver` and override:

* ``blocking`` (default True): ``resolve`` may block (a file, a lookup), so a synchronous one runs on a worker
  thread; the built-in pure resolvers say False.
* ``listens()`` (default False), ``address_for(protocol)`` and ``option_for(protocol)``: the resolver sends
  every connection to one place with a listener per protocol (a load balancer, an SNI ingress); ``address_for``
  is its listener for ``stream``, ``amqp``, ``amqp/ssl``, ``mqtt`` or ``mqtt/ssl`` (None: it has none), and
  ``option_for`` the keyword that gives it one (named in the error when it has none).
* ``tls_name(address)`` (default None): the name TLS must verify for connections aimed at ``address`` (a load
  balancer names itself); None lets smartclient's rule decide (:mod:`smartclient.core.tls_names`).
* ``routes_by_name()`` (default False) and ``sni_name(node, protocol)``: the resolver sends every connection to
  an ingress that routes it by the name in its TLS hello; ``sni_name`` is the name that reaches ``node``.
  smartclient sends and verifies it, and checks that each connection reached that node.
* ``parts()`` (default none): the resolvers it is made of (a :class:`~resolvers.Chain`'s steps), and
  ``cache_counts()`` (default None): its lookups asked and answered from a cache (a DNS resolver's), for metrics.

Where the answers are used, and the node check that follows every connection, live in smartclient
(:mod:`smartclient.resolution`), never in a resolver.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Protocol, runtime_checkable

from smartclient._errors import ConfigurationError, ResolutionError, SmartClientError
from smartclient.core.address import Address

__all__ = ["AsyncResolve", "Resolver", "ResolverLike", "Resolves", "as_async", "as_resolver", "coerce_address"]


@runtime_checkable
class Resolves(Protocol):
    """The one required method: the address to dial for ``address`` (an advertised node), sync or async."""

    def resolve(self, address: Address) -> Address | Awaitable[Address]: ...


class Resolver:
    """The whole resolver contract, each optional member with its default (see the module docstring)."""

    #: ``resolve`` may block: a synchronous one runs on a worker thread (the built-in pure ones say False)
    blocking: ClassVar[bool] = True

    def resolve(self, address: Address) -> Address | Awaitable[Address]:
        """The address to dial for ``address``."""
        raise NotImplementedError(f"{type(self).__name__} must define resolve(address)")

    def listens(self) -> bool:
        """Whether every connection goes to one place with a listener per protocol (:meth:`address_for`)."""
        return False

    def address_for(self, protocol: str) -> Address | None:
        """The listener for ``protocol`` of the place every connection goes to, None if it has none."""
        return None

    def option_for(self, protocol: str) -> str:
        """The keyword that gives this resolver a listener for ``protocol`` (named in errors)."""
        return protocol.replace("/ssl", "_tls")

    def tls_name(self, address: Address) -> str | None:
        """The name TLS verifies for connections aimed at ``address``; None: smartclient's rule decides."""
        return None

    def routes_by_name(self) -> bool:
        """Whether every connection goes to an ingress that routes it by its SNI name (:meth:`sni_name`)."""
        return False

    def sni_name(self, node: str, protocol: str = "stream") -> str:
        """The SNI name that reaches ``node`` over ``protocol`` (asked only when :meth:`routes_by_name`)."""
        raise ConfigurationError(f"{self!r} does not route connections by name")

    def parts(self) -> tuple[Resolver, ...]:
        """The resolvers this one is made of (a Chain's steps), for what is measured of each."""
        return ()

    def cache_counts(self) -> tuple[int, int] | None:
        """``(lookups asked, answers taken from a cache)`` of a resolver that looks names up; None otherwise."""
        return None

    @property
    def resolver_name(self) -> str:
        """What logs and metrics call it."""
        return type(self).__name__


class _Plain(Resolver):
    """A resolver given as a function, or as an object with ``resolve`` that does not derive from
    :class:`Resolver`: ``resolve`` alone, every other member its default."""

    def __init__(self, resolve: Callable[[Address], Any], given: object, name: str) -> None:
        self._resolve, self.given, self._name = resolve, given, name
        self.plain_blocking = not inspect.iscoroutinefunction(resolve)

    def resolve(self, address: Address) -> Address | Awaitable[Address]:
        result: Address | Awaitable[Address] = self._resolve(address)
        return result

    @property
    def resolver_name(self) -> str:
        return self._name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Plain) and other.given == self.given

    def __hash__(self) -> int:
        return hash(self.given)

    def __repr__(self) -> str:
        return repr(self.given)


ResolverLike = Resolver | Resolves | Callable[[Address], Any]
AsyncResolve = Callable[[Address], Awaitable[Address]]


def as_resolver(resolver: ResolverLike) -> Resolver:
    """``resolver`` as a :class:`Resolver`: itself, or a function or ``resolve`` method wrapped with every optional
    member's default.

    :raises ResolutionError: ``resolver`` is no resolver (no ``resolve``, not callable)."""
    if isinstance(resolver, Resolver):
        return resolver
    if isinstance(resolver, Resolves):
        return _Plain(resolver.resolve, resolver, type(resolver).__name__)
    if callable(resolver):
        function = inspect.isfunction(resolver) or inspect.ismethod(resolver)
        return _Plain(resolver, resolver, resolver.__name__ if function else type(resolver).__name__)
    raise ResolutionError(f"{resolver!r} is not a resolver: it has no resolve() and is not callable")


def coerce_address(value: object, source: str) -> Address:
    """Accept an ``Address``, ``"host:port"`` or ``(host, port)`` from a resolver; refuse anything else."""
    if isinstance(value, Address):
        return value
    try:
        if isinstance(value, str):
            return Address.parse(value)
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int):
            return Address(value[0], value[1])
    except SmartClientError as exc:
        raise ResolutionError(f"{source} returned {value!r}, which is not a usable address: {exc}") from None
    raise ResolutionError(
        f"{source} returned {value!r} ({type(value).__name__}); a resolver must return an Address, "
        f"'host:port' or (host, port)"
    )


def as_async(resolver: ResolverLike) -> AsyncResolve:
    """Wrap any resolver as ``async (Address) -> Address`` with errors mapped to :class:`ResolutionError`; a
    synchronous ``resolve`` that may block runs on a worker thread."""
    contract = as_resolver(resolver)
    func = contract.resolve
    blocking = (contract.plain_blocking if isinstance(contract, _Plain) else contract.blocking) \
        and not inspect.iscoroutinefunction(func)
    name = contract.resolver_name

    async def resolve(address: Address) -> Address:
        try:
            if blocking:
                result: Any = await asyncio.to_thread(func, address)
            else:
                result = func(address)
            if inspect.isawaitable(result):
                result = await result
        except SmartClientError:
            raise
        except Exception as exc:
            raise ResolutionError(f"resolver {name} failed on {address}: {type(exc).__name__}: {exc}") from exc
        return coerce_address(result, f"resolver {name} (for {address})")

    return resolve

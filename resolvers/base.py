"""The resolver contract: one method, ``resolve(address) -> address``.

A resolver is any object with ``resolve`` or any callable; either may be a
coroutine function.  :func:`as_async` turns each into one async callable that
never blocks the event loop: plain synchronous callables run in a worker
thread unless they declare ``blocking = False`` (the built-in pure resolvers do).

TLS naming is the contract's one optional addition (:class:`NamesTls`): a resolver that sends connections
somewhere whose certificate carries another name (a load balancer names itself) says so with
``tls_name(address) -> str | None``.  Without it, smartclient's rule decides (see
:mod:`smartclient.core.tls_names`).  A resolver that routes by that name instead (an SNI ingress,
:class:`RoutesByName`) gives the name of a *node*, ``sni_name(node, protocol) -> str``; smartclient hands it
the node's name and checks that each connection reached that node.  Where the answer is used, and the node check that
follows every connection, live in smartclient (:mod:`smartclient.resolution`), never in a resolver.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from smartclient._errors import ResolutionError, SmartClientError
from smartclient.core.address import Address
from smartclient.core.tls_names import NamesTls, RoutesByName

__all__ = ["AsyncResolve", "ListensPerProtocol", "NamesTls", "Resolver", "ResolverLike", "RoutesByName", "as_async",
           "coerce_address"]


@runtime_checkable
class Resolver(Protocol):
    """The one method: the address to dial for ``address`` (an advertised node), sync or async."""

    def resolve(self, address: Address) -> Address | Awaitable[Address]: ...


@runtime_checkable
class ListensPerProtocol(Protocol):
    """A resolver that sends every connection to one place with a listener per protocol (a load balancer, an SNI
    ingress): ``address_for("amqp")`` is where AMQP connections go, None if it has no such listener."""

    def address_for(self, protocol: str) -> Address | None: ...


ResolverLike = Resolver | Callable[[Address], Any]
AsyncResolve = Callable[[Address], Awaitable[Address]]


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
    """Wrap any resolver as ``async (Address) -> Address`` with errors mapped to :class:`ResolutionError`."""
    func: Callable[[Address], Any]
    if hasattr(resolver, "resolve") and callable(resolver.resolve):
        func = resolver.resolve
    elif callable(resolver):
        func = resolver
    else:
        raise ResolutionError(f"{resolver!r} is not a resolver: it has no resolve() and is not callable")
    name = getattr(resolver, "__name__", None) or type(resolver).__name__
    blocking = getattr(resolver, "blocking", True) and not inspect.iscoroutinefunction(func)

    async def resolve(address: Address) -> Address:
        try:
            if blocking:
                result = await asyncio.to_thread(func, address)
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

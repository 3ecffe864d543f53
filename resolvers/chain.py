"""``Chain``: apply several resolvers in order, each to the previous one's answer."""

from __future__ import annotations

from smartclient._errors import ConfigurationError
from smartclient.core import validation
from smartclient.core.address import Address

from .base import NamesTls, ResolverLike, RoutesByName, as_async

__all__ = ["Chain"]


class Chain:
    """``Chain(StaticMap(...), DnsResolver(...))``: remap names, then resolve them."""

    def __init__(self, *resolvers: ResolverLike) -> None:
        for i, step in enumerate(resolvers):
            validation.resolver(f"resolver {i} of the Chain", step, optional=False)
            if isinstance(step, RoutesByName):
                raise ConfigurationError(
                    f"resolver {i} of the Chain, {step!r}, decides both where every connection goes and the name it "
                    f"sends, and the node checks depend on it: give it as the resolver itself, not in a Chain")
        self.resolvers = resolvers
        self._steps = [as_async(r) for r in resolvers]

    async def resolve(self, address: Address) -> Address:
        for step in self._steps:
            address = await step(address)
        return address

    def tls_name(self, address: Address) -> str | None:
        """The name of the last step that names one (a LoadBalancer before a DnsResolver, say)."""
        name = None
        for resolver in self.resolvers:
            if isinstance(resolver, NamesTls):
                name = resolver.tls_name(address) or name
        return name

    def __repr__(self) -> str:
        return "Chain(" + ", ".join(map(repr, self.resolvers)) + ")"

"""``Chain``: apply several resolvers in order, each to the previous one's answer."""

from __future__ import annotations

from smartclient._errors import ConfigurationError
from smartclient.core import validation
from smartclient.core.address import Address

from .base import Resolver, ResolverLike, as_async, as_resolver

__all__ = ["Chain"]


class Chain(Resolver):
    """``Chain(StaticMap(...), DnsResolver(...))``: remap names, then resolve them.  It declares what its steps
    declare: the listeners of a step that listens per protocol (a load balancer in it), and the TLS name of the
    last step that names one."""

    def __init__(self, *resolvers: ResolverLike) -> None:
        for i, step in enumerate(resolvers):
            validation.resolver(f"resolver {i} of the Chain", step, optional=False)
        self.resolvers = resolvers
        self._contracts = tuple(as_resolver(r) for r in resolvers)
        for i, contract in enumerate(self._contracts):
            if contract.routes_by_name():
                raise ConfigurationError(
                    f"resolver {i} of the Chain, {contract!r}, decides both where every connection goes and the name "
                    f"it sends, and the node checks depend on it: give it as the resolver itself, not in a Chain")
        self._steps = [as_async(r) for r in self._contracts]

    async def resolve(self, address: Address) -> Address:
        for step in self._steps:
            address = await step(address)
        return address

    def _listening(self) -> Resolver | None:
        return next((step for step in self._contracts if step.listens()), None)

    def listens(self) -> bool:
        return self._listening() is not None

    def address_for(self, protocol: str) -> Address | None:
        """The listener for ``protocol`` of the step that listens per protocol (a load balancer in the chain)."""
        step = self._listening()
        return step.address_for(protocol) if step is not None else None

    def option_for(self, protocol: str) -> str:
        step = self._listening()
        return step.option_for(protocol) if step is not None else super().option_for(protocol)

    def tls_name(self, address: Address) -> str | None:
        """The name of the last step that names one (a LoadBalancer before a DnsResolver, say)."""
        name = None
        for step in self._contracts:
            name = step.tls_name(address) or name
        return name

    def parts(self) -> tuple[Resolver, ...]:
        return self._contracts

    def __repr__(self) -> str:
        return "Chain(" + ", ".join(map(repr, self.resolvers)) + ")"

"""Address resolvers for smartclient: one method, ``resolve(address) -> address``.

The resolvers themselves arrive with the stream Environment; this package
exists from the start so that the distribution ships both import packages.
"""

from __future__ import annotations

__all__: list[str] = []

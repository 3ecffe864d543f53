"""The connections a role shares, by node: the ``Kept`` hook a placement is offered them through (see
:mod:`smartclient.core.landing`).  No I/O.

A placement's look here costs the same at a million producers and consumers on a hundred nodes as at a thousand
(``bench/placement_cost.py``): the full connections are set aside until one has room again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, Protocol, TypeVar

from smartclient.core.address import Address

__all__ = ["Shareable", "Shared"]

S = TypeVar("S", bound="Shareable")


class Shareable(Protocol):
    """A connection several producers (or consumers) may share: the node it reached, and whether it can
    take one more."""

    @property
    def node(self) -> Address: ...

    def alive(self) -> bool: ...

    def has_room(self) -> bool: ...


class Shared(Generic[S]):
    """The connections a role shares, by the node each reached: the :class:`Kept` hook that offers one alive on
    one of ``nodes`` with room for another stream (it stays shared: taking it takes nothing away).

    What a look costs does not grow with the connections: those found full are set aside, and come back when
    they are told to have :meth:`room` again (an id given back), so the look meets the open ones of the nodes
    asked (usually one each), the oldest first.  A connection found dead on the way is dropped."""

    def __init__(self, connections: Iterable[S] = ()) -> None:
        self._members: dict[int, S] = {}  # by id(): connections compare by identity
        self._open: dict[Address, dict[int, S]] = {}  # by node: the connections that may have room
        self._full: dict[int, S] = {}  # those found full
        for connection in connections:
            self.add(connection)

    def add(self, connection: S) -> None:
        """Share ``connection`` (again: a no-op)."""
        if id(connection) not in self._members:
            self._members[id(connection)] = connection
            self._open.setdefault(connection.node, {})[id(connection)] = connection

    def discard(self, connection: S) -> bool:
        """Stop sharing ``connection``: whether it was shared."""
        key = id(connection)
        if self._members.pop(key, None) is None:
            return False
        if self._full.pop(key, None) is None:
            self._close_gap(connection.node, key)
        return True

    def room(self, connection: S) -> None:
        """``connection`` has room again (an id was given back): offered again if it was set aside as full."""
        key = id(connection)
        if self._full.pop(key, None) is not None:
            self._open.setdefault(connection.node, {})[key] = connection

    def _close_gap(self, node: Address, key: int) -> None:
        on_node = self._open[node]
        del on_node[key]
        if not on_node:
            del self._open[node]

    def __contains__(self, connection: object) -> bool:
        return id(connection) in self._members

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[S]:
        return iter(list(self._members.values()))

    def take(self, nodes: tuple[Address, ...]) -> S | None:
        for node in nodes:
            found: S | None = None
            passed: list[tuple[int, S]] = []
            for key, connection in self._open.get(node, {}).items():
                if connection.alive() and connection.has_room():
                    found = connection
                    break
                passed.append((key, connection))
            for key, connection in passed:  # set aside if full, dropped if dead
                self._close_gap(node, key)
                if connection.alive():
                    self._full[key] = connection
                else:
                    del self._members[key]
            if found is not None:
                return found
        return None

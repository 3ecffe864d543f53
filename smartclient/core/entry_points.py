"""The first entry point that answers: one decision for every protocol.  No I/O.

A connection that may sit on any node (the stream locator; an AMQP or MQTT connection on "any node" with
only entry points to go by) goes to the first entry point that answers.  :class:`EntryPoints` holds that
loop as pure decisions, dnspython's ``_Resolution`` again: which address to try next, which failure ends
the loop at once, and the error that lists every address tried.  The async stream shell and the sync
AMQP/MQTT shell drive it the same way and differ only in how they dial::

    entries = EntryPoints(addresses, "the stream locator")
    while (entry := entries.next_entry()) is not None:
        try:
            connection = dial(entry)
        except SmartClientError as exc:
            entries.failed(entry, dialled, exc)     # raises exc itself when every entry point would repeat it
            continue
        return connection
    raise entries.error()
"""

from __future__ import annotations

from collections.abc import Iterable

from smartclient._errors import REFUSALS, ConnectionFailed
from smartclient.core.address import Address
from smartclient.core.landing import Attempt, summarise

__all__ = ["EntryPoints"]


class EntryPoints:
    """Each entry point once, in the order given, until one answers (see the module docstring).

    Only a :class:`ConnectionFailed` moves on to the next entry point.  Refused credentials or vhost and a
    rejected certificate (the same on every node), a resolver or allow-list error, and anything else are
    raised at once by :meth:`failed`.
    """

    def __init__(self, entries: Iterable[Address], purpose: str) -> None:
        self.entries = tuple(entries)
        self.purpose = purpose  #: what the connection is for, as the error names it
        self.attempts: list[Attempt] = []  #: every failed try: the entry point, what was dialled, why
        self._next = 0
        self._last_error: BaseException | None = None

    def next_entry(self) -> Address | None:
        """The entry point to dial next, or None when every one has been tried (then raise :meth:`error`)."""
        if self._next >= len(self.entries):
            return None
        self._next += 1
        return self.entries[self._next - 1]

    def failed(self, entry: Address, dialled: Address | None, error: BaseException) -> None:
        """Dialling ``entry`` (``dialled``: what the resolver sent it to, if known) failed with ``error``.

        :raises BaseException: ``error`` itself, when another entry point would only repeat it.
        """
        if not isinstance(error, ConnectionFailed) or isinstance(error, REFUSALS):
            raise error
        self._last_error = error
        self.attempts.append(Attempt(entry, dialled, None, f"failed: {type(error).__name__}: {error}"))

    @property
    def tried(self) -> int:
        """Entry points dialled so far (the one that answered included)."""
        return self._next

    def error(self) -> ConnectionFailed:
        """The error once every entry point failed: each one listed, raised ``from`` the last failure."""
        if not self.entries:
            error = ConnectionFailed(f"no entry point could be reached for {self.purpose}: none was given")
        else:
            error = ConnectionFailed(
                f"no entry point could be reached for {self.purpose} ({len(self.entries)} tried): "
                f"{summarise(self.attempts)}")
        error.__cause__ = self._last_error
        return error

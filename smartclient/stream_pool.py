"""The seam between rstream and smartclient: rstream's ``ClientPool``, placed by the Environment.

rstream's ``Producer`` and ``Consumer`` get every connection from
``self._pool.get(...)``: without an address for the locator (metadata)
connection, and with the advertised address of the node rstream chose for a
stream.  :class:`PlacedClientPool` replaces that pool: the locator request
gets the Environment's one shared locator connection, and a stream request
gets a connection placed by smartclient's candidates and node check, whatever
address rstream chose.  ``tests/unit/test_rstream_seam.py`` fails loudly if
rstream moves this seam; the version range is pinned in ``pyproject.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rstream.client import Addr, Client, ClientPool
from rstream.constants import SlasMechanism

from .tls import NamedClient
from .topology import Role

if TYPE_CHECKING:
    from .connector import Connection
    from .environment import Environment

__all__ = ["LocatorClient", "PlacedClientPool"]

MAX_ITEM_ALLOWED = 200  # rstream.constants.MAX_ITEM_ALLOWED; the seam test checks it


class LocatorClient(NamedClient):
    """The Environment's shared metadata connection.  rstream closes its locator after each lookup;
    this one stays open until the Environment closes it with :meth:`shutdown`."""

    async def close(self) -> None:
        return None

    async def shutdown(self) -> None:
        await super().close()


class PlacedClientPool(ClientPool):
    """A ``ClientPool`` whose connections the Environment places (one per rstream Producer/Consumer)."""

    def __init__(self, env: Environment, role: Role) -> None:
        super().__init__(
            "placed-by-smartclient", 1, vhost="/", username="-", password="-",
            frame_max=env.settings.frame_max, heartbeat=env.settings.heartbeat,
            load_balancer_mode=False, max_retries=1,
        )
        self.env = env
        self.role = role
        self.placed: list[Connection] = []
        self.names: dict[str, str | None] = {}  # stream -> producer/consumer name, for the placement table

    async def get(
        self,
        connection_name: str | None,
        addr: Addr | None = None,
        connection_closed_handler: Any = None,
        stream: str | None = None,
        sasl_configuration_mechanism: SlasMechanism | None = None,
        max_clients_by_connections: int = MAX_ITEM_ALLOWED,
        locator_request: bool = False,
    ) -> Client:
        if addr is None or locator_request or stream is None:
            return await self.env._locator_client()
        conn = await self.env._place(self, stream, connection_closed_handler)
        return conn.client

    async def close(self) -> None:
        for conn in self.placed:
            await self.env.connector.close_connection(conn)
        self.placed.clear()
        self._clients.clear()

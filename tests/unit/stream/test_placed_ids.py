"""The ids a placed consumer takes (issue 32): a client refers to its Connection only weakly, so the Connection of
a connection that ended may be gone when an id is taken on its client; that id must still not be one the carrier
uses for another stream.  No broker: the placement is a stand-in."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from smartclient.core.address import Address
from smartclient.core.topology import Role
from smartclient.options import ClientSettings
from smartclient.stream._rstream import attach, connection_of
from smartclient.stream._rstream.placed import new_carrier
from smartclient.stream.host import Connection
from tests.unit.fakes import FakeClient


def test_an_id_taken_on_a_client_whose_connection_is_gone_is_not_one_in_use() -> None:
    async def scenario() -> None:
        settings = ClientSettings()
        carrier: Any = new_carrier(Role.CONSUMER, object(), settings, Address("127.0.0.1", 5552), "ids", 10)
        live, ended = FakeClient(), FakeClient()
        conn = Connection(live, Address("n1", 5552), Address("n1", 5552), "c1")
        attach(live, conn)
        carrier.smartclient_placed = live
        first = await carrier.get_available_id()
        carrier._subscribers[first] = "the subscriber of stream A"
        gone = Connection(ended, Address("n2", 5552), Address("n2", 5552), "c2")
        attach(ended, gone)
        del gone  # the connection ended, and nothing holds its Connection
        gc.collect()
        assert connection_of(ended) is None and connection_of(live) is conn
        carrier.smartclient_placed = ended
        second = await carrier.get_available_id()
        assert second != first and second not in carrier._subscribers
        assert carrier.smartclient_placed is None  # taken, not kept (with the ended client's buffers)

    asyncio.run(scenario())

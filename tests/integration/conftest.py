"""Shared helpers for tests against the real test bed (fixtures come from smartclient.testing)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from rstream.client import Client

from smartclient.testing import TestBed

pytestmark = pytest.mark.integration


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


@asynccontextmanager
async def stream_client(bed: TestBed, host: str, port: int, name: str = "") -> AsyncIterator[Client]:
    """A raw rstream client, authenticated; ``server_properties`` then holds the advertised node."""
    client = Client(host=host, port=port, frame_max=1048576, heartbeat=60, connection_name=name)
    await client.start()
    try:
        await client.authenticate(vhost="/", username=bed.username, password=bed.password)
        yield client
    finally:
        await client.close()


@pytest.fixture
def open_stream_client(testbed: TestBed) -> Callable[..., Any]:
    def opener(host: str, port: int, name: str = "") -> Any:
        return stream_client(testbed, host, port, name)

    return opener

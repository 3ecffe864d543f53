"""The Spark room's fixtures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from smartclient.spark import RabbitStreamDataSource, source

OPTIONS = {"uri": "rabbitmq-stream://h", "streams": "a,b"}


@pytest.fixture
def open_reader(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """Opens the source's stream reader (:data:`OPTIONS` and ``options``) over streams that end at ``latest``; a
    test moves their ends by changing ``reader.test_latest["latest"]``."""

    def opened(latest: dict[str, int], **options: str) -> Any:
        state = {"latest": dict(latest)}
        monkeypatch.setattr(source, "next_offsets", lambda connection, streams: dict(state["latest"]))
        reader = RabbitStreamDataSource({**OPTIONS, **options}).streamReader(None)
        reader.test_latest = state
        return reader

    return opened

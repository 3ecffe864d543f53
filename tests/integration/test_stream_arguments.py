"""What docs/streams.md says about declaration arguments, against the broker: every spelling of a known key
reaches it (``x-initial-cluster-size`` included), and an unknown key is refused before anything is sent."""

from __future__ import annotations

import pytest

from smartclient import ConfigurationError, Environment, StreamNotFound
from smartclient.testing import TestBed


@pytest.mark.parametrize("key", ["x-initial-cluster-size", "initial-cluster-size", "initial_cluster_size"])
async def test_initial_cluster_size_in_any_spelling_is_honoured(
    env: Environment, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, key: str
) -> None:
    assert len(rabbitmq_testbed.nodes) >= 3  # the default size would be every node
    await env.create_stream(rabbitmq_unique_name, {key: 2, "max-age": "7D"})
    try:
        with rabbitmq_testbed.management() as api:
            info = api.queue("/", rabbitmq_unique_name)
        assert len(info["members"]) == 2, info["members"]
        assert info["arguments"]["x-max-age"] == "7D"
    finally:
        await env.delete_stream(rabbitmq_unique_name)


@pytest.mark.parametrize("arguments", [{"x-max-length": 1000}, {"max-age-seconds": 3600},
                                       {"x-initial-cluster-size": 2, "x-queue-mode": "lazy"}])
async def test_an_unknown_key_is_refused_and_nothing_is_created(
    env: Environment, rabbitmq_unique_name: str, arguments: dict[str, object]
) -> None:
    unknown = next(k for k in arguments if k not in ("x-initial-cluster-size",))
    with pytest.raises(ConfigurationError, match=f"unknown stream argument {unknown!r}: the broker would ignore it"):
        await env.create_stream(rabbitmq_unique_name, arguments)
    with pytest.raises(StreamNotFound):
        await env.topology(rabbitmq_unique_name)  # nothing reached the broker

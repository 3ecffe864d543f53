"""The stream wing, over rstream: the Environment facade, placement shell, handles, publishing and super
streams.  The ``_rstream`` package is the one place that imports rstream and touches its internals."""

from typing import Any

_HANDLES = ("Consumer", "Producer", "RecoveryAttempt")  # what the old module smartclient.stream exported


def __getattr__(name: str) -> Any:
    if name == "Consumer":
        from smartclient.stream.consumer import Consumer

        return Consumer
    if name in _HANDLES:
        from smartclient.stream import handles

        return getattr(handles, name)
    raise AttributeError(f"module 'smartclient.stream' has no attribute {name!r}")

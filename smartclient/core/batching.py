"""How a producer batches and bounds what waits (:class:`BatchingPolicy`), and the fate of each message
(:class:`Confirmation`, with the client's own failure codes).  Pure values: the publish path that carries them
out is :mod:`smartclient.stream.publishing`."""

from __future__ import annotations

from dataclasses import dataclass

from smartclient._errors import ConfigurationError
from smartclient.core.validation import number, whole

__all__ = ["CONFIRM_TIMEOUT", "CONNECTION_LOST", "BatchingPolicy", "Confirmation"]

CONNECTION_LOST = -1  # Confirmation.code of a message failed by the client (recovery gave up, producer closed)
CONFIRM_TIMEOUT = -2  # Confirmation.code of a message not confirmed within BatchingPolicy.confirm_timeout


@dataclass(frozen=True)
class BatchingPolicy:
    """How ``send()`` batches.

    :param batch_size: messages per Publish frame, at most.
    :param linger: seconds a partial batch waits for more messages before it is sent; 0 (the default): it is sent
        as soon as the event loop is next free, so the messages sent in one pass of the loop share a frame (a
        tight loop of ``send()`` fills whole frames, a producer at a steady rate sends what each pass brought).
        A linger above 0 trades latency for fewer, fuller frames at low rates (``bench/latency.py``: 2 ms raised
        the p50 at 1k msg/s from 0.75 to 2.2 ms and the p99 at 10k msg/s from 3.1 to 5.2 ms, for no gain in
        throughput).
    :param max_in_flight: messages sent or queued but not yet confirmed, at most: ``send()`` waits
        (back-pressure) while the producer is at this cap.
    :param enqueue_timeout: seconds a ``send()`` waits for room under ``max_in_flight`` before it raises
        :class:`EnqueueTimeout` (the message was not queued).  30 s leaves room for a recovery to finish.
    :param confirm_timeout: seconds after which a queued message still not confirmed fails with code
        ``CONFIRM_TIMEOUT`` and a reason (it is not sent again; a named producer may send it again with its
        publishing id, and the broker stores it once).  0 turns it off.
    """

    batch_size: int = 1000
    linger: float = 0.0
    max_in_flight: int = 20_000
    enqueue_timeout: float = 30.0
    confirm_timeout: float = 60.0

    def __post_init__(self) -> None:
        whole("BatchingPolicy.batch_size", self.batch_size, low=1)
        number("BatchingPolicy.linger", self.linger, low=0, high=10, note="seconds")
        whole("BatchingPolicy.max_in_flight", self.max_in_flight, low=1)
        if self.max_in_flight < self.batch_size:
            raise ConfigurationError(f"BatchingPolicy.max_in_flight ({self.max_in_flight}) must be at least batch_size "
                                     f"({self.batch_size})")
        number("BatchingPolicy.enqueue_timeout", self.enqueue_timeout, above=0, high=3600, note="seconds")
        number("BatchingPolicy.confirm_timeout", self.confirm_timeout, low=0, high=86400, note="seconds; 0: off")


@dataclass(frozen=True)
class Confirmation:
    """The fate of one message: confirmed, or failed with the broker's code (``CONNECTION_LOST``, -1,
    when the client gave up on it) and a reason."""

    publishing_id: int
    confirmed: bool
    code: int = 1
    reason: str = ""

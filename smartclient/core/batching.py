"""How a producer batches and bounds what waits (:class:`BatchingPolicy`), and the fate of each message
(:class:`Confirmation`, with the client's own failure codes).  Pure values: the publish path that carries them
out is :mod:`smartclient.stream.publishing`."""

from __future__ import annotations

from dataclasses import dataclass

from smartclient._errors import ConfigurationError

__all__ = ["CONFIRM_TIMEOUT", "CONNECTION_LOST", "BatchingPolicy", "Confirmation"]

CONNECTION_LOST = -1  # Confirmation.code of a message failed by the client (recovery gave up, producer closed)
CONFIRM_TIMEOUT = -2  # Confirmation.code of a message not confirmed within BatchingPolicy.confirm_timeout


@dataclass(frozen=True)
class BatchingPolicy:
    """How ``send()`` batches.

    :param batch_size: messages per Publish frame, at most.
    :param linger: seconds a partial batch waits for more messages before it is sent.
    :param max_in_flight: messages sent or queued but not yet confirmed, at most: ``send()`` waits
        (back-pressure) while the producer is at this cap.
    :param enqueue_timeout: seconds a ``send()`` waits for room under ``max_in_flight`` before it raises
        :class:`EnqueueTimeout` (the message was not queued).  30 s leaves room for a recovery to finish.
    :param confirm_timeout: seconds after which a queued message still not confirmed fails with code
        ``CONFIRM_TIMEOUT`` and a reason (it is not sent again; a named producer may send it again with its
        publishing id, and the broker stores it once).  0 turns it off.
    """

    batch_size: int = 1000
    linger: float = 0.002
    max_in_flight: int = 20_000
    enqueue_timeout: float = 30.0
    confirm_timeout: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigurationError(f"batch_size must be a positive int, not {self.batch_size!r}")
        if not 0 <= self.linger <= 10:
            raise ConfigurationError(f"linger must be between 0 and 10 seconds, not {self.linger!r}")
        if self.max_in_flight < self.batch_size:
            raise ConfigurationError(f"max_in_flight ({self.max_in_flight}) must be at least batch_size "
                                     f"({self.batch_size})")
        if not 0 < self.enqueue_timeout <= 3600:
            raise ConfigurationError(f"enqueue_timeout must be more than 0 and at most 3600 seconds, not "
                                     f"{self.enqueue_timeout!r}")
        if not 0 <= self.confirm_timeout <= 86400:
            raise ConfigurationError(f"confirm_timeout must be 0 (off) to 86400 seconds, not {self.confirm_timeout!r}")


@dataclass(frozen=True)
class Confirmation:
    """The fate of one message: confirmed, or failed with the broker's code (``CONNECTION_LOST``, -1,
    when the client gave up on it) and a reason."""

    publishing_id: int
    confirmed: bool
    code: int = 1
    reason: str = ""

"""smartclient: put every RabbitMQ connection on the right node.

Stream producers go to the leader, consumers to replicas, through any
resolver (direct, NAT/containers, DNS, load balancer).  The backends
(rstream, pika, paho-mqtt, dnspython, pyspark) are optional extras and are
imported lazily, so importing :mod:`smartclient` costs nothing.
"""

from __future__ import annotations

from ._errors import (
    ConfigurationError,
    FaultUnavailable,
    PrerequisiteMissing,
    SmartClientError,
    TestBedError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "FaultUnavailable",
    "PrerequisiteMissing",
    "SmartClientError",
    "TestBedError",
    "__version__",
]

"""smartclient: put every RabbitMQ connection on the right node.

Stream producers go to the leader, consumers to replicas, through any
resolver (direct, NAT/containers, DNS, load balancer).  The backends
(rstream, pika, paho-mqtt, dnspython, pyspark) are optional extras and are
imported lazily, so importing :mod:`smartclient` costs nothing.
"""

from __future__ import annotations

from ._errors import (
    AddressNotAllowed,
    AuthenticationFailed,
    CertificateRejected,
    ConfigurationError,
    ConnectionFailed,
    FaultUnavailable,
    FeatureNotSupported,
    HandleClosed,
    MessageTooLarge,
    NoCandidateNode,
    NodeUnreachable,
    NoRpcServer,
    PlacementError,
    PrerequisiteMissing,
    PublishFailed,
    PublishingIdNotIncreasing,
    ResolutionError,
    ResolutionTimeout,
    RpcTimeout,
    SmartClientError,
    StepTimeout,
    StreamNotFound,
    TestBedError,
    TopologyError,
)
from .address import Address
from .environment import Environment, PlacementRecord
from .filters import StreamFilter
from .landing import Attempt
from .offsets import OffsetSpec, OffsetTracking
from .publishing import CONNECTION_LOST, BatchingPolicy, Confirmation
from .recovery import RecoveryPolicy
from .retry import RetryPolicy
from .routing import hash_partition
from .settings import Credentials, PoolLimits, parse_stream_uri
from .stream import Consumer, Producer
from .stream_arguments import StreamArguments
from .topology import Candidates, PlacementPolicy, Role, StreamTopology, TopologyNode

__version__ = "0.1.0"

__all__ = [
    "CONNECTION_LOST",
    "Address",
    "AddressNotAllowed",
    "Attempt",
    "AuthenticationFailed",
    "BatchingPolicy",
    "Candidates",
    "CertificateRejected",
    "ConfigurationError",
    "Confirmation",
    "ConnectionFailed",
    "Consumer",
    "Credentials",
    "Environment",
    "FaultUnavailable",
    "FeatureNotSupported",
    "HandleClosed",
    "MessageTooLarge",
    "NoCandidateNode",
    "NoRpcServer",
    "NodeUnreachable",
    "OffsetSpec",
    "OffsetTracking",
    "PlacementError",
    "PlacementPolicy",
    "PlacementRecord",
    "PoolLimits",
    "PrerequisiteMissing",
    "Producer",
    "PublishFailed",
    "PublishingIdNotIncreasing",
    "RecoveryPolicy",
    "ResolutionError",
    "ResolutionTimeout",
    "RetryPolicy",
    "Role",
    "RpcTimeout",
    "SmartClientError",
    "StepTimeout",
    "StreamArguments",
    "StreamFilter",
    "StreamNotFound",
    "StreamTopology",
    "TestBedError",
    "TopologyError",
    "TopologyNode",
    "__version__",
    "hash_partition",
    "parse_stream_uri",
]

"""smartclient: put every RabbitMQ connection on the right node.

Stream producers go to the leader, consumers to replicas, through any
resolver (direct, NAT/containers, DNS, load balancer).  The backends
(rstream, pika, paho-mqtt, dnspython, pyspark) are optional extras and are
imported lazily, so importing :mod:`smartclient` costs nothing.
"""

from __future__ import annotations

from smartclient._errors import (
    AddressNotAllowed,
    AuthenticationFailed,
    CallbackFailed,
    CertificateRejected,
    ConfigurationError,
    ConnectionFailed,
    DataLoss,
    EnqueueTimeout,
    FaultUnavailable,
    FeatureNotSupported,
    HandleClosed,
    HandleStopped,
    ManagementError,
    MessageDecodeError,
    MessageTooLarge,
    Misrouted,
    NoCandidateNode,
    NodeUnreachable,
    NodeUntold,
    NoRpcServer,
    PlacementError,
    PrerequisiteMissing,
    PublishFailed,
    PublishingIdNotIncreasing,
    PublishNotSent,
    RecoveryFailed,
    ResolutionError,
    ResolutionTimeout,
    RpcTimeout,
    SmartClientError,
    StepTimeout,
    StreamNotFound,
    StreamNotReady,
    TestBedError,
    TokenExpired,
    TokenProviderFailed,
    TokenRefused,
    TopologyError,
)
from smartclient.core.address import Address
from smartclient.core.delivery import Chunk, MessageContext
from smartclient.core.filters import StreamFilter
from smartclient.core.flow import ConsumerFlow
from smartclient.core.landing import Attempt
from smartclient.core.offsets import OffsetSpec, OffsetTracking
from smartclient.core.recovery import RecoveryEvent, RecoveryPolicy
from smartclient.core.retry import RetryPolicy
from smartclient.core.routing import hash_partition
from smartclient.core.settings import (
    ClientCertificate,
    ConnectionOptions,
    Credentials,
    PoolLimits,
    Telemetry,
    parse_stream_uri,
)
from smartclient.core.stream_arguments import StreamArguments
from smartclient.core.tokens import Token
from smartclient.core.topology import Candidates, PlacementPolicy, Role, StreamTopology, TopologyNode
from smartclient.credentials import EXTERNAL, TokenCredentials
from smartclient.environment import Environment
from smartclient.options import ClientSettings, ConsumerOptions, ProducerOptions
from smartclient.stream.consumer import Consumer
from smartclient.stream.handles import Producer
from smartclient.stream.host import PlacementRecord
from smartclient.stream.publishing import CONFIRM_TIMEOUT, CONNECTION_LOST, BatchingPolicy, Confirmation

__version__ = "0.1.0"

__all__ = [
    "CONFIRM_TIMEOUT",
    "CONNECTION_LOST",
    "EXTERNAL",
    "Address",
    "AddressNotAllowed",
    "Attempt",
    "AuthenticationFailed",
    "BatchingPolicy",
    "CallbackFailed",
    "Candidates",
    "CertificateRejected",
    "Chunk",
    "ClientCertificate",
    "ClientSettings",
    "ConfigurationError",
    "Confirmation",
    "ConnectionFailed",
    "ConnectionOptions",
    "Consumer",
    "ConsumerFlow",
    "ConsumerOptions",
    "Credentials",
    "DataLoss",
    "EnqueueTimeout",
    "Environment",
    "FaultUnavailable",
    "FeatureNotSupported",
    "HandleClosed",
    "HandleStopped",
    "ManagementError",
    "MessageContext",
    "MessageDecodeError",
    "MessageTooLarge",
    "Misrouted",
    "NoCandidateNode",
    "NoRpcServer",
    "NodeUnreachable",
    "NodeUntold",
    "OffsetSpec",
    "OffsetTracking",
    "PlacementError",
    "PlacementPolicy",
    "PlacementRecord",
    "PoolLimits",
    "PrerequisiteMissing",
    "Producer",
    "ProducerOptions",
    "PublishFailed",
    "PublishNotSent",
    "PublishingIdNotIncreasing",
    "RecoveryEvent",
    "RecoveryFailed",
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
    "StreamNotReady",
    "StreamTopology",
    "Telemetry",
    "TestBedError",
    "Token",
    "TokenCredentials",
    "TokenExpired",
    "TokenProviderFailed",
    "TokenRefused",
    "TopologyError",
    "TopologyNode",
    "__version__",
    "hash_partition",
    "parse_stream_uri",
]

"""The one exception tree of smartclient.

Every error smartclient raises derives from :class:`SmartClientError`, so a
service can catch the whole library with one ``except``.  Errors of the
packages underneath (rstream, pika, paho-mqtt, dnspython, httpx) are mapped
onto this tree in one place per backend, with ``raise ... from exc``.

    SmartClientError
    ├── ConfigurationError          bad input, found before any I/O (also a ValueError)
    │   ├── PublishingIdNotIncreasing  a publishing id the broker would silently drop
    │   └── MessageTooLarge         a message that does not fit the negotiated frame max
    ├── ResolutionError             a resolver could not turn an address into a dialable one
    │   ├── AddressNotAllowed       the resolved address is outside the allow-list
    │   └── ResolutionTimeout       the DNS server did not answer in time
    ├── PlacementError              no connection to an acceptable node within the retry policy
    │   ├── NoCandidateNode         the topology has no node for this role (e.g. no replica)
    │   ├── NodeUnreachable         attempts kept landing on other nodes (a sticky LB)
    │   └── NoRpcServer             no RPC server bound on the node the request was published on
    ├── TopologyError               the broker could not describe the stream (no leader yet...)
    │   ├── StreamNotFound          the stream does not exist
    │   ├── StreamNotReady          no leader or member available yet (just created, or electing)
    │   └── DataLoss                offsets asked for are gone from the stream (retention truncated it)
    ├── FeatureNotSupported         the broker lacks a feature asked for (e.g. filtering before 3.13)
    ├── MessageDecodeError          a stored message is not what it was read as (raw bytes as AMQP 1.0)
    ├── PublishFailed               the broker answered a message with an error instead of a confirm
    │   ├── PublishNotSent          an MQTT message held while reconnecting was never sent (also a RuntimeError)
    │   └── EnqueueTimeout          no room under max_in_flight within enqueue_timeout; not queued
    ├── RpcTimeout                  an RPC request got no reply in time
    ├── ConnectionFailed            a connection could not be opened or kept
    │   ├── AuthenticationFailed    wrong credentials or no access to the vhost (never retried)
    │   │   ├── TokenExpired        the token was past its expiry when a connection needed it
    │   │   └── TokenRefused        the broker refused a fresh token on a live connection (revoked)
    │   ├── TokenProviderFailed     the token provider raised or answered no token (retried on a back-off)
    │   ├── CertificateRejected     the TLS certificate does not verify for the name checked (never retried)
    │   ├── Misrouted               an SNI-routed connection reached another node than the name it sent
    │   ├── NodeUntold              the management API did not say in time which node a connection reached
    │   └── StepTimeout             one step of a placement or recovery attempt ran out of the attempt's time
    ├── HandleClosed                the producer, consumer or Environment was closed; nothing was sent
    ├── HandleStopped               a producer or consumer stopped on its own (its ``failure``)
    │   ├── RecoveryFailed          recovery gave up (or is disabled) after a loss
    │   └── CallbackFailed          a consumer's callback raised and ``on_error`` said stop
    ├── ManagementError             the management API answered an error (``status``; a 401 is
    │                               AuthenticationFailed) or was unreachable
    └── TestBedError                the local test bed could not do what was asked
        ├── PrerequisiteMissing     not root, no debootstrap, port taken, no Java...
        └── FaultUnavailable        this test bed (e.g. an external one) cannot inject that fault
"""

from __future__ import annotations

__all__ = [
    "AddressNotAllowed",
    "AuthenticationFailed",
    "CallbackFailed",
    "CertificateRejected",
    "ConfigurationError",
    "ConnectionFailed",
    "DataLoss",
    "EnqueueTimeout",
    "FaultUnavailable",
    "FeatureNotSupported",
    "HandleClosed",
    "HandleStopped",
    "ManagementError",
    "MessageDecodeError",
    "MessageTooLarge",
    "Misrouted",
    "NoCandidateNode",
    "NoRpcServer",
    "NodeUnreachable",
    "NodeUntold",
    "PlacementError",
    "PrerequisiteMissing",
    "PublishFailed",
    "PublishNotSent",
    "PublishingIdNotIncreasing",
    "RecoveryFailed",
    "ResolutionError",
    "ResolutionTimeout",
    "RpcTimeout",
    "SmartClientError",
    "StepTimeout",
    "StreamNotFound",
    "StreamNotReady",
    "TestBedError",
    "TokenExpired",
    "TokenProviderFailed",
    "TokenRefused",
    "TopologyError",
]


class SmartClientError(Exception):
    """Root of every error smartclient raises."""


class ConfigurationError(SmartClientError, ValueError):
    """A value given to smartclient is malformed or out of range; nothing was sent."""


class PublishingIdNotIncreasing(ConfigurationError):
    """A publishing id not above the last one this producer sent: the broker would confirm it and drop it."""


class MessageTooLarge(ConfigurationError):
    """A message larger than the frame max negotiated with the broker: it was not sent."""


class PublishFailed(SmartClientError):
    """The broker answered a message with an error; ``confirmation`` carries its publishing id and code."""

    def __init__(self, message: str, confirmation: object = None) -> None:
        super().__init__(message)
        self.confirmation = confirmation


class PublishNotSent(PublishFailed, RuntimeError):
    """A message an MQTT client held while it reconnected or handed over to a new token was never sent: the client
    gave up reconnecting (the cause says why), it was disconnected, or it already held ``MAX_HELD`` messages.  A
    ``RuntimeError`` too, which is what paho's ``wait_for_publish`` raises."""


class EnqueueTimeout(PublishFailed):
    """``send()`` waited ``BatchingPolicy.enqueue_timeout`` for room under ``max_in_flight`` (the broker does not
    confirm fast enough, or the producer is recovering): the message was not queued.  ``queued`` says how many
    of a ``send_many()`` list were queued before it (those go on as usual)."""

    def __init__(self, message: str, queued: int = 0) -> None:
        super().__init__(message)
        self.queued = queued


class ResolutionError(SmartClientError):
    """A resolver could not turn an address into a dialable one; the message names the address."""


class AddressNotAllowed(ResolutionError):
    """The address to dial is outside the allow-list (a metadata answer pointed somewhere unexpected)."""


class ResolutionTimeout(ResolutionError):
    """The name server did not answer in time."""


class PlacementError(SmartClientError):
    """No connection to an acceptable node could be made within the retry policy.

    ``attempts`` lists every attempt: what was dialled, which node answered, and why it was rejected.
    """

    def __init__(self, message: str, attempts: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.attempts = attempts


class NoCandidateNode(PlacementError):
    """The stream's topology offers no node for this role (for example no replica, with replicas forced)."""


class NodeUnreachable(PlacementError):
    """Connections kept landing on other nodes: the load balancer does not reach the needed node."""


class NoRpcServer(PlacementError):
    """No RPC server is bound to the local random exchange on the node where the request was published."""

    def __init__(self, message: str, node: str) -> None:
        super().__init__(message)
        self.node = node


class RpcTimeout(SmartClientError):
    """An RPC request got no reply within its timeout."""


class TopologyError(SmartClientError):
    """The broker could not describe the stream (it does not exist, or has no leader yet)."""


class StreamNotFound(TopologyError):
    """The stream does not exist on the broker."""


class StreamNotReady(TopologyError):
    """The stream exists but has no leader, or no member on the node asked, available yet (it was just created, or
    an election is under way): asked again soon, it may answer.  smartclient asks again within the placement's
    bound before it raises this."""


class DataLoss(TopologyError):
    """Offsets asked for are no longer in the stream: retention removed them.  The message names the
    stream and the lost range; ``stream``, ``first`` and ``end`` (exclusive) hold them."""

    def __init__(self, message: str, stream: str = "", first: int = 0, end: int = 0) -> None:
        super().__init__(message)
        self.stream, self.first, self.end = stream, first, end

    def __reduce__(self) -> tuple[type[DataLoss], tuple[str, str, int, int]]:  # crosses processes intact
        return (type(self), (str(self), self.stream, self.first, self.end))


class FeatureNotSupported(SmartClientError):
    """The broker does not support a feature that was asked for; the message names it and the version needed."""


class MessageDecodeError(SmartClientError, ValueError):
    """A message read from a stream could not be decoded as asked: for example bytes that a producer wrote with
    ``encoding="raw"``, decoded as an AMQP 1.0 message.  ``stream`` and ``offset`` name it when known (the message
    says them too); the decoder's own error, if any, is the ``__cause__``."""

    def __init__(self, message: str, stream: str = "", offset: int | None = None) -> None:
        super().__init__(message)
        self.stream, self.offset = stream, offset

    def __reduce__(self) -> tuple[type[MessageDecodeError], tuple[str, str, int | None]]:  # crosses processes intact
        return (type(self), (str(self), self.stream, self.offset))


class ConnectionFailed(SmartClientError):
    """A connection could not be opened, authenticated or kept."""


class NodeUntold(ConnectionFailed):
    """A connection through a load balancer is open, but the management API did not answer which node it reached
    in time (its connection listing gathers from every node, and waits while one is cut off).  An MQTT reconnect,
    for which any node will do, keeps the connection with its node unknown, and logs this as a warning."""


class AuthenticationFailed(ConnectionFailed):
    """The broker refused the credentials or the vhost; retrying would only repeat it."""


class TokenExpired(AuthenticationFailed):
    """The token a connection needed was past its expiry (``expires_at``, a unix time), even after asking the
    provider for a new one; the message names the expiry and the provider."""

    def __init__(self, message: str, *, expires_at: float | None = None, provider: str = "") -> None:
        super().__init__(message)
        self.expires_at, self.provider = expires_at, provider


class TokenRefused(AuthenticationFailed):
    """The broker refused a fresh token (on a live connection, or a provider answered again one it refused): every
    connection goes on with the token before it until that one expires, and the provider is asked again."""

    def __init__(self, message: str, *, connection: str = "") -> None:
        super().__init__(message)
        self.connection = connection


class TokenProviderFailed(ConnectionFailed):
    """The token provider raised, or answered something that is no token; ``provider`` names it and
    ``connection`` the connection that needed it (empty for a scheduled refresh).  The provider is asked
    again on a back-off, never in a storm."""

    def __init__(self, message: str, *, provider: str = "", connection: str = "") -> None:
        super().__init__(message)
        self.provider, self.connection = provider, connection


class Misrouted(ConnectionFailed):
    """A connection sent to a node by name (SNI) reported another node: the ingress routed it wrong.  It is
    closed, never used as the node it claims, and the placement goes on with the next candidate."""


class CertificateRejected(ConnectionFailed):
    """The server's TLS certificate does not verify for the name smartclient checks; retrying would only
    repeat it (and a load balancer that picks another node would not change the name)."""


class StepTimeout(ConnectionFailed):
    """One step of a placement or recovery attempt (connect, TLS, open, metadata, declare, subscribe) did not
    finish in the time the attempt had left; the message names the step and the time it was given."""


class HandleClosed(SmartClientError):
    """The producer, consumer or Environment was closed before (or while) this call was made; nothing was
    sent, and every message still pending at ``close()`` ended failed with a reason."""


class HandleStopped(SmartClientError):
    """Why a producer or consumer stopped on its own: its ``failure``.  It is closed; nothing more is sent or
    delivered."""


class RecoveryFailed(HandleStopped):
    """The producer or consumer was lost and recovery gave up (or is disabled); the message says why.  ``cause``
    (also the ``__cause__``) is the last attempt's error: for a recovery the broker's refusal ended at once (see
    :data:`REFUSALS`), that refusal (``TokenExpired``, ``AuthenticationFailed``...)."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        self.__cause__ = cause

    def __reduce__(self) -> tuple[type[RecoveryFailed], tuple[str]]:  # crosses processes (the cause stays behind)
        return (type(self), (str(self),))


class CallbackFailed(HandleStopped):
    """A consumer's callback (or ``on_chunk`` handler) raised, and its ``on_error`` said stop.  ``stream`` and
    ``offset`` name the message (for a chunk, its first offset) where it stopped; the callback's exception is
    the ``__cause__``.  A tracked consumer's stored offset never passes that message: a restart resumes there."""

    def __init__(self, message: str, stream: str = "", offset: int | None = None) -> None:
        super().__init__(message)
        self.stream, self.offset = stream, offset

    def __reduce__(self) -> tuple[type[CallbackFailed], tuple[str, str, int | None]]:
        return (type(self), (str(self), self.stream, self.offset))


class ManagementError(SmartClientError):
    """The management API answered with an error (``status``: its HTTP status), or could not be reached.  A 401 is
    not one: the credentials refused are :class:`AuthenticationFailed` (:class:`TokenExpired`), as everywhere."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class TestBedError(SmartClientError):
    """The test bed could not be set up, queried or faulted as asked."""

    __test__ = False  # not a pytest test class, whatever its name says


class PrerequisiteMissing(TestBedError):
    """Something the test bed needs is not on this machine; the message says what and how to fix it."""


class FaultUnavailable(TestBedError):
    """This test bed cannot inject the requested fault (for example an external cluster)."""


#: the connection failures another node (or entry point) would only repeat: raised at once, never retried elsewhere
REFUSALS: tuple[type[ConnectionFailed], ...] = (AuthenticationFailed, CertificateRejected, TokenProviderFailed)

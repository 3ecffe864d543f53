"""The ONE place that touches rstream: its internals, its client, its errors (``tests/unit/test_rstream_seam.py``
checks every internal it relies on; the version range is pinned in ``pyproject.toml``).

:mod:`.wire`: the client, error mapping, frames and values; :mod:`.messages`: AMQP 1.0 messages; :mod:`.frames`:
the socket read in large pieces and the hot paths' frames (PublishConfirm, PublishError, Deliver) decoded into
rstream's frame classes with one ``struct`` call each; :mod:`.placed`: rstream's Producer and Consumer, placed by
smartclient; :mod:`.requests`: the commands rstream does not know.
"""

from smartclient.stream._rstream.placed import *  # noqa: F403
from smartclient.stream._rstream.placed import __all__ as _carrier_names
from smartclient.stream._rstream.requests import *  # noqa: F403
from smartclient.stream._rstream.requests import __all__ as _request_names
from smartclient.stream._rstream.tables import carrier_clients, carrier_tables, client_tables, write_until_confirmed
from smartclient.stream._rstream.wire import *  # noqa: F403
from smartclient.stream._rstream.wire import __all__ as _wire_names

__all__ = [*_carrier_names, *_request_names, *_wire_names, "RSTREAM_INTERNALS", "RSTREAM_NAMES", "carrier_clients",
           "carrier_tables", "client_tables", "write_until_confirmed"]

RSTREAM_INTERNALS: tuple[str, ...] = (
    # rstream.client.Client (BaseClient): the connection, its frames and its handler tables
    "client.Client._conn",  # the socket (its writer carries our Publish frames; aborted on a failed dial)
    "client.Client._handlers",  # frame handlers by class and name: ours are added, bound and removed
    "client.Client._frames",  # per-subscription delivery queues (ours: deliveries.Chunks), dropped with it
    "client.Client._tasks",  # reader, heartbeat and delivery tasks: stopped on abort (the heartbeat also when
    # the reader ends by itself)
    "client.Client._is_not_closed",  # set False on abort, and when the reader ends by itself
    "client.Client._connection_closed_handler",  # wrapped: told also when a connection without streams ends
    "client.Client._client_properties",  # the connection name given
    "client.Client._frame_max",  # the negotiated frame max (Publish frames are packed here)
    "client.Client._corr_id_seq",  # correlation ids for ExchangeCommandVersions and the super stream commands
    "client.Client._listener",  # NamedClient.start mirrors rstream's start: reader task ...
    "client.Client._waiters",  # ... whose pending requests NamedClient fails once it stops
    "client.Client._on_heartbeat",  # ... heartbeat handler ...
    "client.Client._start_heartbeat",  # extended: the silence watch starts with the heartbeat
    "client.Client._heartbeat",  # the negotiated heartbeat (0: off, and no silence watch)
    "client.Client._last_heartbeat",  # when the last frame was received: the silence watch reads it
    "client.Client._on_close",  # ... close handler
    "client.Client._ssl_context",  # read by NamedClient.start
    "connection.Connection._reader",  # NamedConnection.open sets both, with the TLS name we choose
    "connection.Connection._writer",
    "connection.Connection._ssl_context",
    "connection.Connection._read_frame_raw",  # overridden: a frame in two readexactly calls (frames.py); StreamStats
    # reads one raw frame with it while the reader is stopped, and read_frame reads raw to decode frames itself
    "connection.Connection._write_frame_raw",  # extra_request writes its frame through it
    "connection.Connection.read_frame",  # overridden by NamedConnection (extra responses)
    # rstream.Producer / rstream.Consumer (the carriers)
    "Producer._pool", "Consumer._pool",  # replaced by PlacedClientPool
    "Producer._clients", "Consumer._clients",  # stream -> connection
    "Producer._lock", "Consumer._lock",  # taken around our own bookkeeping (subscribe holds it)
    "Producer._connection_name", "Consumer._connection_name",
    "Producer._on_connection_closed", "Consumer._on_connection_closed",  # forwarded per carrier
    "Producer._get_or_create_client", "Consumer._get_or_create_client",  # overridden: placement decides
    "Producer._publishers",  # id -> publisher
    "Producer._find_producer_by_stream",
    "Producer._get_next_available_id",  # only without a placed connection (never in practice)
    "Producer._get_or_create_publisher",  # overridden: the id is taken per connection
    "Consumer._subscribers",  # id -> subscriber
    "Consumer._on_deliver",  # overridden: the one delivery loop (credit by ConsumerFlow, chunks, no moving back)
    "producer._Publisher",  # built by our _get_or_create_publisher
    "client.ClientPool._clients",  # cleared by PlacedClientPool.close
    # counted, never changed (tables.py: what a long-lived Environment holds)
    "Producer._waiting_for_confirm", "Producer._buffered_messages", "client.Client._streams",
)
"""Every private name of rstream the seam relies on, relative to the ``rstream`` package; the seam test
checks each against the installed rstream."""

RSTREAM_NAMES: tuple[str, ...] = (
    "AMQPMessage", "ConsumerOffsetSpecification", "FilterConfiguration", "OffsetType", "amqp_decoder",
    "Producer", "Consumer", "schema", "exceptions", "client.Addr", "client.Client", "client.ClientPool",
    "connection.Connection", "constants.SlasMechanism", "constants.MAX_ITEM_ALLOWED", "utils.MonotonicSeq",
    "utils.OnClosedErrorInfo", "exceptions.PreconditionFailed", "exceptions.StreamAlreadyExists",
    "exceptions.OffsetNotFound", "exceptions.LeaderNotAvailable", "exceptions.PublisherDoesNotExist",
    "exceptions.SubscriptionIDDoesNotExist", "exceptions.StreamDoesNotExist", "exceptions.StreamNotAvailable",
    "exceptions.ServerError", "exceptions.AuthenticationFailure", "exceptions.SASLError",
    "exceptions.SASLAuthenticationFailureLoopback", "exceptions.SASLMechanismNotSupported",
    "exceptions.VirtualHostAccessFailure", "schema.PublishConfirm", "schema.PublishError", "schema.MetadataUpdate",
    "schema.Deliver", "schema.ConsumerUpdateResponse", "schema.Heartbeat", "schema.Close",
    "schema.FrameHandlerInfo", "schema.ExchangeCommandVersionRequest", "schema.ExchangeCommandVersionResponse",
    "schema.OffsetSpecification", "encoding.decode_frame", "schema.SaslAuthenticate", "schema.SaslAuthenticateResponse",
    "schema.PublishingError", "schema.SubEntryChunk", "schema.Message",
    "connection.ConnectionClosed", "client.Client.peer_properties",
)
"""The public names of rstream the seam imports or uses."""

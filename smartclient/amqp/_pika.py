"""The one seam between smartclient and pika.

Only this module imports pika, and only here do pika's exceptions become smartclient's errors
(:func:`pika_errors`).  The AMQP wing (``placement.py``, ``rpc.py``, ``streams.py``) opens connections with
:func:`open_connection`, builds message properties with :func:`basic_properties`, and runs every call into
pika inside :func:`pika_errors`.

The wing touches no private attribute of pika.  What it relies on is listed in :data:`PIKA_INTERNALS` (one
private method whose behaviour the error mapping depends on), :data:`PIKA_NAMES` (public names used) and
:data:`PIKA_SIGNATURES` (parameters passed to pika's callables, here and on the channels the wing drives).
``tests/unit/test_pika_seam.py`` checks every entry against the installed pika and greps the library for
pika imports outside this file; ``pyproject.toml`` pins pika below 1.5.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions as px
from pika import BlockingConnection

from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConnectionFailed,
    PublishFailed,
    SmartClientError,
)
from smartclient.core.address import Address
from smartclient.core.settings import Credentials

__all__ = [
    "PIKA_INTERNALS",
    "PIKA_NAMES",
    "PIKA_SIGNATURES",
    "BlockingConnection",
    "basic_properties",
    "close_quietly",
    "open_connection",
    "pika_errors",
]

log = logging.getLogger(__name__)

#: Every private attribute or method of pika the seam touches or relies on.
PIKA_INTERNALS: tuple[str, ...] = (
    # relied on, not called: a connect that fails in the TLS handshake raises the ssl error itself (it
    # unwraps AMQPConnectorTransportSetupError.exception), so a certificate that does not verify is
    # recognised as ssl.SSLCertVerificationError
    "pika.adapters.blocking_connection.BlockingConnection._reap_last_connection_workflow_error",
)

#: Every public name of pika the AMQP wing uses, as a module path.
PIKA_NAMES: tuple[str, ...] = (
    "pika.BlockingConnection",
    "pika.ConnectionParameters",
    "pika.PlainCredentials",
    "pika.SSLOptions",
    "pika.BasicProperties",
    "pika.adapters.blocking_connection.BlockingChannel",
    "pika.exceptions.AMQPError",
    "pika.exceptions.ProbableAuthenticationError",
    "pika.exceptions.ProbableAccessDeniedError",
    "pika.exceptions.UnroutableError",
    "pika.exceptions.NackError",
    "pika.exceptions.ChannelClosed",
    "pika.exceptions.ConnectionClosed",
)

#: The parameters the AMQP wing passes to pika's callables (a subset of each signature).
PIKA_SIGNATURES: dict[str, tuple[str, ...]] = {
    "pika.ConnectionParameters.__init__": (
        "host", "port", "virtual_host", "credentials", "heartbeat", "client_properties", "ssl_options",
        "connection_attempts", "socket_timeout", "blocked_connection_timeout",
    ),
    "pika.PlainCredentials.__init__": ("username", "password"),
    "pika.SSLOptions.__init__": ("context", "server_hostname"),
    "pika.BasicProperties.__init__": ("headers", "correlation_id", "reply_to", "delivery_mode"),
    "pika.BlockingConnection.__init__": ("parameters",),
    "pika.BlockingConnection.channel": ("self",),
    "pika.BlockingConnection.close": ("self",),
    "pika.BlockingConnection.process_data_events": ("time_limit",),
    "pika.adapters.blocking_connection.BlockingChannel.basic_publish": (
        "exchange", "routing_key", "body", "properties", "mandatory",
    ),
    "pika.adapters.blocking_connection.BlockingChannel.basic_consume": (
        "queue", "on_message_callback", "auto_ack", "arguments",
    ),
    "pika.adapters.blocking_connection.BlockingChannel.basic_qos": ("prefetch_count", "global_qos"),
    "pika.adapters.blocking_connection.BlockingChannel.basic_ack": ("delivery_tag",),
    "pika.adapters.blocking_connection.BlockingChannel.queue_declare": (
        "queue", "durable", "exclusive", "auto_delete", "arguments",
    ),
    "pika.adapters.blocking_connection.BlockingChannel.queue_bind": ("queue", "exchange", "routing_key"),
    "pika.adapters.blocking_connection.BlockingChannel.exchange_declare": ("exchange", "exchange_type", "durable"),
    "pika.adapters.blocking_connection.BlockingChannel.confirm_delivery": ("self",),
    "pika.adapters.blocking_connection.BlockingChannel.start_consuming": ("self",),
    "pika.adapters.blocking_connection.BlockingChannel.stop_consuming": ("self",),
}


@contextlib.contextmanager
def pika_errors(
    where: str,
    *,
    vhost: str | None = None,
    returned: Callable[[], SmartClientError] | None = None,
    callbacks: bool = False,
) -> Iterator[None]:
    """Run pika calls, raising smartclient's errors instead of pika's (``raise ... from exc``).  The one
    place where they are mapped.

    :param where: what was being done, for the message (``connecting to h:5672``).
    :param vhost: the vhost connected to, for the message when access to it is denied.
    :param returned: the error a message the broker returned (``mandatory``, nothing bound) means to the
        caller; :class:`PublishFailed` if None.
    :param callbacks: True around calls that run the caller's own callbacks (``process_data_events``,
        ``start_consuming``): an ``OSError`` raised there is theirs and passes through unchanged.
    :raises AuthenticationFailed: the broker refused the credentials, or access to the vhost.
    :raises CertificateRejected: the server's TLS certificate does not verify for the name checked.
    :raises PublishFailed: the broker returned or nacked a message (unless ``returned`` says otherwise).
    :raises ConnectionFailed: the connection or channel could not be opened or was closed (by the broker,
        with its reply code and text), or the socket failed.
    """
    try:
        yield
    except SmartClientError:
        raise
    except (px.ProbableAuthenticationError, px.ProbableAccessDeniedError) as exc:
        # pika guesses these from the stage at which the connection ended; only the broker's own Close says
        # so.  A socket cut in the handshake (an LB that restarts, a node that stops) is a connection failure,
        # which is retried, and not refused credentials, which stop a retrying RPC server for good.
        if "StreamLostError" in str(exc):
            raise ConnectionFailed(f"{where}: the connection was cut during the handshake ({exc})") from exc
        if isinstance(exc, px.ProbableAccessDeniedError):
            raise AuthenticationFailed(f"{where}: no access to vhost {vhost!r}") from exc
        raise AuthenticationFailed(f"{where}: the broker refused the credentials") from exc
    except px.UnroutableError as exc:
        if returned is not None:
            raise returned() from exc
        raise PublishFailed(f"{where}: the broker returned the message: nothing is bound to take it") from exc
    except px.NackError as exc:
        raise PublishFailed(f"{where}: the broker refused the message (basic.nack)") from exc
    except px.ChannelClosed as exc:
        raise ConnectionFailed(f"{where}: the channel was closed ({exc.reply_code} {exc.reply_text})") from exc
    except px.ConnectionClosed as exc:
        raise ConnectionFailed(f"{where}: the connection was closed ({exc.reply_code} {exc.reply_text})") from exc
    except px.AMQPError as exc:
        raise ConnectionFailed(f"{where}: {type(exc).__name__}: {exc}") from exc
    except ssl.SSLCertVerificationError as exc:
        if callbacks:
            raise
        reason = getattr(exc, "verify_message", None) or exc
        raise CertificateRejected(f"{where} (AMQP over TLS): {reason}") from exc
    except OSError as exc:  # raised as is by a connect that fails in the TLS handshake
        if callbacks:
            raise
        raise ConnectionFailed(f"{where}: {type(exc).__name__}: {exc}") from exc


def open_connection(
    dialled: Address,
    *,
    name: str,
    credentials: Credentials,
    vhost: str,
    heartbeat: int,
    tls: ssl.SSLContext | None,
    tls_name: str | None = None,
) -> BlockingConnection:
    """A pika ``BlockingConnection`` to ``dialled``, named ``name`` (its client-provided
    ``connection_name``), one attempt, TLS verifying ``tls_name`` (what the resolution seam says; else the
    dialled host).

    :raises AuthenticationFailed, CertificateRejected, ConnectionFailed: see :func:`pika_errors`.
    """
    params = pika.ConnectionParameters(
        host=dialled.host, port=dialled.port, virtual_host=vhost,
        credentials=pika.PlainCredentials(credentials.username, credentials.password),
        heartbeat=heartbeat, client_properties={"connection_name": name},
        ssl_options=pika.SSLOptions(tls, tls_name or dialled.host) if tls is not None else None,
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=30,
    )
    with pika_errors(f"connecting to {dialled}", vhost=vhost):
        return BlockingConnection(params)


def probe_node(connection: Any, node_of_queue: Callable[[str], Any]) -> str | None:
    """Declare an exclusive server-named queue on a channel of its own, ask ``node_of_queue(name)`` (the
    management API's row of it), delete the queue, close the channel, and return the row's ``node``.

    :raises ConnectionFailed: the channel or the declaration was refused, or the connection failed.
    """
    with pika_errors("declaring a queue to find the connection's node"):
        channel = connection.channel()
        try:
            queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
            try:
                row = node_of_queue(queue)
            finally:
                with contextlib.suppress(Exception):
                    channel.queue_delete(queue)  # else it goes with its connection
        finally:
            with contextlib.suppress(Exception):
                if channel.is_open:
                    channel.close()
    node = row.get("node") if isinstance(row, dict) else None
    return str(node) if node else None


def close_quietly(connection: Any) -> None:
    """Close a connection if it is open; never raises (a broken one has nothing to close)."""
    try:
        if connection.is_open:
            connection.close()
    except Exception as exc:
        log.debug("closing an AMQP connection: %s", exc)


def basic_properties(**fields: Any) -> Any:
    """pika's ``BasicProperties`` with ``fields`` (``reply_to``, ``correlation_id``, ``headers``...)."""
    return pika.BasicProperties(**fields)

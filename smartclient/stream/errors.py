"""The one place where rstream's and the socket layer's errors become smartclient's."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager

from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConnectionFailed,
    ResolutionError,
    SmartClientError,
    StreamNotFound,
    TopologyError,
)

__all__ = ["map_stream_errors"]


@contextmanager
def map_stream_errors(context: str) -> Iterator[None]:
    """Re-raise errors from rstream and sockets as :class:`SmartClientError` subclasses, naming ``context``."""
    from rstream import exceptions as rx

    try:
        yield
    except SmartClientError:
        raise
    except (rx.AuthenticationFailure, rx.SASLError, rx.SASLAuthenticationFailureLoopback,
            rx.SASLMechanismNotSupported) as exc:
        raise AuthenticationFailed(f"{context}: the broker refused the credentials ({type(exc).__name__})") from exc
    except rx.VirtualHostAccessFailure as exc:
        raise AuthenticationFailed(f"{context}: no access to the vhost, or it does not exist") from exc
    except rx.StreamDoesNotExist as exc:
        raise StreamNotFound(f"{context}: the stream does not exist") from exc
    except (rx.LeaderNotAvailable, rx.StreamNotAvailable) as exc:
        raise TopologyError(f"{context}: the stream has no leader available yet") from exc
    except socket.gaierror as exc:
        raise ResolutionError(f"{context}: the host name could not be resolved ({exc}); "
                              f"a resolver (StaticMap, DnsResolver) can map it") from exc
    except ssl.SSLCertVerificationError as exc:
        raise CertificateRejected(f"{context}: TLS certificate verify failed: {exc.verify_message or exc}") from exc
    except ssl.SSLError as exc:
        raise ConnectionFailed(f"{context}: TLS failed: {exc}") from exc
    except asyncio.TimeoutError as exc:  # rstream's own request timeout; its message is empty
        raise ConnectionFailed(f"{context}: the broker did not answer in time") from exc
    except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
        raise ConnectionFailed(f"{context}: {type(exc).__name__}: {exc or 'connection closed'}") from exc
    except rx.ServerError as exc:
        raise ConnectionFailed(f"{context}: the broker answered {type(exc).__name__}: {exc}") from exc

"""How a connection that hears nothing is found dead within ``ConnectionOptions.dead_after`` seconds.

On a real network a link can go quiet: no reset, no FIN, and the socket just stops.  A heartbeat of 60 s finds that
after two of them.  Through a load balancer (a proxy) only the protocol itself can tell: the balancer's own kernel
acknowledges everything the client sends.  So a stream connection hears from its peer at least every third of
``dead_after`` (:func:`heartbeat`), and one that heard nothing for ``dead_after`` is ended (and recovered).  An MQTT
client keeps the keepalive the user sets with the broker (a placement waits for the management API without pumping
it) and pings on its own every third of ``dead_after`` (``PahoClient._check_keepalive``); AMQP 0.9.1 keeps its
heartbeat (a pika BlockingConnection heartbeats only inside its calls).  Beneath that, every TCP
socket smartclient opens (stream, AMQP 0.9.1, MQTT) gets:

* ``TCP_USER_TIMEOUT`` of ``dead_after - 1`` s: data sent and not acknowledged for that long ends the connection
  (the kernel decides at its next retransmission, about 0.5 s later);
* TCP keepalive (``SO_KEEPALIVE``) from a third of ``dead_after`` idle, a probe a second: an idle connection whose
  peer answers no probe for the user timeout ends at the next probe, so within ``dead_after``.

A live peer acknowledges data and probes from its kernel, however busy its application or full its window (it
answers zero-window probes too), so back-pressure is no alarm.  The cost: one empty segment a second on a
connection idle past a third of ``dead_after``, answered by one from the peer.
"""

from __future__ import annotations

import math
import socket
from typing import Any

__all__ = ["heartbeat", "tcp_options", "watch"]


def heartbeat(interval: float, dead_after: float) -> int:
    """The heartbeat to negotiate (whole seconds; 0: off) for a connection found dead after ``dead_after`` s of
    silence: at most a third of it, so that an idle peer's heartbeats (sent when it sent nothing for one interval,
    looked at once an interval: at most two apart) come well within it.  ``interval`` (the user's) if shorter, and
    0 stays off (nothing then tells an idle peer from a silent one: only TCP's own checks are left)."""
    if not interval or not dead_after:
        return int(interval)
    return int(min(interval, max(1, dead_after // 3)))


def tcp_options(dead_after: float) -> dict[str, int]:
    """The TCP options (by their ``socket`` names) that find a silent peer within ``dead_after`` seconds; none for
    0 (off)."""
    if not dead_after:
        return {}
    return {"TCP_USER_TIMEOUT": int((dead_after - 1) * 1000), "TCP_KEEPIDLE": max(1, int(dead_after // 3)),
            "TCP_KEEPINTVL": 1, "TCP_KEEPCNT": max(1, math.ceil(dead_after))}


def watch(sock: Any, dead_after: float) -> None:
    """Set :func:`tcp_options` and keepalive on ``sock`` (a socket, an SSL socket, or None: nothing to do).  An
    option the platform lacks is left out: the heartbeat still bounds what it would have found."""
    options = tcp_options(dead_after)
    if not options or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return  # off, or not a TCP socket (None, a Unix socket, a wrapper): nothing to watch
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in options.items():
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)

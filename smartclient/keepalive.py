"""How a connection that hears nothing is found dead within ``ConnectionOptions.dead_after`` seconds.

On a real network a link can go quiet: no reset, no FIN, and the socket just stops.  A heartbeat of 60 s finds that
after two of them.  Through a load balancer (a proxy) only the protocol itself can tell: the balancer's own kernel
acknowledges everything the client sends.  So every wing hears from its peer well within ``dead_after`` and ends a
connection that heard nothing for long enough that a silent drop, one way or both, is found within it:

* a stream connection negotiates a heartbeat of a fifth of ``dead_after`` (:func:`heartbeat`) and is ended once it
  heard nothing for :func:`silence_limit` (``dead_after`` less two heartbeats: a drop one way toward the node
  silences it only once the node's TCP stalls, at its next frame);
* an MQTT client keeps the keepalive the user sets with the broker (a placement waits for the management API
  without pumping it), pings on its own every quarter of ``dead_after`` and is lost at ``dead_after`` less two
  seconds: the second paho's loop takes to look, and the node's last frames after a drop toward it
  (``PahoClient._check_keepalive``);
* AMQP 0.9.1 keeps its heartbeat (a pika ``BlockingConnection`` heartbeats only inside its calls), and the seam's
  ``SilenceWatch`` asks the broker something every third of ``dead_after`` of silence and ends the connection two
  seconds before it;
* an AMQP 1.0 connection gets proton's idle timeout at two fifths of ``dead_after`` (:func:`idle_timeout`): the
  broker sends something every half of it, and proton ends a connection that heard nothing for all of it.  A
  thread back to a connection it left alone reads what waits in the socket before proton looks (the seam's
  ``_Container.process``): proton judges its idle timeout at the first event, before it reads.

Beneath that, every TCP socket smartclient opens (stream, AMQP 0.9.1, MQTT) gets:

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

__all__ = ["MIN_IDLE_TIMEOUT", "heartbeat", "idle_timeout", "silence_limit", "tcp_options", "watch"]

#: the least idle timeout an AMQP 1.0 connection gets: proton advertises half, RabbitMQ refuses under 1 s
MIN_IDLE_TIMEOUT = 2.0


def heartbeat(interval: float, dead_after: float) -> int:
    """The heartbeat to negotiate (whole seconds; 0: off) for a connection found dead after ``dead_after`` s of
    silence: at most a fifth of it (2 s for the default 10), so that an idle peer's heartbeats (sent when it sent
    nothing for one interval, looked at once an interval: at most two apart) come well within
    :func:`silence_limit`.  ``interval`` (the user's) if shorter, and 0 stays off (nothing then tells an idle peer
    from a silent one: only TCP's own checks are left)."""
    if not interval or not dead_after:
        return int(interval)
    return int(min(interval, max(1, dead_after // 5)))


def silence_limit(heartbeat: float, dead_after: float) -> float:
    """How long a connection with ``heartbeat`` may hear nothing before it is ended, so that any silent drop is
    found within ``dead_after``: a drop both ways silences it at once, but one toward the node only once the node's
    TCP stalls on the acknowledgements it no longer gets, at its next frame (at most two heartbeats later, on an
    idle connection); so ``dead_after`` less two heartbeats (6 s by default).  At least three heartbeats, or a live
    idle peer (two heartbeats apart at most) would be taken for a silent one: with the least ``dead_after`` (4 s,
    heartbeat 1 s) that is 3 s, and a one-way drop is found within 5 s."""
    if not heartbeat:
        return dead_after
    return max(dead_after - 2 * heartbeat, 3 * heartbeat)


def mqtt_watch(dead_after: float) -> tuple[float, float]:
    """The two times of MQTT's silence watch (``PahoClient._check_keepalive``) for ``dead_after``: a PINGREQ once
    nothing came for the first (a quarter of it, at least a second), and the connection lost once nothing came for
    the second, ``dead_after`` less two seconds: paho's loop looks every second (later on a loaded machine), and a
    drop one way toward the node lets the node's last frames through (until its flow control waits on the
    acknowledgements it no longer gets).  At least three pings' worth, so a live broker, which answers a ping at
    once, is never taken for a silent one: with the least ``dead_after`` (4 s) a ping after 1 s, the end after 3 s."""
    every = float(max(1, dead_after // 4))
    return every, max(dead_after - 2, 3 * every)


def idle_timeout(heartbeat: float, dead_after: float) -> float:
    """proton's idle timeout for an AMQP 1.0 connection found dead within ``dead_after`` s (0: off): two fifths of
    it (4 s for the default 10), ``heartbeat`` if shorter, and 0 stays off.  The broker sends something every half
    of it, so a drop toward the node silences the connection within that half (the node's TCP stalls at its next
    frame); proton then ends it once it heard nothing for the whole of it, at its next look (within a second).
    Never under 2 s: proton advertises half of it, and RabbitMQ refuses an Open whose idle time-out is under 1 s
    (with the least ``dead_after``, 4 s, two fifths would be 1.6 s: every connection refused)."""
    if not heartbeat:
        return 0.0
    if not dead_after:
        return float(max(MIN_IDLE_TIMEOUT, heartbeat))
    return float(max(MIN_IDLE_TIMEOUT, min(heartbeat, 0.4 * dead_after)))


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

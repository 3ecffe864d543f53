"""What the paho seam (:mod:`smartclient.mqtt._paho`) relies on in paho-mqtt, entry by entry, as data: its
private names, the methods it overrides, the public names it imports, and the parameters it passes or receives.
``tests/unit/mqtt/test_paho_seam.py`` checks every entry against the installed paho.  No paho import here.

Why each private name is touched:

* ``Client._loop`` is overridden: paho waits with ``select()``, which cannot watch a file descriptor numbered 1024
  or more, so in a busy process a client silently never gets its CONNACK (eclipse-paho/paho.mqtt.python#183,
  #238, #819).  ``PahoClient._loop`` is the same loop on ``poll()``; ``loop()`` and ``loop_forever()`` call
  it.  It reads ``_sock`` (the connection) and ``_sockpairR`` (the socket ``publish()`` from another thread writes
  to, to wake the loop; ``_sockpairW`` is its other end, written to wake the loop for a hand-over that is due).
* ``Client._host`` and ``Client._port`` are where ``reconnect()`` dials.  A failover re-aims them before
  paho reconnects; the public ``host``/``port`` setters refuse while paho considers itself connecting.
* ``Client._ssl_context`` holds a ``NamedContext``, and ``Client._ssl_wrap_socket`` (relied on) wraps every
  socket with its ``wrap_socket(..., server_hostname=self._host)`` and skips its own ``match_hostname`` when the
  context has ``check_hostname``: so TLS verifies the name smartclient chose, not the address dialled.
* ``Client._sock_close`` drops a connection without DISCONNECT (calling ``on_socket_close``), for fleets
  that move a client and for closing a broken client.
* ``Client._thread`` says whether ``loop_start``'s thread runs (if not, a DISCONNECT is flushed by hand);
  ``Client._client_id`` is the client id paho holds, as bytes (``PahoClient.client_id``).
* ``Client._sock_recv`` is overridden to keep the error a read failed with (paho logs it, and says only "connection
  lost"): a TLS alert there is the broker refusing the client certificate (``CertificateRejected``).
* ``Client._create_socket_connection`` is overridden to set :mod:`smartclient.keepalive`'s options on the TCP
  socket it dials (before any TLS): a silent broker ends the connection within ``dead_after``.
* ``Client._check_keepalive`` is overridden to watch for silence too: a PINGREQ after ``dead_after / 4`` s with
  nothing received (``Client._last_bytes_received`` under ``Client._msgtime_mutex``; ``Client._send_pingreq``),
  and the connection lost after ``dead_after - 2`` s (``Client._do_on_disconnect``, as paho's own keepalive does);
  so too once a QoS 1 or 2 message waited that long for the broker (``MQTTMessage.timestamp`` and ``.state``, of
  ``Client._out_messages``): a node cut from its peers answers pings while its queues take nothing.
* ``Client._inflight_messages`` counts the QoS 1 and 2 messages sent and not yet acknowledged: a token hand-over
  waits for it to reach 0 before it says goodbye (``PahoClient.in_flight``).  When a client gives up for good,
  what ``Client._out_messages`` holds (under ``Client._out_message_mutex``) fails: each one's ``rc`` is set and
  ``MQTTMessageInfo._set_as_published`` ends its ``wait_for_publish``, which raises (not a wait for ever).
* ``Client.publish`` and ``Client.disconnect`` are overridden (public methods): a client that hands over to a new
  token, or reconnects, *holds* what it is asked to publish meanwhile and sends it once connected again
  (``HeldInfo``), so nothing published in between is lost; a disconnect asked for ends that.
"""

from __future__ import annotations

__all__ = ["PAHO_INTERNALS", "PAHO_NAMES", "PAHO_OVERRIDES", "PAHO_SIGNATURES"]

#: Every private attribute or method of paho the seam reads, writes, overrides or relies on.
PAHO_INTERNALS: tuple[str, ...] = (
    "Client._loop",  # overridden (poll instead of select); loop() and loop_forever() call it
    "Client._sock",  # the connection's socket, None when closed
    "Client._sockpairR",  # the socket publish() writes to from another thread, to wake the loop
    "Client._host",  # where reconnect() dials: written on failover
    "Client._port",
    "Client._ssl_context",  # holds a NamedContext: read to set the name TLS verifies
    "Client._ssl_wrap_socket",  # relied on: wraps with _ssl_context.wrap_socket(server_hostname=self._host)
    "Client._sock_close",  # closes the socket without DISCONNECT, calling on_socket_close
    "Client._thread",  # loop_start's thread, None when none runs
    "Client._client_id",  # the client id, bytes
    "Client._inflight_messages",  # QoS 1 and 2 messages sent and not yet acknowledged (read)
    "Client._sockpairW",  # written to wake the loop (as publish() from another thread does)
    "Client._sock_recv",  # overridden: keeps the error a read failed with
    "Client._create_socket_connection",  # overridden: the TCP socket it dials, before TLS; watched for silence
    "Client._check_keepalive",  # overridden: paho's keepalive, then the silence watch of dead_after
    "Client._keepalive",  # the keepalive agreed with the broker (read: the watch pings more often only if shorter)
    "Client._last_bytes_received",  # when paho last read from the socket (read under _msgtime_mutex)
    "Client._msgtime_mutex",  # guards it
    "Client._send_pingreq",  # the watch's PINGREQ
    "Client._ping_t",  # when paho sent a PINGREQ not answered yet (0: none): the watch judges its answer
    "Client._do_on_disconnect",  # the watch ends a silent connection as paho's keepalive does
    "Client._out_messages",  # what paho has to send or have acknowledged: failed when the client gives up
    "Client._out_message_mutex",  # guards it
    "MQTTMessageInfo._set_as_published",  # ends a wait_for_publish (with its rc set: it raises)
)

#: The private or public methods ``PahoClient`` overrides (their signatures must match exactly).
PAHO_OVERRIDES: tuple[str, ...] = ("Client._loop", "Client.reconnect", "Client.publish", "Client.disconnect",
                                   "Client._sock_recv", "Client._create_socket_connection",
                                   "Client._check_keepalive")

#: Every public name of paho this module imports or relies on, as a module path.
PAHO_NAMES: tuple[str, ...] = tuple(f"paho.mqtt.{name}" for name in (
    "client.Client", "client.ConnectFlags", "client.MQTTMessage", "client.MQTTMessageInfo", "client.MQTT_ERR_SUCCESS",
    "client.connack_string", "client.error_string", "client.mqtt_ms_wait_for_puback",
    "client.mqtt_ms_wait_for_pubrec", "client.mqtt_ms_wait_for_pubcomp", "enums.CallbackAPIVersion",
    "enums.MQTTErrorCode", "enums.MQTTProtocolVersion", "packettypes.PacketTypes", "properties.Properties",
    "reasoncodes.ReasonCode"))

#: The parameters the seam passes to (or, for :data:`PAHO_OVERRIDES`, receives from) paho's callables.
PAHO_SIGNATURES: dict[str, tuple[str, ...]] = {
    "Client._loop": ("self", "timeout"),
    "Client._sock_recv": ("self", "bufsize"),
    "Client._create_socket_connection": ("self",),
    "Client._check_keepalive": ("self",),
    "Client._do_on_disconnect": ("packet_from_broker", "v1_rc"),
    "Client.reconnect": ("self",),
    "Client.publish": ("self", "topic", "payload", "qos", "retain", "properties"),
    "Client.disconnect": ("self", "reasoncode", "properties"),
    "Client.__init__": ("callback_api_version", "client_id", "clean_session", "protocol"),
    "Client.connect": ("host", "port", "keepalive", "clean_start", "properties"),
    "Client.username_pw_set": ("username", "password"),
    "Client.reconnect_delay_set": ("min_delay", "max_delay"),
    "Client.tls_set_context": ("context",),
    "Client.want_write": ("self",),
    "Client.loop_read": ("self",),
    "Client.loop_write": ("self",),
    "Client.loop_misc": ("self",),
    "Client.loop_stop": ("self",),
    "Client.socket": ("self",),
    "ConnectFlags": ("session_present",),
    "ReasonCode.__init__": ("packetType", "identifier"),
    "connack_string": ("connack_code",),
}

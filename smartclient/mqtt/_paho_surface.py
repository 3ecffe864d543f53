"""What the paho seam (:mod:`smartclient.mqtt._paho`) relies on in paho-mqtt, entry by entry, as data: its
private names, the methods it overrides, the public names it imports, and the parameters it passes or receives.
``tests/unit/mqtt/test_paho_seam.py`` checks every entry against the installed paho.  No paho import here."""

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
    "Client._do_on_disconnect",  # the watch ends a silent connection as paho's keepalive does
    "Client._out_messages",  # what paho has to send or have acknowledged: failed when the client gives up
    "Client._out_message_mutex",  # guards it
    "MQTTMessageInfo._set_as_published",  # ends a wait_for_publish (with its rc set: it raises)
)

#: The private or public methods :class:`PahoClient` overrides (their signatures must match exactly).
PAHO_OVERRIDES: tuple[str, ...] = ("Client._loop", "Client.reconnect", "Client.publish", "Client.disconnect",
                                   "Client._sock_recv", "Client._create_socket_connection",
                                   "Client._check_keepalive")

#: Every public name of paho this module imports or relies on, as a module path.
PAHO_NAMES: tuple[str, ...] = tuple(f"paho.mqtt.{name}" for name in (
    "client.Client", "client.ConnectFlags", "client.MQTTMessage", "client.MQTTMessageInfo", "client.MQTT_ERR_SUCCESS",
    "client.connack_string", "client.error_string", "enums.CallbackAPIVersion", "enums.MQTTErrorCode",
    "enums.MQTTProtocolVersion", "packettypes.PacketTypes", "properties.Properties", "reasoncodes.ReasonCode"))

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

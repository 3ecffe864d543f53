"""The pure core: every node decision smartclient makes, with no I/O.

Addresses, topology and candidates (:mod:`.topology`), the landing state machine that decides to keep,
reuse, dial, wait, fall back or give up (:mod:`.landing`), back-off and recovery policies, broker nodes
and fleet spread, the routing hash, offsets, stream arguments, filters, settings, TLS name rules,
redaction and the per-attempt deadline.  The protocol wings (:mod:`smartclient.stream`,
:mod:`smartclient.amqp`, :mod:`smartclient.mqtt`) carry these decisions out.
"""

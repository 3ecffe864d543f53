"""Which node an MQTT connection made through a load balancer reached, without the management API's connection
listing.

The listing gathers from every node: while one is cut off (a partition, until its peers give it up, about a
minute) each read waits for its timeout on every management node (20 s measured), and a reconnect through the
load balancer gave up after 20-30 s.  A connection whose session ends with it subscribes at QoS 0 to a topic of its
own for a moment instead: RabbitMQ keeps such a subscription in a queue of the connection's own
(``mqtt-subscription-<client id>qos0``, on the connection's node), whose row the management API answers at once
when read without statistics, as the AMQP 0.9.1 placer reads its exclusive queue's.  A persistent session's queue
stays where the session began, so it is not asked; nor is one the broker did not grant the subscription (no read
permission on the topic): the listing answers for them.  The subscription's topic is new each time, and only a
management node that shows its binding is believed: a node in a partition's minority still shows the queue an
earlier connection of the same client id left, with that connection's node (seen on RabbitMQ 4.3.6: a publisher
moved off a node cut from its peers was "found" back there three times in a row).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from smartclient._errors import ManagementError
from smartclient.mqtt.topics import filter_to_binding_key

if TYPE_CHECKING:
    from smartclient.mqtt._paho import PahoClient

log = logging.getLogger(__name__)

#: seconds for the subscription's SUBACK (and the UNSUBACK after it): a node that cannot declare the queue (its
#: metadata store in a minority) answers later, and the listing is asked then
ANSWER_WITHIN = 2.0


def subscribed_node(queue_node: Callable[[str, str, str], str | None], client: PahoClient,
                    vhost: str) -> str | None:
    """The node ``client`` (connected, with a session that ends with the connection) is on, as its QoS 0
    subscription's queue says, bound to the subscription's topic (``queue_node``:
    :meth:`ManagementClient.queue_node_bound`); None when it cannot say (not granted in time, not shown)."""
    queue, topic = f"mqtt-subscription-{client.client_id}qos0", f"smartclient/where/{uuid.uuid4().hex}"

    def read() -> str | None:
        try:
            return queue_node(vhost, queue, filter_to_binding_key(topic))
        except ManagementError as exc:
            log.debug("MQTT client %s: its subscription's queue was not shown (%s)", client.client_id, exc)
            return None

    return client.while_subscribed(topic, ANSWER_WITHIN, read)

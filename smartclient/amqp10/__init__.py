"""The AMQP 1.0 wing: connections of the official client (rabbitmq-amqp-python-client) placed on a node."""

"""The AMQP 0.9.1 wing, over pika: placed connections, RPC over the local random exchange, streams over
AMQP.  Import it only where pika is installed (``pip install 'smartclient[amqp]'``)."""

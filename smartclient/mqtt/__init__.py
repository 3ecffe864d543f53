"""The MQTT wing, over paho-mqtt: placed clients, fleets, topic mapping and ingestion into streams.  Import
it only where paho-mqtt is installed (``pip install 'smartclient[mqtt]'``)."""

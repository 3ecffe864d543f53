"""IoT ingestion: devices → MQTT → stream → Spark aggregate → stream, every hop placed by smartclient.

    python examples/iot_ingest.py        # against the local test bed (its HAProxy and management API)

1. A stream ``iot-readings-*`` is bound to the MQTT exchange for ``iot/+/temp`` (RabbitMQ maps the MQTT
   topic ``iot/device-7/temp`` to the routing key ``iot.device-7.temp``).
2. A fleet of MQTT devices, all driven by one thread, connects through the MQTT load balancer, is spread
   evenly over the nodes (checked with the management API), and publishes readings with QoS 1.
3. Spark reads the stream from replicas (``decode=amqp``: the MQTT payload, and the routing key) and
   writes per-device averages to ``iot-averages-*`` exactly once (:class:`ExactlyOnceSink`).
4. The readings are read back with a smartclient consumer: every reading exactly once.  Exit status 0
   when they are, and the averages add up.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from typing import Any

from resolvers import LoadBalancer
from smartclient import Address, Environment
from smartclient.management import ManagementClient
from smartclient.mqtt.ingest import bind_mqtt_topics
from smartclient.spark import ExactlyOnceSink, RabbitStreamDataSource, StreamConnection, local_session
from smartclient.stream.codec import decode_amqp

# the local test bed: round-robin HAProxy for streams and MQTT, rabbit-1's management API
STREAM_URI = os.environ.get("SMARTCLIENT_URI", "rabbitmq-stream://guest:guest@127.0.0.1:20052/")
MQTT_LB = os.environ.get("SMARTCLIENT_MQTT_LB", "127.0.0.1:20083")
MANAGEMENT = os.environ.get("SMARTCLIENT_MANAGEMENT", "http://127.0.0.1:20115")


def environment(uri: str, management: ManagementClient, mqtt_lb: str | None = None) -> Environment:
    """Everything through the load balancer: streams through the URI's address, MQTT through ``mqtt_lb``."""
    lb = Address.parse(uri.split("@")[-1].split("/")[0])
    return Environment(uri, resolver=LoadBalancer(lb, mqtt=mqtt_lb), management=management)


async def setup(uri: str, management: ManagementClient, readings: str, averages: str) -> None:
    async with environment(uri, management) as env:
        await env.create_stream(readings, exists_ok=True)
        await env.create_stream(averages, exists_ok=True)
    bind_mqtt_topics(management, readings, ["iot/+/temp"])


def run_devices(uri: str, management: ManagementClient, mqtt_lb: str, prefix: str, devices: int,
                readings_each: int) -> dict[str, int]:
    """Connect ``devices`` MQTT clients through the LB, spread over the nodes; each publishes its readings
    with QoS 1 (every PUBACK awaited).  Returns the fleet's connections per node."""
    env = environment(uri, management, mqtt_lb)
    with env.mqtt_fleet(devices, client_id_prefix=prefix) as fleet:
        infos = []
        for seq in range(readings_each):
            for device in range(devices):
                body = json.dumps({"device": f"{prefix}-{device}", "seq": seq, "temp": 20 + (device * 7 + seq) % 10})
                infos.append(fleet.publish(device, f"iot/{prefix}-{device}/temp", body, qos=1))
        for info in infos:
            info.wait_for_publish(timeout=30)
        if not all(info.is_published() for info in infos):
            raise RuntimeError("some readings were not acknowledged")
        return dict(fleet.per_node())


def aggregate(spark: Any, uri: str, readings: str, averages: str, app_id: str, checkpoint: str) -> None:
    """Stream ``readings`` (MQTT payloads) into per-device averages, written exactly once."""
    from pyspark.sql import functions as F

    lb = Address.parse(uri.split("@")[-1].split("/")[0])
    spark.dataSource.register(RabbitStreamDataSource)
    raw = (spark.readStream.format("rabbitmq_stream").option("uri", uri).option("loadBalancer", str(lb))
           .option("streams", readings).option("decode", "amqp").load())
    parsed = raw.select(F.col("offset"), F.col("routing_key"),
                        F.from_json(F.col("body").cast("string"), "device string, seq long, temp double").alias("r"))
    sink = ExactlyOnceSink(StreamConnection(uri, resolver=LoadBalancer(lb)), app_id=app_id, stream=averages,
                           key_columns=["device"], order_columns=["device"], slots=2)

    def per_batch(batch: Any, batch_id: int) -> None:
        summary = batch.groupBy(F.col("r.device").alias("device")).agg(
            F.count("*").alias("count"), F.round(F.avg("r.temp"), 3).alias("avg_temp"),
            F.min("offset").alias("first_offset"))
        sink(summary.select("device", F.to_json(F.struct("device", "count", "avg_temp", "first_offset"))
                            .alias("body")), batch_id)

    query = parsed.writeStream.foreachBatch(per_batch).option("checkpointLocation", checkpoint).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()


async def read_stream(uri: str, management: ManagementClient, stream: str, expect: int, amqp: bool,
                      timeout: float = 30.0) -> list[Any]:
    got: list[Any] = []

    def on_message(message: Any, context: Any) -> None:
        got.append(decode_amqp(bytes(message))[0] if amqp else bytes(message))

    async with environment(uri, management) as env:
        consumer = await env.consumer(stream, on_message, offset="first")
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        await consumer.close()
    return [json.loads(b) for b in got]


def check(readings: list[dict[str, Any]], averages: list[dict[str, Any]], devices: int, each: int) -> bool:
    keys = [(r["device"], r["seq"]) for r in readings]
    once = len(keys) == devices * each and len(set(keys)) == len(keys)
    counted = sum(a["count"] for a in averages) == devices * each
    return once and counted


def main() -> int:
    suffix = uuid.uuid4().hex[:6]
    readings, averages, prefix = f"iot-readings-{suffix}", f"iot-averages-{suffix}", f"device-{suffix}"
    devices, each = 60, 20
    user, password = "guest", "guest"
    management = ManagementClient(MANAGEMENT, user, password)
    asyncio.run(setup(STREAM_URI, management, readings, averages))
    per_node = run_devices(STREAM_URI, management, MQTT_LB, prefix, devices, each)
    print(f"{devices} devices through the MQTT load balancer {MQTT_LB}, per node: {per_node}")
    spark = local_session()
    try:
        with tempfile.TemporaryDirectory() as checkpoint:
            aggregate(spark, STREAM_URI, readings, averages, f"iot-{suffix}", checkpoint)
    finally:
        spark.stop()
    got = asyncio.run(read_stream(STREAM_URI, management, readings, devices * each, amqp=True))
    sums = asyncio.run(read_stream(STREAM_URI, management, averages, devices, amqp=False))
    ok = check(got, sums, devices, each)
    print(f"{len(got)} readings in {readings}, {len(sums)} device averages in {averages}; "
          f"every reading exactly once: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

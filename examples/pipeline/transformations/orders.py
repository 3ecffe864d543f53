"""The pipeline's definitions: a streaming table of orders read from a RabbitMQ stream (the ``rabbitmq_stream``
reader, on replicas through the load balancer), and a flow of the orders with tax into another stream through the
``rabbitmq_stream`` writer (``dp.create_sink``): each micro-batch written exactly once, by producers named from
the flow's query id, which the pipeline's storage keeps across runs.

Where to read and write comes from the environment of ``spark-pipelines run`` (these definitions run there):
``SMARTCLIENT_URI`` (through a load balancer: its address is the URI's), ``SMARTCLIENT_SOURCE`` and
``SMARTCLIENT_TARGET``."""

import os

from pyspark import pipelines as dp
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from smartclient.spark import RabbitStreamDataSource

spark = SparkSession.active()
spark.dataSource.register(RabbitStreamDataSource)

URI = os.environ.get("SMARTCLIENT_URI", "rabbitmq-stream://guest:guest@127.0.0.1:20052/")
LB = {"uri": URI, "loadBalancer": URI.split("@")[-1].split("/")[0]}

dp.create_sink("orders_taxed", format="rabbitmq_stream",
               options={**LB, "stream": os.environ.get("SMARTCLIENT_TARGET", "orders-taxed")})


@dp.table(comment="the orders, as their stream holds them")
def orders():
    return (spark.readStream.format("rabbitmq_stream").options(**LB)
            .option("streams", os.environ.get("SMARTCLIENT_SOURCE", "orders")).load())


@dp.append_flow(target="orders_taxed")
def with_tax():
    order = F.from_json(F.col("body").cast("string"), "id long, customer string, amount double")
    return spark.readStream.table("orders").select(F.to_json(F.struct(
        order.id.alias("id"), order.customer.alias("customer"),
        F.round(order.amount * 1.2, 2).alias("with_tax"))).alias("body"))

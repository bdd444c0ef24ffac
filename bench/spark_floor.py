"""Spark's own floor on this machine, against which ``bench/stream.py``'s numbers stand.

1. Throughput: Spark's Kafka source reading N tick records as a batch and counting them (no
   decode, no writes), then the same with the job's JVM decode (``jvm/decoder``) and with the
   Python reference decode (``mapInArrow``). A job built on Spark's Kafka source cannot go
   faster than these here.
2. Micro-batch latency: a streaming query Kafka → ``foreachBatch`` that only notes when it
   sees each tick, for several ``processingTime`` triggers. Latency is that moment minus the
   tick's produce time (one process, one clock): what is left for the job is the rest.
3. Continuous processing (``trigger(continuous=...)``): Kafka → Kafka with a projection,
   latency measured at a consumer of the output topic. It allows neither aggregations nor
   Python, so it cannot build candles: it shows what the mode gives, not something the job
   can use.
4. Real-time mode (Spark 4.1, ``Trigger.RealTime``), the same Kafka → Kafka projection:
   long-running tasks that emit each record as it arrives. Stateless only in 4.1, so no
   candles either, and pyspark 4.1.1 has no Python trigger for it.

Only a Kafka broker runs (private, free ports). The last line is JSON.

    python -m bench.spark_floor [--records N] [--seconds S]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame

from bench.kafka import produce_all
from bench.spark_read import kafka_source, read_rate
from bench.stack import private_broker, sigterm_unwinds
from bench.stats import pct
from bench.stream import tick
from candlewire.kafka import producer_config
from candlewire.spark import build_session
from streaming.decode import TICK_STRUCT, decode_ticks, decode_ticks_in_jvm

TOPICS = {"bench.floor.bulk": 6, "bench.floor.in": 1, "bench.floor.out": 1}


def pcts(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(samples) * 1000),
        "p99_ms": round(pct(samples, 0.99)),
        "n": len(samples),
    }


def paced(settings, topic: str, seconds: float, rate: float = 20.0) -> None:
    """Records whose value is their produce time in ns, at a low rate."""
    producer = Producer(producer_config(settings, **{"linger.ms": 0}))
    end = time.time() + seconds
    while time.time() < end:
        producer.produce(topic, value=str(time.time_ns()).encode())
        producer.poll(0)
        time.sleep(1 / rate)
    producer.flush(10)


def throughput(spark, settings, records: int) -> dict[str, float]:
    producer = Producer(producer_config(settings, **{"linger.ms": 20}))
    now = time.time_ns()
    bulk = ((b"k%d" % (i % 8), tick("B:T/U", i, now + i)) for i in range(records))
    produce_all(producer, "bench.floor.bulk", bulk, flush_s=60)

    def records_() -> DataFrame:
        return kafka_source(spark, settings, "bench.floor.bulk", False).select(
            "value", "partition", "offset"
        )

    return {
        "kafka_read": read_rate(records_, "kafka_read"),
        "kafka_read_decode_jvm": read_rate(
            lambda: decode_ticks_in_jvm(spark, records_()).where("valid"), "kafka_read_decode_jvm"
        ),
        "kafka_read_decode_python": read_rate(
            lambda: records_().mapInArrow(decode_ticks, TICK_STRUCT).where("valid"),
            "kafka_read_decode_python",
        ),
    }


def micro_batch_latency(spark, settings, trigger_ms: int, seconds: float) -> dict[str, float]:
    seen: list[float] = []

    def note(df, _batch_id: int) -> None:
        values = [int(r.value) for r in df.selectExpr("CAST(value AS STRING) value").collect()]
        now = time.time_ns()
        seen.extend((now - v) / 1e9 for v in values)

    checkpoint = tempfile.mkdtemp(prefix="floor-", dir="/dev/shm")
    query = (
        kafka_source(spark, settings, "bench.floor.in", True, "latest")
        .writeStream.foreachBatch(note)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .start()
    )
    time.sleep(5)  # the query is running and has taken its starting offsets
    paced(settings, "bench.floor.in", seconds)
    time.sleep(2)
    query.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)
    result = pcts(seen)
    print(f"micro-batch, processingTime {trigger_ms} ms: {result}")
    return result


def continuous_latency(spark, settings, seconds: float) -> dict[str, float]:
    def start(checkpoint: str):
        return (
            kafka_source(spark, settings, "bench.floor.in", True, "latest")
            .selectExpr("value")
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", settings.kafka_servers())
            .option("topic", "bench.floor.out")
            .option("checkpointLocation", checkpoint)
            .trigger(continuous="1 second")
            .start()
        )

    return kafka_to_kafka(settings, start, seconds, "continuous, 1 s epochs")


def real_time_latency(spark, settings, seconds: float, batch: str) -> dict[str, float]:
    """Real-time mode has no Python trigger in pyspark 4.1.1: the query is started through
    the JVM's ``Trigger.RealTime``, as a Scala or Java job would start it. ``batch`` is its
    checkpoint interval: tasks restart at each boundary, which is what a short one shows."""

    def start(checkpoint: str):
        jdf = kafka_source(spark, settings, "bench.floor.in", True, "latest").selectExpr("value")
        trigger = spark._jvm.org.apache.spark.sql.streaming.Trigger.RealTime(batch)
        return (
            jdf._jdf.writeStream()
            .format("kafka")
            .option("kafka.bootstrap.servers", settings.kafka_servers())
            .option("topic", "bench.floor.out")
            .option("checkpointLocation", checkpoint)
            .outputMode("update")
            .trigger(trigger)
            .start()
        )

    return kafka_to_kafka(settings, start, seconds, f"real-time mode, {batch} batches")


def kafka_to_kafka(settings, start, seconds: float, label: str) -> dict[str, float]:
    """Latency of a Kafka → Kafka query (``start(checkpoint)``), measured at a consumer of
    the output topic: its receive time minus the produce time each record carries."""
    checkpoint = tempfile.mkdtemp(prefix="floor-", dir="/dev/shm")
    query = start(checkpoint)
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_servers(),
            "group.id": f"floor-{time.time_ns()}",
            "auto.offset.reset": "latest",
        }
    )
    consumer.subscribe(["bench.floor.out"])
    seen: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            msg = consumer.poll(0.1)
            if msg is not None and not msg.error():
                seen.append((time.time_ns() - int(msg.value())) / 1e9)

    reader = threading.Thread(target=consume)
    reader.start()
    time.sleep(8)  # the long-running tasks start and the consumer is assigned
    paced(settings, "bench.floor.in", seconds)
    time.sleep(3)
    stop.set()
    reader.join()
    consumer.close()
    query.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)
    result = pcts(seen)
    print(f"{label}, Kafka → Kafka: {result}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with private_broker() as settings:
        admin = AdminClient({"bootstrap.servers": settings.kafka_servers()})
        for topic, parts in TOPICS.items():
            admin.create_topics([NewTopic(topic, num_partitions=parts, replication_factor=1)])[
                topic
            ].result()
        spark = build_session(settings, "candlewire-floor")
        try:
            report = {"throughput_per_s": throughput(spark, settings, args.records)}
            report["micro_batch"] = {
                f"{ms}ms": micro_batch_latency(spark, settings, ms, args.seconds)
                for ms in (0, 100, 500)
            }
            report["continuous"] = continuous_latency(spark, settings, args.seconds)
            report["real_time"] = {
                batch: real_time_latency(spark, settings, args.seconds, batch)
                for batch in ("5 seconds", "5 minutes")
            }
            print(json.dumps(report))
        finally:
            spark.stop()


if __name__ == "__main__":
    with sigterm_unwinds():  # its broker stops on a kill too
        main()

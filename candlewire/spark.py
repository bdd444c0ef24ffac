"""The one Spark session factory, used by the streaming job and by Dagster.

Jars come from `make jvm` (never spark.jars.packages), so the set is fixed and cached.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from candlewire.config import Settings
from candlewire.lake import s3_environment, spark_catalog_conf
from candlewire.runtime import HEAP_NEAR_LIVE_SET, archive_options, dump_options, publish_archive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery


log = logging.getLogger("candlewire.spark")

# Iceberg commits are optimistic: when another writer commits first (the streaming job's
# MERGEs and appends, a compaction's rewrites), a commit that conflicts with it fails
# validation instead of overwriting it. Every statement we send through here is safe to run
# again on the new table state: MERGEs write absolute values, and maintenance procedures
# re-plan from the latest snapshot.
COMMIT_ATTEMPTS = 6
_CONFLICTS = (
    "ValidationException",
    "CommitFailedException",
    "conflicting",
    "Missing required files",
)


class SparkSetupError(RuntimeError):
    pass


def commit_sql(spark: SparkSession, statement: str) -> list:
    """Run a committing statement, again when a concurrent commit won the race."""
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return spark.sql(statement).collect()
        except Exception as exc:
            if attempt == COMMIT_ATTEMPTS or not any(c in str(exc) for c in _CONFLICTS):
                raise
            log.warning("commit lost a race (attempt %d), running again: %s", attempt, exc)
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


def local_files_jar(settings: Settings) -> str:
    """``jvm/decoder``'s LocalFiles alone, which ``make jvm`` builds."""
    jar = settings.jvm_dir / "boot" / "candlewire-localfs.jar"
    if not jar.is_file():
        raise SparkSetupError(f"{jar} missing: run `make jvm`")
    return str(jar)


def local_checkpoints(settings: Settings) -> dict[str, str]:
    """Checkpoints on a local disk are written through FileSystem (``LocalFiles``), whose
    rename is rename(2); elsewhere (an object store) Spark's default manager stays."""
    location = settings.checkpoints()
    if "://" in location and not location.startswith("file:"):
        return {}
    manager = "org.apache.spark.sql.execution.streaming.checkpointing."
    manager += "FileSystemBasedCheckpointFileManager"
    return {"spark.sql.streaming.checkpointFileManagerClass": manager}


def spark_jars(settings: Settings) -> list[str]:
    jars = sorted(str(p) for p in (settings.jvm_dir / "spark").glob("*.jar"))
    if not jars:
        raise SparkSetupError(f"Spark jars missing in {settings.jvm_dir / 'spark'}: run `make jvm`")
    return jars


STATE_STORE_MEMORY_MB = 64
MALLOC_ARENAS = "2"
# Spark's generated code for the committing query's wide rows has methods over HotSpot's
# 8,000-byte limit, which it never compiles: one such serializer ran interpreted and took a
# third of the judging stage (JFR). Compiled, the stage took a quarter less.
COMPILE_HUGE = "-XX:-DontCompileHugeMethods"
# The JIT's code cache, 240 MiB by default: an idle job's planning compiles tens of thousands
# of lukewarm Spark SQL methods with profiling (tier 3), 75 of its 113 MiB after 28 minutes,
# and HotSpot flushes cold ones only as the cache fills (#36). Hot code is compiled without
# profiling (31 MiB of it then) and stays.
CODE_CACHE = "-XX:ReservedCodeCacheSize=128m"
# The driver runs the live path and the committing query on all the machine's cores, and its
# collections stop both. The parallel collector stops the world as the serial one does but
# collects on every core: under load the job stood still less than half as long and committed
# 7-13 % more, for 50-110 MiB more heap (docs/benchmarks.md, 2026-12-05, night). A time goal
# of 5 % (GCTimeRatio=19; its default is 1 %) keeps its sizing from growing the heap toward
# the cap to collect less often.
DRIVER_COLLECTOR = ("-XX:+UseParallelGC", "-XX:GCTimeRatio=19")
DRIVER_JVM_OPTIONS = " ".join(
    ("-Xms64m", COMPILE_HUGE, CODE_CACHE, *DRIVER_COLLECTOR, *HEAP_NEAR_LIVE_SET)
)


def class_archive(settings: Settings) -> Path:
    """The driver's class archive, which ``make archives`` dumps (:func:`dump_class_archive`)."""
    return settings.jvm_dir / "spark" / "driver.jsa"


def class_archive_options(settings: Settings) -> tuple[str, ...]:
    """The JVM options that map the driver's class archive, when there is one. The driver,
    the executors and a standalone cluster's master and workers share its class path: a
    session's start and first query took 14 s without and 6.5 s with,
    ``tests/candlewire/test_spark.py`` 70 s and 46 s."""
    return archive_options(class_archive(settings))


def spark_conf(settings: Settings, app_name: str) -> dict[str, str]:
    """Every setting the platform needs; a cluster only changes master and locations."""
    archive = class_archive_options(settings)
    boot = local_files_jar(settings)
    return {
        "spark.app.name": app_name,
        "spark.master": settings.spark_master_url(),
        "spark.jars": ",".join(spark_jars(settings)),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.defaultCatalog": settings.catalog_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.scheduler.mode": "FAIR",
        "spark.ui.enabled": str(settings.spark_ui).lower(),
        "spark.ui.showConsoleProgress": "false",  # progress bars are noise in a service log
        "spark.driver.host": settings.host,
        "spark.driver.bindAddress": settings.bind_host,
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.driver.extraJavaOptions": " ".join((DRIVER_JVM_OPTIONS, *archive)),
        "spark.executor.extraJavaOptions": " ".join((COMPILE_HUGE, *archive)),
        # Spark keeps every job's, stage's and task's record for its UI and REST API, UI or
        # not, up to 1,000 jobs and 100,000 tasks: a streaming job makes thousands an hour,
        # so its heap grew for hours (#34's soak, #36). The last few hundred are plenty.
        "spark.ui.retainedJobs": "200",
        "spark.ui.retainedStages": "200",
        "spark.ui.retainedTasks": "5000",
        "spark.sql.ui.retainedExecutions": "100",
        # Hadoop's local file system runs a `chmod` program for every file it creates and a
        # `readlink` for every rename through its FileContext, for want of its native library:
        # 242 programs in 30 s of a 3,000 ticks/s soak, forked from the job's JVM. Our
        # LocalFiles sets the mode through the JDK, and the checkpoints are written through
        # FileSystem, whose rename of a local file is rename(2), atomic as before. Spark opens
        # the local file system before it loads `spark.jars`, so the class is on the JVMs'
        # own class path (a cluster's workers run from this installation's files).
        "spark.hadoop.fs.file.impl": "io.candlewire.spark.LocalFiles",
        "spark.driver.extraClassPath": boot,
        "spark.executor.extraClassPath": boot,
        **local_checkpoints(settings),
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        # Each batch writes only the state it changed, not a snapshot of the whole store
        # (snapshots are made in the background): batches of 31-58 ticks were judged and
        # written in 0.98-0.99 s against 1.16-1.56 s (bench.stream).
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # One bound for every state store instance's memtables and block cache together
        # (RocksDB's default is 64 MiB of memtable per instance, twice, per partition): the
        # committing query's state is each feed's clock, candles and packed trade ids.
        "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
        "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": str(STATE_STORE_MEMORY_MB),
        **spark_catalog_conf(settings),
        **(
            {f"spark.executorEnv.{k}": v for k, v in s3_environment(settings).items()}
            if settings.on_s3()
            else {}
        ),
    }


def build_session(
    settings: Settings, app_name: str = "candlewire", conf: dict[str, str] | None = None
) -> SparkSession:
    """A session on :func:`spark_conf`, or on ``conf`` when given (the class archive's)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", settings.bind_host)
    # Python workers must be this interpreter (with candlewire installed), not PATH's python3.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # glibc gives each thread that allocates natively (RocksDB, codecs) an arena of its own,
    # up to 8 per core, and keeps what they grew to: 15 arenas held 687 MiB of the stream
    # job's RSS after 30 minutes under load (#34's soak). The JVM reads this as it starts.
    os.environ.setdefault("MALLOC_ARENA_MAX", MALLOC_ARENAS)
    builder = SparkSession.builder
    for key, value in (conf or spark_conf(settings, app_name)).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


# What a driver of the platform does as it starts, for the class archive: a session on the
# platform's settings, Iceberg DDL, an insert, a MERGE, a query, a stateful streaming batch
# in RocksDB through foreachBatch, and the Kafka source's planning. The catalog is a
# temporary Hadoop one: ``make install`` dumps it before any PostgreSQL runs.
ARCHIVE_WORKLOAD = (
    "CREATE TABLE {t} (ticker string, open_time timestamp, close decimal(38,18), n bigint) "
    "USING iceberg PARTITIONED BY (days(open_time))",
    "INSERT INTO {t} VALUES ('A', TIMESTAMP '2025-03-01 00:00:00', 1.5, 1)",
    "MERGE INTO {t} o USING (SELECT 'A' AS ticker, TIMESTAMP '2025-03-01 00:00:00' AS "
    "open_time, 2.5 AS close, 2L AS n) s ON o.ticker = s.ticker AND o.open_time = s.open_time "
    "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
    "SELECT ticker, max(close), sum(n) FROM {t} GROUP BY ticker",
)


def one_stateful_batch(spark: SparkSession, checkpoint: str) -> StreamingQuery:
    """One batch of a stateful query (counts in the state store, through ``foreachBatch``),
    checkpointed at ``checkpoint``, run to its end: what a streaming driver loads and writes."""
    counts = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
    query = (
        counts.groupBy((counts.value % 3).alias("k"))
        .count()
        .writeStream.outputMode("update")
        .option("checkpointLocation", checkpoint)
        .foreachBatch(lambda frame, _batch: frame.collect())
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    return query


def dump_class_archive(settings: Settings) -> Path:
    """Run :data:`ARCHIVE_WORKLOAD` in a driver that dumps the classes it loaded as it exits."""
    archive = class_archive(settings)
    archive.unlink(missing_ok=True)  # the old one, however the dump ends
    with tempfile.TemporaryDirectory(prefix="candlewire-archive-") as tmp:
        prefix = f"spark.sql.catalog.{settings.catalog_name}"
        conf = {
            **{
                k: v
                for k, v in spark_conf(settings, "candlewire-class-archive").items()
                if not k.startswith(f"{prefix}.")
            },
            "spark.master": "local[2]",
            f"{prefix}.type": "hadoop",
            f"{prefix}.warehouse": f"file://{tmp}/warehouse",
            "spark.driver.extraJavaOptions": " ".join((DRIVER_JVM_OPTIONS, *dump_options(archive))),
        }
        spark = build_session(settings, conf=conf)
        table = f"{settings.catalog_name}.archive.candles"
        for statement in ARCHIVE_WORKLOAD:
            spark.sql(statement.format(t=table)).collect()
        one_stateful_batch(spark, f"{tmp}/checkpoint")
        kafka = spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
        kafka.option("subscribe", "archive").load().schema  # noqa: B018 (planned, never run)
        gateway = spark.sparkContext._gateway
        spark.stop()
        # The JVM dumps as it exits, which it does when its stdin closes.
        gateway.shutdown()
        gateway.proc.stdin.close()
        gateway.proc.wait(timeout=300)
    return publish_archive(archive)


if __name__ == "__main__":  # make archives
    dump_class_archive(Settings())

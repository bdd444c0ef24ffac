from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from candlewire.config import POSTGRES_PASSWORD, Settings
from candlewire.lake import ensure_tables
from candlewire.secrets import ensure_secret
from candlewire.topics import work_prefix
from journal.service import JournalService
from launcher.local.postgres import LocalPostgres
from launcher.stack import ProcessService, kafka_service
from relay import Relay
from tests.scheduling import ByModule, in_unit
from tests.support import (
    RELAYS,
    RUNNING,
    FakeIngestor,
    FakePublisher,
    fast_books,
    faulty_books,
    free_settings,
    serve_pipeline,
    start_job,
    wait_for,
)

# Every JVM the suite starts (the Spark jobs and sessions, Kafka, the Spark cluster) compiles
# with C1 only. Each lives for seconds to minutes over little data, so C2's compiling never
# pays back: on two cores it took a sixth of a running job's CPU, and a Spark module ran
# 12-28 % faster without it. What the code does is the same; benchmarks keep C2.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
# The suite starts ingestor after ingestor on the same tickers of one broker, each as a new
# process would: each would resume the last one's streams and repair the time between as a
# gap. The tests of that (tests/ingest/test_gaps.py) turn it on.
os.environ.setdefault("CANDLEWIRE_INGEST__RESUME_WITHIN_S", "0")


# The modules that run Spark, its cluster or the whole stack. Under ``make test``'s two
# pytest-xdist workers they are one unit of work, run one after another on one worker (so
# the live pipeline's Spark job starts once), and every other module runs beside them on the
# other: two Spark modules at once on two cores took about twice as long each. The brokers'
# and Dagster's modules run beside the unit; in it they left the other worker idle for a
# third of the run. Of the orchestration modules only those on the live pipeline are in it:
# the unit's worker ended about four minutes after the other one.
ONE_AFTER_ANOTHER = (
    "tests/streaming/",
    "tests/orchestration/test_assets.py",
    "tests/orchestration/test_webserver.py",
    "tests/test_examples.py",
    "tests/candlewire/test_spark.py",
    "tests/launcher/test_spark_cluster.py",
)
# The whole-stack module runs beside the unit, first on the other worker: in the unit it took
# 90-180 s of the run's critical path, much of it waiting on its own stack, while the other
# worker ran out of modules minutes before the unit ended (2026-12-07).
FIRST_BESIDE = ("tests/launcher/test_stack.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Those modules first, and within them the tests on the live pipeline last, together,
    in their order. Its Spark job, started by the first of them, runs to the session's end,
    and its idle micro-batches took CPU from every test that ran between them."""
    live = [item for item in items if "live_pipeline" in getattr(item, "fixturenames", ())]
    stray = {i.path.name for i in live if not in_unit(i.nodeid, ONE_AFTER_ANOTHER)}
    if stray:
        raise pytest.UsageError(f"{sorted(stray)}: on the live pipeline, so ONE_AFTER_ANOTHER")
    chosen = set(live)
    unit: list[pytest.Item] = []
    first: list[pytest.Item] = []
    rest: list[pytest.Item] = []
    for item in items:
        if item in chosen:
            continue
        if in_unit(item.nodeid, ONE_AFTER_ANOTHER):
            unit.append(item)
        else:
            (first if in_unit(item.nodeid, FIRST_BESIDE) else rest).append(item)
    items[:] = unit + live + first + rest


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):  # its hook is unknown to pytest otherwise
        config.pluginmanager.register(ByModule(ONE_AFTER_ANOTHER), "candlewire-scheduling")


@pytest.fixture
def settings(tmp_path) -> Settings:
    return free_settings(tmp_path)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def relay(settings: Settings) -> Iterator[Relay]:
    r = Relay(settings).start()
    yield r
    r.stop()


@pytest.fixture
def publisher(ctx: zmq.Context, settings: Settings) -> Iterator[FakePublisher]:
    pub = FakePublisher(ctx, settings.bind("stream_pub"), settings=settings)
    yield pub
    pub.close()


@pytest.fixture
def served(ctx: zmq.Context, settings: Settings, relay: Relay) -> Iterator[FakeIngestor]:
    """Work-queue subscribers for BINANCE and COINBASE, so the relay sees them served."""
    ing = FakeIngestor(ctx, settings, [work_prefix("BINANCE"), work_prefix("COINBASE")])
    wait_for(lambda: relay.has_ingestor("BINANCE") and relay.has_ingestor("COINBASE"))
    yield ing
    ing.close()


@pytest.fixture
def pipeline(ctx, settings, publisher, relay) -> Iterator[None]:
    """A BINANCE ingestor and stream processor that answer each request at once.

    Like the real stream processor, they repeat each notification on NOTIFY_REPEAT_DELAYS_S.
    """
    stop = threading.Event()
    t = threading.Thread(target=serve_pipeline, args=(ctx, settings, publisher, stop))
    t.start()
    time.sleep(0.2)  # the fake ingestor's subscription reaches the relay
    yield
    stop.set()
    t.join()


# -- the real platform, started once per test session on free ports ------------------------


@pytest.fixture(scope="session")
def platform_dir() -> Iterator[Path]:
    # Not under pytest's 0700 tmp dir: PostgreSQL runs as the postgres user when we are root.
    base = Path(tempfile.mkdtemp(prefix="candlewire-test-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def platform_settings(platform_dir: Path) -> Settings:
    return free_settings(platform_dir)


@pytest.fixture(scope="session")
def postgres(platform_settings: Settings) -> Iterator[LocalPostgres]:
    password = ensure_secret(platform_settings, POSTGRES_PASSWORD)
    pg = LocalPostgres(
        platform_settings.state_dir / "postgres", platform_settings.port("postgres"), password
    )
    pg.init_once()
    pg.start(platform_settings.state_dir / "postgres.log")
    yield pg
    pg.stop()


@pytest.fixture(scope="session")
def kafka(platform_settings: Settings) -> Iterator[ProcessService]:
    """The broker as `candlewire up` runs it; tests may stop() and start() it."""
    svc = kafka_service(platform_settings)
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture
def broker_settings(platform_settings: Settings, kafka: ProcessService, tmp_path: Path) -> Settings:
    """Ports of its own but the session's broker, for a test that starts its own relay and
    ingestors: in a run in one process the live pipeline's modules come first, and its relay
    and SIM ingestor (which would take the test's work) hold the platform's ports to the
    session's end."""
    own = free_settings(tmp_path)
    return own.model_copy(update={"ports": {**own.ports, "kafka": platform_settings.port("kafka")}})


@pytest.fixture(scope="session")
def lakehouse(platform_settings: Settings, postgres: LocalPostgres) -> Settings:
    """Settings whose Iceberg catalog exists, with the platform's tables."""
    ensure_tables(platform_settings)
    return platform_settings


@pytest.fixture(scope="session")
def live_pipeline(lakehouse: Settings, kafka: ProcessService) -> Iterator[Settings]:
    """Relay, a SIM ingestor and the real Spark streaming job, shared by the modules that
    need the whole path (streaming, orchestration); a test may replace the job (RUNNING)."""
    from ingest.exchanges.sim import SimExchange
    from ingest.service import Ingestor

    RELAYS.append(Relay(lakehouse, metrics=False).start())
    journal = JournalService(lakehouse, metrics=False).start()
    ingestor = Ingestor(
        lakehouse,
        [SimExchange(), fast_books(), faulty_books()],
        heartbeat_s=0.2,
        warmup_beats=2,
        metrics=False,
    ).start()
    RUNNING.append(start_job(lakehouse))
    yield lakehouse
    for job in RUNNING:
        job.terminate()
        job.wait(60)
    ingestor.stop()
    journal.stop()
    RELAYS[-1].stop()
    shutil.copy(lakehouse.state_dir / "stream.log", "/tmp/candlewire-stream-test.log")

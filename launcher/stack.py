"""``candlewire up | down | status``: the local stack, each part with a live health check.

Each part starts as soon as the parts it needs are healthy (``needs``), so PostgreSQL and
Kafka start together, and the platform's own processes and Dagster's start side by side
once those are up; the stack stops in reverse order. Each process has a pid file and a log in the state dir.
``up`` is idempotent: a running part is left alone; a port held by something else is a
one-line error naming the fix. Parts pointed elsewhere by configuration (an existing Kafka
cluster, an existing catalog database) are not started locally.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from candlewire.config import (
    KAFKA_PASSWORD,
    POSTGRES_PASSWORD,
    S3_SECRET_KEY,
    Settings,
    port_setting,
)
from candlewire.endpoints import ENDPOINTS
from candlewire.errors import CandlewireError
from candlewire.runtime import pid_alive
from candlewire.secrets import ensure_secret

Echo = Callable[[str], None]

# The local ingestor's exchanges: SIM under its own name, and under BINANCE so that
# BINANCE:BTC/USDT works out of the box.
LOCAL_EXCHANGES = ("SIM", "BINANCE=sim")
# Parts an earlier version ran and this one does not, with a word of their command line: a
# stack started before an upgrade still has them running, and `down` stops them too.
RETIRED_PARTS = {"dagster-code": "dagster"}  # its code server, in the dagster part since 85a08a9


class StackError(CandlewireError, RuntimeError):
    """A prerequisite is missing or a part would not start; the message says what to do."""


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_health(url: str, needle: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body = resp.read().decode(errors="replace")
        except OSError as exc:
            return f"{url}: {exc}"
        return None if needle in body else f"{url}: {needle!r} not reported"

    return check


def gauge(settings: Settings, endpoint: str, name: str) -> float | None:
    """A service's gauge ``name`` from its ``/metrics``; None when it does not answer, answers
    with something else than Prometheus' text, or has no such gauge."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(settings.metrics_url(endpoint), timeout=2) as resp:
            body = resp.read().decode(errors="replace")
        for family in text_string_to_metric_families(body):
            if family.name == name and family.samples:
                return family.samples[0].value
    except (OSError, ValueError):
        return None
    return None


def reap(pid: int) -> None:
    """Collect the exit status if the process is our own child, so it is not a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def alive(pid: int) -> bool:
    reap(pid)
    return pid_alive(pid)


class Service:
    """One part of the stack. Subclasses say how it starts, stops and proves health."""

    name: str
    port: int | None
    needs: tuple[str, ...] = ()  # parts that must be healthy first (when in the stack)

    def pid(self) -> int | None:
        return None

    def start(self, give_up: threading.Event | None = None) -> None:
        """Start, and return once healthy; stop waiting (StackError) once ``give_up`` is set."""
        raise NotImplementedError

    def stop(self) -> None:
        pass

    def health(self) -> str | None:
        raise NotImplementedError


@dataclass
class ProcessService(Service):
    """A foreground process we spawn in its own session and track by pid file."""

    name: str
    argv: Callable[[], list[str]]
    port: int | None  # None: serves no port of its own
    check: Callable[[], str | None]
    run_dir: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None
    after_start: Callable[[], None] | None = None
    start_timeout: float = 60.0
    stop_timeout: float = 30.0
    host: str | None = None  # where ``port`` is served, when not ``settings.host``
    needs: tuple[str, ...] = ()
    # Stop the leader first, and its group only after it is gone: a process that stops its
    # own children in order (the stream job its queries, then its JVM).
    leader_first: bool = False

    @property
    def pidfile(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    def pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if alive(pid) else None

    def health(self) -> str | None:
        return self.check()

    def start(self, give_up: threading.Event | None = None) -> None:
        if self.prepare is not None:
            self.prepare()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            proc = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        self.pidfile.write_text(str(proc.pid))
        deadline = time.monotonic() + self.start_timeout
        problem = self.check()
        while problem is not None:
            if proc.poll() is not None:
                tail = self.log.read_text(errors="replace").splitlines()[-20:]
                self.pidfile.unlink(missing_ok=True)
                raise StackError(
                    f"{self.name} exited during start; {self.log}:\n" + "\n".join(tail)
                )
            if time.monotonic() > deadline:
                raise StackError(
                    f"{self.name} not healthy after {self.start_timeout:.0f}s: {problem}"
                )
            if give_up is not None and give_up.is_set():
                raise StackError(f"{self.name}: start abandoned; it may still come up")
            time.sleep(0.3)
            problem = self.check()
        if self.after_start is not None:
            self.after_start()

    def stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            stop_process_group(pid, self.stop_timeout, self.leader_first)
        self.pidfile.unlink(missing_ok=True)


GROUP_GRACE_S = 10.0


def stop_process_group(pid: int, timeout: float, leader_first: bool = False) -> None:
    """SIGTERM the process group, then SIGKILL whatever outlives ``timeout``. With
    ``leader_first``, the leader alone first, and the group once it is gone: the stream
    job's JVM, signalled with it, ran Spark's shutdown hook under the queries the job was
    stopping, and each stop failed on a stopped SparkContext, in the log."""
    deadline = time.monotonic() + timeout
    if leader_first:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if leader_first:  # what is left of the group gets its own grace, however long the leader took
        deadline = max(deadline, time.monotonic() + min(GROUP_GRACE_S, timeout))
    while time.monotonic() < deadline:
        reap(pid)
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


@dataclass
class PostgresService(Service):
    """The private PostgreSQL, managed with pg_ctl (it daemonizes itself)."""

    settings: Settings
    log: Path
    name: str = "postgres"

    def __post_init__(self) -> None:
        self.port = self.settings.port("postgres")

    def _pg(self):
        from launcher.local.postgres import LocalPostgres, PostgresSetupError

        try:
            password = ensure_secret(self.settings, POSTGRES_PASSWORD)
            return LocalPostgres(self.settings.state_dir / "postgres", self.port, password)
        except PostgresSetupError as exc:
            raise StackError(str(exc)) from None

    def pid(self) -> int | None:
        return self._pg().pid()

    def start(self, give_up: threading.Event | None = None) -> None:
        from launcher.local.postgres import PostgresSetupError

        pg = self._pg()
        try:
            pg.init_once()
            pg.start(self.log)
        except PostgresSetupError as exc:
            raise StackError(f"postgres: {exc}") from None

    def stop(self) -> None:
        self._pg().stop()

    def health(self) -> str | None:
        from launcher.local.postgres import PostgresSetupError

        try:
            ok = self._pg().psql("SELECT 1").strip() == "1"
        except PostgresSetupError as exc:
            return str(exc)
        return None if ok else "SELECT 1 did not answer 1"


@dataclass
class CatalogService(Service):
    """Not a process: the Iceberg namespace and tables, created when missing."""

    settings: Settings
    name: str = "iceberg-catalog"
    needs: tuple[str, ...] = ("postgres", "s3proxy")

    def __post_init__(self) -> None:
        self.port = self.settings.port("postgres")

    def start(self, give_up: threading.Event | None = None) -> None:
        from candlewire.lake import ensure_tables

        ensure_tables(self.settings)

    def health(self) -> str | None:
        from candlewire.lake import catalog_health

        return catalog_health(self.settings)


class Stack:
    def __init__(self, settings: Settings, services: list[Service]) -> None:
        self.settings = settings
        self.services = services

    def up(self, echo: Echo = print) -> None:
        """Start every part that is not running, each once the parts it needs are healthy.
        Parts whose needs are met start together, each in a thread that waits for its own
        health; the lines are echoed from here as parts come up. After a failure nothing
        more starts: the parts already starting finish, then the first error is raised.
        If ``up`` itself is stopped (Ctrl-C), no part goes on waiting for its health."""
        present = {svc.name for svc in self.services}
        pending, healthy = list(self.services), set[str]()
        starting: dict[Future[None], Service] = {}
        errors: list[BaseException] = []
        give_up = threading.Event()

        def meets(svc: Service) -> bool:
            return set(svc.needs) & present <= healthy

        with ThreadPoolExecutor(max_workers=len(self.services) or 1) as pool:
            try:
                while True:
                    while not errors and (ready := [s for s in pending if meets(s)]):
                        svc = ready[0]
                        pending.remove(svc)
                        if (pid := svc.pid()) is not None:
                            echo(f"{svc.name}: already running (pid {pid})")
                            healthy.add(svc.name)  # which may free others at once
                            continue
                        try:
                            self._port_free(svc)
                        except StackError as exc:
                            errors.append(exc)
                            break
                        starting[pool.submit(svc.start, give_up)] = svc
                    if not starting:
                        if errors or not pending:
                            break
                        names = ", ".join(s.name for s in pending)
                        raise StackError(f"{names}: a part they need is not in the stack")
                    done, _ = wait(starting, return_when=FIRST_COMPLETED)
                    for future in done:
                        svc = starting.pop(future)
                        if (exc := future.exception()) is not None:
                            errors.append(exc)
                            continue
                        healthy.add(svc.name)
                        echo(f"{svc.name}: up" + (f" on port {svc.port}" if svc.port else ""))
            except BaseException:
                give_up.set()
                raise
        if errors:
            raise errors[0]

    def _port_free(self, svc: Service) -> None:
        """A one-line error naming the setting when the part's port is someone else's."""
        if (
            isinstance(svc, CatalogService)
            or svc.port is None
            or not port_open(getattr(svc, "host", None) or self.settings.host, svc.port)
        ):
            return
        names = [n for n in ENDPOINTS if self.settings.port(n) == svc.port]
        setting = port_setting(names[0]) if names else port_setting("<name>")
        raise StackError(
            f"{svc.name}: port {svc.port} is taken by another process; stop it or "
            f"move {svc.name} with {setting}=<port>"
        )

    def down(self, echo: Echo = print) -> None:
        """Stop every running part, each once the parts that need it have stopped (ingest and
        the stream job before Kafka, Dagster before PostgreSQL): up's order reversed, with
        the parts nothing waits on stopping together. One after another, `down` took the
        sum of every part's graceful stop. A part that fails to stop does not keep the rest
        running; its error is raised at the end."""
        waiting_on = {
            svc.name: {other.name for other in self.services if svc.name in other.needs}
            for svc in self.services
        }
        pending = list(self.services)
        stopping: dict[Future[None], Service] = {}
        errors: list[BaseException] = []

        def free(svc: Service) -> bool:
            return not waiting_on[svc.name] & {s.name for s in (*pending, *stopping.values())}

        with ThreadPoolExecutor(max_workers=len(self.services) or 1) as pool:
            while pending or stopping:
                # Nothing free and nothing stopping is a cycle of needs: the last part first.
                ready = [s for s in pending if free(s)] or ([] if stopping else pending[-1:])
                for svc in ready:
                    pending.remove(svc)
                    if svc.pid() is not None:
                        stopping[pool.submit(svc.stop)] = svc
                if not stopping:
                    continue  # what was free was not running, which frees more
                done, _ = wait(stopping, return_when=FIRST_COMPLETED)
                for future in done:
                    svc = stopping.pop(future)
                    if (exc := future.exception()) is not None:
                        errors.append(exc)
                    else:
                        echo(f"{svc.name}: stopped")
        self._stop_retired(echo)
        if errors:
            raise errors[0]

    def _stop_retired(self, echo: Echo) -> None:
        """Stop the :data:`RETIRED_PARTS` a pid file still names, if that pid is still theirs
        (its command line has their word, so a reused pid is left alone)."""
        for name, word in RETIRED_PARTS.items():
            pidfile = self.settings.state_dir / "run" / f"{name}.pid"
            try:
                pid = int(pidfile.read_text().strip())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError):
                pidfile.unlink(missing_ok=True)
                continue
            if word.encode() in cmdline and alive(pid):
                stop_process_group(pid, 30.0)
                echo(f"{name}: stopped (this version no longer runs it)")
            pidfile.unlink(missing_ok=True)

    def status(self) -> list[tuple[str, int | None, int | None, str]]:
        """(name, port, pid, health) for each part."""
        rows = []
        for svc in self.services:
            pid = svc.pid()
            if pid is None and not isinstance(svc, CatalogService):
                rows.append((svc.name, svc.port, None, "stopped"))
                continue
            rows.append((svc.name, svc.port, pid, svc.health() or "healthy"))
        return rows


def candlewire_argv(*args: str) -> Callable[[], list[str]]:
    """Run a candlewire subcommand with this interpreter."""
    return lambda: [sys.executable, "-m", "launcher.cli", *args]


def kafka_service(settings: Settings) -> ProcessService:
    """The local KRaft broker as a supervised process; `up`, the tests and benches share it."""
    (service,) = kafka_services(
        settings.model_copy(update={"kafka": settings.kafka.model_copy(update={"brokers": 1})})
    )
    return service


def kafka_services(settings: Settings) -> list[ProcessService]:
    """The local brokers (``[kafka] brokers``), one quorum. Each but the last is started
    once its controller listens (alone it has no quorum to be healthy with); the last once
    the cluster's metadata lists every broker, and then the topics are made."""
    from candlewire.kafka import ensure_topics, kafka_health
    from launcher.local.kafka import KafkaBroker, Scram

    # The SCRAM user is stored at the first format whether or not SASL is on yet, so turning
    # it on later needs no re-format.
    password = ensure_secret(settings, KAFKA_PASSWORD)
    k = settings.kafka
    quorum = tuple(settings.kafka_addresses())
    alone = len(quorum) == 1

    def whole() -> str | None:
        return kafka_health(settings, brokers=len(quorum))

    def listening(host: str, port: int) -> str | None:
        return None if port_open(host, port) else f"controller {host}:{port} not listening yet"

    controller = settings.port("kafka_controller")
    services = []
    for node, address in enumerate(quorum, 1):
        name = "kafka" if alone else f"kafka-{node}"
        broker = KafkaBroker(
            settings.state_dir / name,
            settings.jvm_dir / "kafka",
            settings.port("kafka"),
            controller,
            scram=Scram(k.mechanism, k.username, password, required=k.sasl),
            node_id=node,
            quorum=quorum,
            cluster_id=None if alone else settings.state_dir / "kafka-cluster-id",
        )
        last = node == len(quorum)
        services.append(
            ProcessService(
                name=name,
                argv=broker.argv,
                port=settings.port("kafka"),
                host=address,
                check=whole if last else partial(listening, address, controller),
                run_dir=settings.state_dir / "run",
                log=settings.state_dir / "logs" / f"{name}.log",
                prepare=broker.format_once,
                after_start=(lambda: ensure_topics(settings) and None) if last else None,
                start_timeout=90.0 if last and not alone else 60.0,
                needs=(services[-1].name,) if services else (),
            )
        )
    return services


def s3_service(settings: Settings) -> ProcessService:
    """The local S3Proxy of an s3:// warehouse; its bucket is made before it starts."""
    from candlewire.lake import storage_health, warehouse_bucket
    from launcher.local.s3proxy import S3Proxy

    proxy = S3Proxy(
        settings.state_dir / "s3proxy",
        settings.jvm_dir / "s3proxy",
        settings.bind_host,
        settings.port("s3"),
        settings.s3.access_key,
        ensure_secret(settings, S3_SECRET_KEY),
    )

    def prepare() -> None:
        proxy.prepare()
        proxy.make_bucket(warehouse_bucket(settings))

    return ProcessService(
        name="s3proxy",
        argv=proxy.argv,
        port=settings.port("s3"),
        check=lambda: storage_health(settings),
        run_dir=settings.state_dir / "run",
        log=settings.state_dir / "logs" / "s3proxy.log",
        env={"LOG_LEVEL": "info"},
        prepare=prepare,
    )


def spark_services(settings: Settings) -> list[ProcessService]:
    """A local Spark standalone master and ``spark_workers`` workers; the last is up when
    the master's status lists every worker alive."""
    from candlewire.spark import class_archive_options, local_files_jar
    from launcher.local.spark import StandaloneCluster, count_alive, master_workers

    cluster = StandaloneCluster(
        settings.host,
        settings.port("spark_master"),
        settings.port("spark_master_ui"),
        settings.state_dir / "spark",
        java_options=" ".join(class_archive_options(settings)),
        class_path=local_files_jar(settings),
    )

    def registered(workers: int) -> str | None:
        try:
            up = count_alive(master_workers(cluster.status_url))
        except (OSError, ValueError) as exc:
            return f"master status: {exc}"
        return None if up >= workers else f"{up} of {workers} workers alive"

    def service(name: str, argv: Callable[[], list[str]], workers: int) -> ProcessService:
        return ProcessService(
            name=name,
            argv=argv,
            port=settings.port("spark_master") if workers == 0 else None,
            check=partial(registered, workers),
            run_dir=settings.state_dir / "run",
            log=settings.state_dir / "logs" / f"{name}.log",
            env=cluster.env(),
            # Each worker's health counts the workers alive, so they come up one by one.
            needs=spark_needs(workers),
        )

    def spark_needs(workers: int) -> tuple[str, ...]:
        """The master needs nothing; worker i the master and worker i-1."""
        if workers == 0:
            return ()
        return (
            ("spark-master",) if workers == 1 else ("spark-master", f"spark-worker-{workers - 1}")
        )

    n = settings.spark_workers
    return [service("spark-master", cluster.master_argv, 0)] + [
        service(f"spark-worker-{i}", partial(cluster.worker_argv, i), i) for i in range(1, n + 1)
    ]


def default_services(settings: Settings, platform: bool = True) -> list[Service]:
    """The stack ``make up`` runs; ``platform=False`` is the relay alone (no Kafka, no SQL)."""

    run, logs = settings.state_dir / "run", settings.state_dir / "logs"
    env = settings.to_env()
    services: list[Service] = []
    if platform and settings.catalog_url is None:
        # The password before anything that builds a database URL (dagster.yaml below).
        ensure_secret(settings, POSTGRES_PASSWORD)
        services.append(PostgresService(settings, logs / "postgres.log"))
    if platform and settings.local_s3():
        services.append(s3_service(settings))
    if platform:
        services.append(CatalogService(settings))
    if platform and settings.kafka_bootstrap is None:
        services.extend(kafka_services(settings))
    if platform and settings.spark_workers:
        services.extend(spark_services(settings))

    def own(
        name: str,
        args: list[str],
        metrics_port: str,
        healthy_line: str,
        port_name: str | None = None,
        start_timeout: float = 60.0,
        prepare: Callable[[], None] | None = None,
        needs: tuple[str, ...] = (),
    ) -> ProcessService:
        """One of candlewire's own processes, healthy when its metrics say so."""
        url = settings.metrics_url(metrics_port)
        return ProcessService(
            name=name,
            argv=candlewire_argv(*args),
            port=settings.port(port_name or metrics_port),
            check=http_health(url, healthy_line),
            run_dir=run,
            log=logs / f"{name}.log",
            # Set, so it never floats: the health check reads this port.
            env=env | {port_setting(metrics_port): str(settings.port(metrics_port))},
            start_timeout=start_timeout,
            prepare=prepare,
            needs=needs,
            leader_first=True,
        )

    services.append(
        own(
            "relay",
            ["relay"],
            "relay_metrics",
            "candlewire_relay_up 1.0",
            port_name="client_requests",
        )
    )
    if not platform:
        return services
    ingest_args = ["ingest", "--exchange", ",".join(LOCAL_EXCHANGES), "--id", "ingest-local"]
    ingest_args += ["--stream", "BINANCE:BTC/USDT,SIM:BTC/USDT"]
    # What the platform's own processes wait for: Kafka, and for the stream job the catalog
    # and the Spark cluster. The rest of the stack starts beside them.
    data = (*(s.name for s in services if s.name.startswith("kafka")), "iceberg-catalog")
    spark = tuple(s.name for s in services if s.name.startswith("spark-"))
    services.append(
        own("ingest", ingest_args, "ingest_metrics", "candlewire_ingest_state", needs=data)
    )
    services.append(
        own(
            "stream",
            ["stream"],
            "stream_metrics",
            "candlewire_stream_up 1.0",
            start_timeout=180.0,
            needs=data + spark,
        )
    )
    services.append(
        own(
            "journal",
            ["journal"],
            "journal_metrics",
            "candlewire_journal_up 1.0",
            "journal",
            needs=data,
        )
    )
    from gateway.config import ensure_local_secret

    services.append(
        own(
            "gateway",
            ["gateway"],
            "gateway_metrics",
            "candlewire_gateway_up 1.0",
            port_name="gateway_http",
            prepare=lambda: ensure_local_secret(settings) and None,
            needs=data,
        )
    )
    services += dagster_services(settings)
    return services


def dagster_services(settings: Settings) -> list[Service]:
    """Dagster, one process (:mod:`launcher.dagster_serve`): its code server (the
    definitions, and the runs it launches), webserver (UI and GraphQL) and daemon
    (schedules, sensors, backfills)."""
    from launcher import dagster_home as home

    return [
        ProcessService(
            name="dagster",
            argv=lambda: home.dagster_argv(settings),
            port=settings.port("dagster"),
            check=lambda: home.daemon_health(settings),
            run_dir=settings.state_dir / "run",
            log=settings.state_dir / "logs" / "dagster.log",
            env=home.env(settings),
            prepare=lambda: home.code_socket(settings).unlink(missing_ok=True),
            start_timeout=120.0,
            # Its storage, and the data the runs its daemon launches at once (queued ones,
            # the healing sensor's) need.
            needs=("postgres", "kafka", "iceberg-catalog"),
        )
    ]


# Memory: the RSS of each part, its whole process tree ------------------------------------


def child_map() -> dict[int, list[int]]:
    """Every process's children, from each /proc/<pid>/stat's ppid: one walk serves all
    the trees measured at one moment."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # comm may hold spaces and parens
        children.setdefault(ppid, []).append(int(entry.name))
    return children


@dataclass(frozen=True)
class Memory:
    """A process's (or a tree's) resident memory in MiB, both ways of counting shared pages.

    ``rss`` counts a page in every process that maps it, as ``ps`` does: summed over a
    stack it counts PostgreSQL's shared buffers and libraries once per backend (444 MiB
    summed against 71 MiB of PSS, idle). ``pss`` splits each shared page among the
    processes sharing it, so a sum of PSS is the memory the stack holds.
    """

    rss: float = 0.0
    pss: float = 0.0

    def __add__(self, other: Memory) -> Memory:
        return Memory(self.rss + other.rss, self.pss + other.pss)


def memory_mib(pid: int) -> Memory:
    """One process's memory (Rss and Pss of /proc/<pid>/smaps_rollup); zero once exited."""
    found: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss"):
                    found[key] = int(rest.split()[0]) / 1024  # kB
    except OSError:
        pass  # gone, or a kernel thread
    return Memory(found.get("Rss", 0.0), found.get("Pss", 0.0))


def process_tree(pid: int, children: Mapping[int, list[int]] | None = None) -> list[int]:
    """A process and all its descendants: a service is its whole tree (the stream job's
    driver forks Spark's JVM, which forks Python workers)."""
    children = child_map() if children is None else children
    tree, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        tree.append(p)
        todo.extend(children.get(p, ()))
    return tree


def tree_memory_mib(pid: int, children: Mapping[int, list[int]] | None = None) -> Memory:
    """Memory of a process tree in MiB."""
    return sum((memory_mib(p) for p in process_tree(pid, children)), Memory())


def stack_memory(services: list[Service]) -> dict[str, Memory]:
    """MiB per running part of the stack, by the pid the launcher records for it."""
    children = child_map()
    return {
        svc.name: tree_memory_mib(pid, children)
        for svc in services
        if (pid := svc.pid()) is not None
    }


def live_ingestors(settings: Settings, listen_s: float = 2.5) -> dict[str, dict[str, str]]:
    """Ingestors heard through the relay's fanout: {exchange: {ingestor_id: state}}."""
    import zmq

    from candlewire.curve import dial
    from candlewire.topics import ingestor_topic
    from proto import requests_pb2 as rq
    from proto.envelope import EnvelopeError, Names, decode_sub

    states = Names.of(rq.IngestorState)  # a newer ingestor's state, shown as its number
    ctx = zmq.Context.instance()
    sub = dial(ctx.socket(zmq.SUB), settings, "relay")
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(ingestor_topic(""))
    sub.connect(settings.connect("market_data"))
    seen: dict[str, dict[str, str]] = {}
    deadline = time.monotonic() + listen_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not sub.poll(int(left * 1000)):
                break
            try:
                _, hb = decode_sub(sub.recv_multipart())
            except EnvelopeError:
                continue
            if isinstance(hb, rq.IngestorControl) and hb.action == rq.HEARTBEAT:
                seen.setdefault(hb.exchange, {})[hb.ingestor_id] = states[hb.state]
    finally:
        sub.close()
    return seen


def seed_symbol_metadata(settings: Settings, echo: Echo = print) -> dict[str, int]:
    """Refresh the symbol metadata of each local exchange that has none yet: {exchange: symbols}.

    Dagster refreshes every exchange daily at 01:00 UTC, so a fresh stack would otherwise
    refuse every trigger (UNKNOWN_TICKER) and list no symbols until then.
    """
    from candlewire.client import Client
    from candlewire.lake import load_table

    table = load_table(settings, "symbol_metadata")
    listed = set(table.scan(selected_fields=("exchange",)).to_arrow()["exchange"].to_pylist())
    seeded: dict[str, int] = {}
    with Client(settings) as client:
        for exchange in (e.split("=")[0] for e in LOCAL_EXCHANGES):
            if exchange in listed:
                continue
            echo(f"symbol metadata: fetching {exchange}'s markets (first start)")
            update = client.refresh_metadata(exchange)
            seeded[exchange] = update.symbol_count
            echo(f"symbol metadata: {exchange} lists {update.symbol_count} symbols")
    return seeded

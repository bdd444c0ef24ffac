"""Runtime configuration: one settings object, read from ``CANDLEWIRE_*`` variables and a
TOML file.

The file is ``candlewire.toml`` in the working directory or above it in the checkout
(:func:`nearest`), or the one ``CANDLEWIRE_CONFIG`` names; its keys are the settings' names
(``stream_watermark_s = 5``) and its tables the nested ones (``[ingest.replay] root =
"/data/binance-vision"``). A variable overrides the file (``CANDLEWIRE_INGEST__REPLAY__ROOT``),
and arguments override both.

Ports come from :mod:`candlewire.endpoints`; ``ports`` only overrides them (tests use free
ports so they can run beside ``make up``).
"""

from __future__ import annotations

import errno
import json
import os
import tomllib
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from candlewire.endpoints import ENDPOINTS

REPO_ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "market"  # the Iceberg namespace of every table (candlewire.lake defines them)

# Candle periods the platform aggregates and serves, in seconds.
PERIODS_S: tuple[int, ...] = (60, 300, 900, 3600, 14400, 86400)
PERIODS_TEXT = ", ".join(map(str, PERIODS_S))  # as messages and --help list them


DEDUP_MARGIN_S = 60.0  # a dedup horizon covers the lateness allowance and this much more
POSTGRES_PASSWORD = "postgres-password"  # the local PostgreSQL's, in the state dir's secrets
KAFKA_PASSWORD = "kafka-password"  # the Kafka SCRAM user's, likewise
S3_SECRET_KEY = "s3-secret-key"  # an s3:// warehouse's secret access key, likewise


STATE_DIR = ".candlewire"  # the stack's state, keys and secrets, made by `candlewire up`
CONFIG_FILE = "candlewire.toml"


# What marks a checkout's top: the search for the stack's state goes no higher.
CHECKOUT_MARKS = (".git", "pyproject.toml")


def nearest(name: str) -> Path:
    """``name`` in the working directory, else in the nearest directory above it within the
    same checkout (up to the directory holding ``.git`` or ``pyproject.toml``), so a command
    run anywhere inside the checkout finds the stack's state and settings; else ``name`` at
    the checkout's top, where ``candlewire up`` then makes it. Outside any checkout:
    ``name`` here."""
    here = Path(name)
    if os.path.exists(here):  # never raises: an unreadable directory is "not here"
        return here
    try:
        cwd = Path.cwd()
    except OSError:  # the working directory was removed
        return here
    chain = [cwd, *cwd.parents]
    top = next((i for i, d in enumerate(chain) if _is_top(d)), 0)
    found = (d / name for d in chain[1 : top + 1] if os.path.exists(d / name))
    return next(found, chain[top] / name if top else here)


def _is_top(d: Path) -> bool:
    return any(os.path.exists(d / mark) for mark in CHECKOUT_MARKS)


def config_file() -> Path:
    if "CANDLEWIRE_CONFIG" in os.environ:
        return Path(os.environ["CANDLEWIRE_CONFIG"])
    return nearest(CONFIG_FILE)


def settings_problem(exc: ValidationError | tomllib.TOMLDecodeError) -> str:
    """Settings that do not load, in one line: the file at fault, or each setting with the
    variable that sets it and why its value was refused."""
    if isinstance(exc, tomllib.TOMLDecodeError):
        return f"{config_file()} is not valid TOML: {exc}"
    config = Settings.model_config
    parts = []
    for error in exc.errors():
        path = [str(p) for p in error["loc"]]
        if not path:  # a rule between settings: its message names them
            parts.append(error["msg"].removeprefix("Value error, "))
            continue
        variable = config["env_prefix"] + config["env_nested_delimiter"].join(path).upper()
        parts.append(f"{'.'.join(path)} ({variable}, or {CONFIG_FILE}): {error['msg']}")
    return "; ".join(parts)


def port_setting(name: str) -> str:
    """The variable that sets endpoint ``name``'s port (``CANDLEWIRE_PORTS__MARKET_DATA``),
    from the endpoint table's name and the settings' own prefix: no message spells it by hand."""
    config = Settings.model_config
    return f"{config['env_prefix']}PORTS{config['env_nested_delimiter']}{name.upper()}"


class PortTaken(OSError):
    """A port this process must bind is in use: one line that names the setting moving it,
    where a bare EADDRINUSE would say neither which endpoint nor what to change."""

    def __init__(self, name: str, port: int, host: str, floats: bool = False) -> None:
        """``floats``: the port would have given way to a free one had it not been set."""
        self.endpoint, self.port, self.host = name, port, host
        text = (
            f"{ENDPOINTS[name].binder} cannot bind {name} on {host}:{port}: the port is taken "
            f"(by another {ENDPOINTS[name].binder}?); set {port_setting(name)} or "
            f"[ports] {name} in {config_file()} to a free one"
            + (", or leave it unset to take any free port" if floats else "")
        )
        super().__init__(errno.EADDRINUSE, text)

    def __str__(self) -> str:
        return self.strerror or ""


class ReplaySettings(BaseModel):
    """``[ingest.replay]``: the REPLAY exchange's Binance Vision downloads."""

    root: Path | None = None
    """A directory laid out as Binance Vision publishes (``spot/daily/...``,
    ``spot/monthly/...``); unset: the small sample in ``ingest/samples``."""
    clock: Literal["original", "live"] = "original"
    """Trade times as recorded, or shifted to now (demos, load)."""
    speed: float = Field(default=1.0, gt=0)
    """Trades come at this many times the recorded pace (``inf``: as fast as they go)."""


class IngestSettings(BaseModel):
    """``[ingest]``: what ingestors read and which live trades they drop."""

    replay: ReplaySettings = Field(default_factory=ReplaySettings)
    tick_ahead_s: float = Field(default=60.0, ge=0)
    """A live trade stamped further ahead of the ingestor's clock is dropped and counted:
    one far-future time would move its feed's clock on and close every open candle."""
    tick_behind_s: float | None = Field(default=86_400.0, gt=0)
    """A live trade stamped further behind is dropped too (None: no bound). Recordings
    replayed on their original clock are exempt: their times are meant to be old."""
    resume_within_s: float = Field(default=60.0, ge=0)
    """A live stream started this soon after its ingestor started resumes from its ticker's
    last trade in Kafka, if within the dedup horizon: an ingestor that restarted, with no
    peer to hand its streams' tails to, repairs its downtime as a gap (0: never)."""
    sim_faults: str = ""
    """What SIM gets wrong on purpose, to watch gaps found and repaired: comma-separated
    ``drop:20s@60s``, ``disconnect:20s@60s``, ``rest:off``, ``ids:opaque``, and for books
    ``book:checksum@30s``, ``book:skip@30s``, ``book:malformed@30s``."""


class SecuritySettings(BaseModel):
    """``[security]``: CURVE on every ZeroMQ TCP channel (:mod:`candlewire.curve`)."""

    curve: bool | None = None
    """Encrypt and authenticate every channel. Unset: on when the keys dir holds an
    allow-list (``candlewire keys init``, which ``candlewire up`` runs)."""
    key: str = "local"
    """The client key pair this process uses (``keys add-client NAME``)."""
    keys_dir: Path | None = None
    """Where the key pairs and the allow-list are; default <state_dir>/keys."""


class KafkaSettings(BaseModel):
    """``[kafka]``: how every Kafka client of the project authenticates (librdkafka's, Spark's
    source and sink, the JVM live path, Dagster's jobs), and the local broker with them."""

    sasl: bool = False
    """SASL/SCRAM over the broker's listener. The password is the secret ``kafka-password``
    (``CANDLEWIRE_SECRET_KAFKA_PASSWORD``, or ``<state_dir>/secrets/kafka-password``, which
    ``candlewire up`` makes)."""
    mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-256"
    username: str = "candlewire"
    brokers: int = Field(default=1, ge=1, le=9)
    """Brokers of the local cluster ``candlewire up`` runs, one KRaft quorum: broker N on
    loopback address 127.0.0.N, all on the same ports, as on N hosts."""
    replication: int | None = Field(default=None, ge=1)
    """Replication factor of the project's topics; default the local brokers (at most 3),
    or with one, the broker's own default. ``min.insync.replicas`` is one less: with 3, a
    write survives one broker's loss and acks=all still succeeds while one is down."""

    def replicas(self) -> int:
        """-1: the broker's ``default.replication.factor``."""
        return self.replication or (min(self.brokers, 3) if self.brokers > 1 else -1)

    def durability(self) -> dict[str, str]:
        """Topic configuration for the replicas; nothing when the broker decides."""
        n = self.replicas()
        return {"min.insync.replicas": str(max(1, n - 1))} if n > 1 else {}


class S3Settings(BaseModel):
    """``[s3]``: the object store of an ``s3://`` warehouse. The secret key is the secret
    ``s3-secret-key`` (``CANDLEWIRE_SECRET_S3_SECRET_KEY``, or the state dir's secrets)."""

    endpoint: str | None = None
    """The S3 API, e.g. https://s3.eu-west-1.amazonaws.com or http://minio:9000; unset: the
    local S3Proxy that ``candlewire up`` runs (``http://{host}:{port s3}``)."""
    region: str = "us-east-1"
    access_key: str = "candlewire"
    path_style: bool = True
    """Bucket in the path (S3Proxy, MinIO), not in the host name (AWS's default)."""
    checksums: Literal["when_required", "when_supported"] = "when_required"
    """When the AWS SDKs (pyarrow's C++, Iceberg's Java) add checksums to a request.
    ``when_supported``, their newer default, sends trailing CRC64 checksums that S3Proxy
    and other S3-compatible stores refuse (HTTP 400 on UploadPart)."""


class Settings(BaseSettings):
    """Where things are. Defaults are safe: everything on 127.0.0.1."""

    model_config = SettingsConfigDict(
        env_prefix="CANDLEWIRE_", env_nested_delimiter="__", env_parse_none_str="null"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments first, then ``CANDLEWIRE_*`` variables, then the TOML file."""
        toml = TomlConfigSettingsSource(settings_cls, toml_file=config_file())
        return init_settings, env_settings, toml, file_secret_settings

    _curve_chosen: bool = PrivateAttr(default=False)

    ingest: IngestSettings = Field(default_factory=IngestSettings)
    """``[ingest]``: the ingestors' exchange adapters."""

    security: SecuritySettings = Field(default_factory=SecuritySettings)
    """``[security]``: authenticated, encrypted channels."""

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    """``[kafka]``: Kafka authentication."""

    s3: S3Settings = Field(default_factory=S3Settings)
    """``[s3]``: the object store of an ``s3://`` warehouse."""

    host: str = "127.0.0.1"
    """Address clients and services connect to."""
    bind_host: str = "127.0.0.1"
    """Address services bind; set 0.0.0.0 deliberately to expose them."""
    ports: dict[str, int] = Field(default_factory=dict)
    """Overrides of ENDPOINTS ports by name, e.g. CANDLEWIRE_PORTS__MARKET_DATA=6558."""
    extra_publishers: list[str] = Field(default_factory=list)
    """More stream-publisher endpoints the relay's XSUB connects to."""
    publisher_names: list[str] = Field(default_factory=list)
    """DNS names that resolve to every stream publisher (a headless service): ``host`` for
    the publishers' standard ports (stream_pub, stream_live) or ``host:port``. The relay
    re-resolves them every ``discovery_interval_s`` and follows what comes and goes."""
    discovery_interval_s: float = 5.0
    state_dir: Path = Field(default_factory=lambda: nearest(STATE_DIR))
    """The stack's state: ``.candlewire`` here, else as :func:`nearest` finds it."""
    max_message_bytes: int = 1 << 20
    """Largest inbound ZMQ message a service accepts; larger peers are disconnected."""
    market_data_hwm: int = 100_000
    """Messages the relay queues for one market-data subscriber before dropping; a
    subscriber fills what it lost from the journal (``candlewire journal``)."""
    max_history_rows: int = 1_100_000
    """Largest history request the relay accepts, in candles (two years of 1-minute bars)."""

    # -- the data platform: local by default, any existing deployment by configuration ----
    kafka_bootstrap: str | None = None
    """Existing Kafka cluster, e.g. "k1:9092,k2:9092"; default the local broker."""
    catalog_name: str = "candlewire"
    catalog_url: str | None = None
    """Iceberg JDBC catalog database, postgresql://user:password@host:port/db; default local."""
    dagster_db: str | None = None
    """Dagster's storage database, postgresql://...; default the local PostgreSQL's `dagster`."""
    warehouse: str | None = None
    """Iceberg warehouse location (file://, s3://...); default <state_dir>/warehouse."""
    spark_master: str = "local[*]"
    """local[*], spark://host:7077 or k8s://https://host:443."""
    spark_workers: int = Field(default=0, ge=0)
    """Workers of a local Spark standalone cluster ``candlewire up`` runs (a master on port
    ``spark_master`` and N workers, from pyspark's jars); then every Spark session of the
    project uses it instead of ``spark_master``. 0: none."""
    spark_ui: bool = False
    spark_driver_memory: str = "768m"
    """The Spark driver's heap cap (in local mode the only executor too). The job's live set
    is about 160 MiB idle and 430 MiB under ``bench.soak`` at 5,000 trades/s, most of it the
    live path's 600 s horizon of trade ids; with the serial collector the heap stays near it
    (docs/benchmarks.md, #36). 512m ran out under the soak; raise it for a busier feed set."""
    checkpoint_dir: str | None = None
    """Streaming checkpoints (a shared filesystem on a cluster); default <state_dir>/checkpoints."""
    stream_trigger_s: float = 0.5
    """Micro-batch interval of the streaming job's history and metadata queries."""
    stream_ticks_trigger_s: float = 30.0
    """Micro-batch interval of tick and candle commits to Iceberg, like a Flink Iceberg sink's
    checkpoint interval. Live updates never wait for it, and a commit comes sooner when the
    live path revised a closed candle (``streaming.pacing``). Each commit costs seconds of
    Spark work whatever its size: at 5 s the idle job kept more than one of two cores busy."""
    stream_books_trigger_s: float | None = Field(default=None, gt=0)
    """Micro-batch interval of book records' appends to Iceberg; default
    ``stream_ticks_trigger_s``. Live books never wait for it. Each append costs Spark's fixed
    work whatever its size: one SIM book at a 1 s interval kept half a core busy."""
    stream_ticks_commit_after: int = Field(default=500_000, ge=1)
    """A commit starts before its interval is up once the live path has read this many
    records of the ticks topic since the last commit began (at least 2 s after the last one
    ended, and once the live path has read the rest of the burst, at most 5 s after it was
    due), so a burst is committed as soon as it is there, in one batch."""
    stream_ticks_batch_max: int = 3_000_000
    """Most ticks in one commit (held in memory while committed, about 100 bytes each);
    3M every 30 s allows 100k ticks/s."""
    stream_ohlc_compact_s: float = 300.0
    """This often, the committing query rewrites the ``ohlc`` files its candle MERGEs touched
    with their deletes applied, so a MERGE's cost stays flat instead of growing with the files
    each one leaves behind (10 MERGEs at the 30 s commit interval). 0: only Dagster's daily
    maintenance compacts."""
    stream_live_engine: Literal["realtime", "microbatch"] = "realtime"
    """How records reach the live path (``jvm/decoder``'s ``Live``, which judges, folds,
    evaluates the triggers and publishes each one): Spark's real-time mode, each record as it
    is read (a local master only), or micro-batches every ``stream_live_trigger_s`` collected
    to the driver (any master)."""
    stream_cep_record_s: float = Field(default=5.0, gt=0)
    """How often the CEP triggers' state is recorded: a restart evaluates again (and clients
    ignore again) at most this much of the ticks topic."""
    cep_max_triggers_per_owner: int = Field(default=1_000, ge=1)
    """CEP triggers one owner (a user, or a client without one) may have registered."""
    cep_max_triggers: int = Field(default=100_000, ge=1)
    """CEP triggers registered in all: a client names its owners (its client ids), so the
    per-owner limit alone does not bound the registry, which the job holds in memory."""
    stream_live_trigger_s: float = 0.1
    """Micro-batch interval of the live query when it runs as micro-batches."""
    stream_watermark_s: float = 10.0
    """The lateness allowance: how far behind its own feed's clock (the largest event time of
    that ticker's trades so far) a tick may be and still correct its candle."""
    stream_dedup_horizon_s: float = 600.0
    """How long, in its feed's event time, a trade id is remembered: a resend of the same
    (ticker, trade_id) within it changes nothing. It must exceed the lateness allowance plus
    a minute's margin; older resends are late anyway."""
    stream_idle_timeout_s: float = 60.0
    """A feed with no trade for this long (wall time) gets an idle mark, so its last candles
    close: its clock moves on as far as it would have in the time it has been quiet."""
    relay_hosts: list[str] = Field(default_factory=list)
    """Every relay's host when several run side by side, each on the same ports; empty:
    the one relay at ``host``. Ingestors take work, control and demand from each; clients
    send requests to one and fail over to the next, and hear data through all of them; the
    stream job publishes into each that does not dial it (all but ``host``)."""
    demand_grace_s: float = 60.0
    """How long an on-demand stream outlives its last subscriber."""
    jvm_dir: Path = REPO_ROOT / ".cache" / "jvm"
    """Where `make jvm` put the fetched jars (kafka/ and spark/)."""

    @model_validator(mode="after")
    def _curve_when_keyed(self) -> Settings:
        self._curve_chosen = self.security.curve is not None
        if self.security.curve is None:
            self.security.curve = (self.keys_dir() / "allowed.json").exists()
        return self

    @model_validator(mode="after")
    def _horizon_covers_lateness(self) -> Settings:
        if self.stream_dedup_horizon_s < self.stream_watermark_s + DEDUP_MARGIN_S:
            raise ValueError(
                f"stream_dedup_horizon_s ({self.stream_dedup_horizon_s}) must be at least the "
                f"lateness allowance stream_watermark_s ({self.stream_watermark_s}) plus "
                f"{DEDUP_MARGIN_S:.0f} s"
            )
        return self

    def port(self, name: str) -> int:
        """Endpoint ``name``'s port: the override in ``ports``, else the endpoint table's."""
        if name not in ENDPOINTS:
            raise KeyError(f"unknown endpoint {name!r}; known: {', '.join(ENDPOINTS)}")
        return self.ports.get(name, ENDPOINTS[name].port)

    def port_set(self, name: str) -> bool:
        """Whether ``name``'s port was set (variable, file or argument), not the default:
        a metrics port that was set is bound as set or not at all."""
        return name in self.ports

    def connect(self, name: str) -> str:
        """The ZMQ address a peer connects to."""
        return f"tcp://{self.host}:{self.port(name)}"

    def relays(self, name: str) -> list[str]:
        """The endpoint ``name`` of every relay (:attr:`relay_hosts`), ``host``'s first."""
        hosts = sorted(self.relay_hosts or [self.host], key=lambda h: h != self.host)
        return [f"tcp://{h}:{self.port(name)}" for h in hosts]

    def dialled_relays(self) -> list[str]:
        """``publisher_ingress`` of each relay that does not dial the stream job itself: the
        relay at ``host`` dials ``stream_pub``; the others are told to by nobody."""
        own = self.connect("publisher_ingress")
        return [e for e in self.relays("publisher_ingress") if e != own]

    def bind(self, name: str) -> str:
        """The ZMQ address the owning service binds."""
        return f"tcp://{self.bind_host}:{self.port(name)}"

    def metrics_url(self, name: str, host: str | None = None) -> str:
        """Where a service's Prometheus endpoint ``name`` answers (on ``host``, else the
        stack's host)."""
        return f"http://{host or self.host}:{self.port(name)}/metrics"

    def kafka_servers(self) -> str:
        """The bootstrap list every Kafka client uses: ``kafka_bootstrap``, else the local
        brokers."""
        if self.kafka_bootstrap:
            return self.kafka_bootstrap
        if self.kafka.brokers == 1:
            return f"{self.host}:{self.port('kafka')}"
        return ",".join(f"{a}:{self.port('kafka')}" for a in self.kafka_addresses())

    def kafka_addresses(self) -> list[str]:
        """The local brokers' addresses: the first on ``host``, the others on 127.0.0.N."""
        return [self.host] + [f"127.0.0.{n}" for n in range(2, self.kafka.brokers + 1)]

    def catalog_db(self) -> str:
        """The catalog database as postgresql://user[:password]@host:port/db."""
        return self.catalog_url or self._local_db("candlewire")

    def sql_url(self) -> str:
        """The catalog database for SQLAlchemy (psycopg2 driver)."""
        where, user, password = db_parts(self.catalog_db())
        auth = f"{user}:{password}@" if password else f"{user}@"
        return f"postgresql+psycopg2://{auth}{where}"

    def dagster_storage(self) -> str:
        """Dagster's storage database: ``dagster_db``, else the local PostgreSQL's."""
        return self.dagster_db or self._local_db("dagster")

    def _local_db(self, db: str) -> str:
        """The local PostgreSQL's database, with the password `candlewire up` generated."""
        password = self.secret(POSTGRES_PASSWORD)
        auth = f"candlewire:{password}" if password else "candlewire"
        return f"postgresql://{auth}@{self.host}:{self.port('postgres')}/{db}"

    def secret(self, name: str) -> str | None:
        """A secret of the local stack: ``CANDLEWIRE_SECRET_<NAME>``, else the state dir's
        ``secrets/<name>`` (0600), else None."""
        env = os.environ.get(f"CANDLEWIRE_SECRET_{name.upper().replace('-', '_')}")
        if env:
            return env
        path = self.state_dir / "secrets" / name
        return path.read_text().strip() if path.exists() else None

    def curve_chosen(self) -> bool:
        """Whether CURVE was set on or off, rather than left to the keys dir."""
        return self._curve_chosen

    def keys_dir(self) -> Path:
        """Where the CURVE key pairs and the allow-list are."""
        return self.security.keys_dir or self.state_dir / "keys"

    def spark_master_url(self) -> str:
        """The local standalone master when ``spark_workers`` is set, else
        ``spark_master``."""
        if self.spark_workers:
            return f"spark://{self.host}:{self.port('spark_master')}"
        return self.spark_master

    def on_s3(self) -> bool:
        """Whether the warehouse is on S3-compatible storage."""
        return self.warehouse_uri().startswith(("s3://", "s3a://"))

    def s3_endpoint(self) -> str:
        """The S3 API: ``[s3] endpoint``, else the local S3Proxy."""
        return self.s3.endpoint or f"http://{self.host}:{self.port('s3')}"

    def local_s3(self) -> bool:
        """An s3:// warehouse on the S3Proxy that ``candlewire up`` runs."""
        return self.on_s3() and self.s3.endpoint is None

    def warehouse_uri(self) -> str:
        """The Iceberg warehouse: ``warehouse``, else ``<state_dir>/warehouse``."""
        return self.warehouse or (self.state_dir.resolve() / "warehouse").as_uri()

    def checkpoints(self) -> str:
        """The streaming checkpoints: ``checkpoint_dir``, else ``<state_dir>/checkpoints``."""
        return self.checkpoint_dir or str((self.state_dir / "checkpoints").resolve())

    def books_trigger_s(self) -> float:
        """The book appends' interval: ``stream_books_trigger_s``, else the ticks' one."""
        if self.stream_books_trigger_s is None:
            return self.stream_ticks_trigger_s
        return self.stream_books_trigger_s

    def to_env(self) -> dict[str, str]:
        """These settings as CANDLEWIRE_* variables, for child processes."""
        env = {
            "CANDLEWIRE_HOST": self.host,
            "CANDLEWIRE_BIND_HOST": self.bind_host,
            "CANDLEWIRE_STATE_DIR": str(self.state_dir),
            "CANDLEWIRE_MAX_MESSAGE_BYTES": str(self.max_message_bytes),
            "CANDLEWIRE_MAX_HISTORY_ROWS": str(self.max_history_rows),
            "CANDLEWIRE_MARKET_DATA_HWM": str(self.market_data_hwm),
        }
        env.update({port_setting(k): str(v) for k, v in self.ports.items()})
        for name in ("kafka_bootstrap", "catalog_url", "dagster_db", "warehouse"):
            if getattr(self, name):
                env[f"CANDLEWIRE_{name.upper()}"] = getattr(self, name)
        env["CANDLEWIRE_SPARK_MASTER"] = self.spark_master
        env["CANDLEWIRE_SPARK_WORKERS"] = str(self.spark_workers)
        env["CANDLEWIRE_SPARK_DRIVER_MEMORY"] = self.spark_driver_memory
        env["CANDLEWIRE_STREAM_TRIGGER_S"] = str(self.stream_trigger_s)
        env["CANDLEWIRE_STREAM_TICKS_TRIGGER_S"] = str(self.stream_ticks_trigger_s)
        if self.stream_books_trigger_s is not None:
            env["CANDLEWIRE_STREAM_BOOKS_TRIGGER_S"] = str(self.stream_books_trigger_s)
        env["CANDLEWIRE_STREAM_TICKS_BATCH_MAX"] = str(self.stream_ticks_batch_max)
        env["CANDLEWIRE_STREAM_OHLC_COMPACT_S"] = str(self.stream_ohlc_compact_s)
        env["CANDLEWIRE_STREAM_LIVE_ENGINE"] = self.stream_live_engine
        env["CANDLEWIRE_STREAM_CEP_RECORD_S"] = str(self.stream_cep_record_s)
        env["CANDLEWIRE_CEP_MAX_TRIGGERS_PER_OWNER"] = str(self.cep_max_triggers_per_owner)
        env["CANDLEWIRE_CEP_MAX_TRIGGERS"] = str(self.cep_max_triggers)
        env["CANDLEWIRE_STREAM_LIVE_TRIGGER_S"] = str(self.stream_live_trigger_s)
        env["CANDLEWIRE_STREAM_WATERMARK_S"] = str(self.stream_watermark_s)
        env["CANDLEWIRE_STREAM_DEDUP_HORIZON_S"] = str(self.stream_dedup_horizon_s)
        env["CANDLEWIRE_STREAM_IDLE_TIMEOUT_S"] = str(self.stream_idle_timeout_s)
        if self.checkpoint_dir:
            env["CANDLEWIRE_CHECKPOINT_DIR"] = self.checkpoint_dir
        env["CANDLEWIRE_JVM_DIR"] = str(self.jvm_dir)
        env["CANDLEWIRE_DEMAND_GRACE_S"] = str(self.demand_grace_s)
        env["CANDLEWIRE_DISCOVERY_INTERVAL_S"] = str(self.discovery_interval_s)
        env["CANDLEWIRE_SECURITY__CURVE"] = str(self.security.curve).lower()
        env["CANDLEWIRE_SECURITY__KEY"] = self.security.key
        env["CANDLEWIRE_KAFKA__SASL"] = str(self.kafka.sasl).lower()
        env["CANDLEWIRE_KAFKA__MECHANISM"] = self.kafka.mechanism
        env["CANDLEWIRE_KAFKA__USERNAME"] = self.kafka.username
        env["CANDLEWIRE_KAFKA__BROKERS"] = str(self.kafka.brokers)
        env["CANDLEWIRE_KAFKA__REPLICATION"] = json.dumps(self.kafka.replication)
        if self.s3.endpoint:
            env["CANDLEWIRE_S3__ENDPOINT"] = self.s3.endpoint
        env["CANDLEWIRE_S3__REGION"] = self.s3.region
        env["CANDLEWIRE_S3__ACCESS_KEY"] = self.s3.access_key
        env["CANDLEWIRE_S3__PATH_STYLE"] = str(self.s3.path_style).lower()
        env["CANDLEWIRE_S3__CHECKSUMS"] = self.s3.checksums
        if self.security.keys_dir is not None:
            env["CANDLEWIRE_SECURITY__KEYS_DIR"] = str(self.security.keys_dir)
        replay = self.ingest.replay
        if replay.root is not None:
            env["CANDLEWIRE_INGEST__REPLAY__ROOT"] = str(replay.root)
        env["CANDLEWIRE_INGEST__REPLAY__CLOCK"] = replay.clock
        env["CANDLEWIRE_INGEST__REPLAY__SPEED"] = str(replay.speed)
        env["CANDLEWIRE_INGEST__TICK_AHEAD_S"] = str(self.ingest.tick_ahead_s)
        behind = self.ingest.tick_behind_s
        env["CANDLEWIRE_INGEST__TICK_BEHIND_S"] = "null" if behind is None else str(behind)
        for name in ("extra_publishers", "relay_hosts", "publisher_names"):
            if getattr(self, name):
                env[f"CANDLEWIRE_{name.upper()}"] = json.dumps(getattr(self, name))
        return env


def db_parts(url: str) -> tuple[str, str, str]:
    """(host:port/db, user, password) of a postgresql:// URL."""
    parts = urlsplit(url)
    return (
        f"{parts.hostname}:{parts.port or 5432}{parts.path}",
        parts.username or "",
        parts.password or "",
    )

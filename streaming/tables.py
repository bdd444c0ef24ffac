"""The job's Iceberg tables: their names, snapshot lookups, and the one writer of ``ohlc``.

Two queries write ``ohlc`` (live candles and history pages); a lock here serialises them, so
a history range checked empty cannot fill before its append lands.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from candlewire.config import Settings
from candlewire.lake import NAMESPACE, TABLES, catalog, table_name
from candlewire.spark import commit_sql
from streaming.decode import CandleKey
from streaming.metrics import Laps
from streaming.sql import literal, literals, ts_literal

log = logging.getLogger("candlewire.stream")
OHLC_KEY = [("ticker", "ascending"), ("period_s", "ascending"), ("open_time", "ascending")]


class Tables:
    def __init__(self, settings: Settings, spark: SparkSession) -> None:
        self.spark = spark
        self.names = {t: table_name(settings, t) for t in TABLES}
        self._catalog = catalog(settings)
        self._ohlc_lock = threading.Lock()
        self.system = f"{settings.catalog_name}.system"  # Iceberg's procedures

    def __getitem__(self, table: str) -> str:
        return self.names[table]

    def snapshot_id(self, table: str) -> int:
        """The table's newest snapshot (0 for an empty table): what a notification names and
        a commit record points at. Read through pyiceberg from the catalog itself: Spark's
        cached ``<table>.snapshots`` metadata table can miss this session's own last append
        (apache/iceberg#1431), and a record pointing before its batch would lose trade ids."""
        current = self._catalog.load_table(f"{NAMESPACE}.{table}").current_snapshot()
        return current.snapshot_id if current is not None else 0

    def holds_snapshot(self, table: str, snapshot_id: int) -> bool:
        """Whether maintenance has not yet expired the snapshot: through pyiceberg, as
        :meth:`snapshot_id`, with no Spark job at start-up."""
        loaded = self._catalog.load_table(f"{NAMESPACE}.{table}")
        return loaded.snapshot_by_id(int(snapshot_id)) is not None

    def last_batch(self, table: str, query: str, run: str) -> int:
        """The last micro-batch of ``query`` in run ``run`` committed to ``table``, read from
        the snapshot properties each commit carries (-1 when none)."""
        rows = self.spark.sql(
            f"SELECT summary['candlewire.batch'] AS b FROM {self.names[table]}.snapshots "
            f"WHERE summary['candlewire.query'] = {literal(query)} "
            f"AND summary['candlewire.run'] = {literal(run)}"
        ).collect()
        return max((int(r.b) for r in rows), default=-1)

    def last_stamped_batch(self, table: str, query: str, run: str) -> int:
        """:meth:`last_batch`, read from the catalog's metadata through pyiceberg: no Spark
        job at start-up for a query that writes rarely."""
        found = -1
        for snap in self._catalog.load_table(f"{NAMESPACE}.{table}").snapshots():
            props = snap.summary.additional_properties if snap.summary else {}
            if props.get("candlewire.query") == query and props.get("candlewire.run") == run:
                found = max(found, int(props.get("candlewire.batch", -1)))
        return found

    def compact_ohlc(self, tickers: Iterable[str], since_ms: int) -> bool:
        """Rewrite ``ohlc``'s files of these tickers' windows opened at or after ``since_ms``
        that hold deletes or are small, with the deletes applied (merge-on-read leaves a data
        file and a delete file in every partition a MERGE touches). Only those partitions: a
        rewrite loses its commit to any other writer of the files it rewrites. Under the
        writers' lock: the rewritten files are numbered after the deletes they absorb (so
        those deletes are dangling and go), which is safe only with no MERGE in between.

        One commit, without partial progress: Iceberg's partial-progress committer thread
        spins a core while file groups wait, and for good when a rewrite is interrupted
        before it closes (apache/iceberg#12086). False when the rewrite failed: it is only a
        tidy-up, so the caller keeps the tickers and tries again at its next turn."""
        where = f"ticker IN ({literals(tickers)}) AND open_time >= {ts_literal(since_ms)}"
        try:
            with self._ohlc_lock:
                commit_sql(self.spark, compact_statement(self.system, self.names["ohlc"], where))
        except Exception as exc:  # a lost race with maintenance, or a stopping session
            log.warning("compacting ohlc failed; it is tried again later: %s", exc)
            return False
        return True

    def delete_ohlc(self, keys: Iterable[CandleKey]) -> None:
        """Remove these candles (ticker, period_s, open time in ms) from ``ohlc``: one whose
        values it can no longer hold (past DECIMAL(38,18)) must not stay there as it was
        when it still could. Rare, so a plain DELETE of the keys, under the writers' lock."""
        where = " OR ".join(
            f"(ticker = {literal(t)} AND period_s = {int(p)} AND open_time = {ts_literal(ms)})"
            for t, p, ms in sorted(set(keys))
        )
        if where:
            with self._ohlc_lock:
                commit_sql(self.spark, f"DELETE FROM {self.names['ohlc']} WHERE {where}")

    def upsert_ohlc(
        self, rows: pa.Table, view: str, *, append_if_new: bool = False, lap: Laps | None = None
    ) -> None:
        """Upsert by (ticker, period_s, open_time); literal bounds let Iceberg prune files.

        With ``append_if_new``, rows for a range that holds none yet are appended: the same
        result without MERGE's join, which was most of a year of history's time."""
        spark, ohlc = self.spark, self.names["ohlc"]
        bounds = key_bounds(rows)
        lap = lap or Laps()
        with self._ohlc_lock:
            lap("lock")
            if append_if_new:
                taken = spark.sql(f"SELECT 1 FROM {ohlc} WHERE {bounds.format(t='')} LIMIT 1")
                append_if_new = not taken.take(1)
                lap("check")
            if append_if_new:
                # Sorted by key and written by as many tasks as cores, without Iceberg's
                # range shuffle: a month's rows end up in one file, and twice as fast.
                (
                    spark.createDataFrame(rows.sort_by(OHLC_KEY))
                    .coalesce(spark.sparkContext.defaultParallelism)
                    .writeTo(ohlc)
                    .options(**{"distribution-mode": "none", "fanout-enabled": "true"})
                    .append()
                )
                lap("append")
                return
            spark.createDataFrame(rows).createOrReplaceTempView(view)
            commit_sql(spark, merge_statement(ohlc, view, bounds))
            lap("merge")


def key_bounds(rows: pa.Table) -> str:
    """The rows' keys as literal bounds (``{t}`` before each column, for a table alias), so
    Iceberg prunes partitions and files before a MERGE or a check reads anything."""
    micros = pc.min_max(rows.column("open_time").cast(pa.int64())).as_py()
    tickers, periods = (set(pc.unique(rows.column(c)).to_pylist()) for c in ("ticker", "period_s"))
    return (
        f"{{t}}ticker IN ({literals(tickers)}) "
        f"AND {{t}}period_s IN ({', '.join(str(int(p)) for p in sorted(periods))}) "
        f"AND {{t}}open_time >= {ts_literal(micros['min'] // 1000)} "
        f"AND {{t}}open_time <= {ts_literal(micros['max'] // 1000)}"
    )


def merge_statement(ohlc: str, view: str, bounds: str) -> str:
    """Upsert ``view``'s candles into ``ohlc`` by key, within :func:`key_bounds`."""
    return (
        f"MERGE INTO {ohlc} t USING {view} s "
        f"ON t.ticker = s.ticker AND t.period_s = s.period_s AND t.open_time = s.open_time "
        f"AND {bounds.format(t='t.')} "
        f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )


def compact_statement(system: str, table: str, where: str) -> str:
    """The live compaction (:meth:`Tables.compact_ohlc`): the files matching ``where`` that
    hold deletes or are small, rewritten with the deletes applied, in one commit."""
    return (
        f"CALL {system}.rewrite_data_files(table => '{table}', "
        f"where => {literal(where)}, options => map("
        "'min-input-files', '2', 'delete-file-threshold', '1', "
        "'partial-progress.enabled', 'false', 'remove-dangling-deletes', 'true', "
        "'use-starting-sequence-number', 'false'))"
    )

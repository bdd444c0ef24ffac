"""The benches' reference candles, and their check of what the platform stored and published.

Reference, not run by the platform: a pandas resample of a feed's distinct trades, the same
rule as tests/streaming/test_job.py's (benches do not import the tests). It is held against
``ohlc`` in Iceberg (:func:`iceberg_candles_equal`) and against the last update of each
candle that the stream job published live, read back from its journal
(:func:`live_candles_equal`): what a subscriber that missed nothing ends with. Both wait
until every trade is counted, then compare every candle of every period exactly (Decimals by
value) and print the first that differs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping
from decimal import Decimal, localcontext

import pandas as pd
from confluent_kafka import Consumer, TopicPartition

from candlewire.config import PERIODS_S, Settings
from candlewire.kafka import JOURNAL, consumer_config, journal_partition
from candlewire.lake import load_table
from candlewire.topics import market_data_topic
from proto import journal_pb2 as jr
from proto.envelope import expect, from_record

Trade = tuple[int, str, str]  # (exchange time ns, price, size)
Row = tuple  # (open ms, open, high, low, close, volume, trades)


EXACT_DIGITS = 100  # more than any sum of DECIMAL(38,18) values has


def expected_candles(trades: list[Trade], period_s: int) -> pd.DataFrame:
    """A pandas resample of the trades (each one distinct, in the order they arrived: of
    trades at one time, the first opens a candle and the last closes it)."""
    df = pd.DataFrame(
        {
            "time": pd.to_datetime([t for t, _, _ in trades], unit="ns", utc=True),
            "price": [Decimal(p) for _, p, _ in trades],
            "size": [Decimal(s) for _, _, s in trades],
        }
    ).sort_values("time", kind="stable")
    r = df.set_index("time").resample(f"{period_s}s")
    # Sums exact to DECIMAL(38,18)'s digits and beyond: the default context's 28 rounded a
    # volume of 12345678901234.5 and 1e-18, which the platform sums right.
    with localcontext(prec=EXACT_DIGITS):
        out = pd.DataFrame(
            {
                "open": r["price"].first(),
                "high": r["price"].max(),
                "low": r["price"].min(),
                "close": r["price"].last(),
                "volume": r["size"].sum(),
                "trade_count": r["price"].count(),
            }
        )
    return out[out["trade_count"] > 0]  # resample invents empty bins; candlewire does not


def candle_rows(frame: pd.DataFrame) -> list[Row]:
    """(open ms, open, high, low, close, volume, trades) per candle, Decimals compared by value."""
    return sorted(
        (
            pd.Timestamp(t).value // 1_000_000,
            *(Decimal(str(r[c])) for c in ("open", "high", "low", "close", "volume")),
            int(r["trade_count"]),
        )
        for t, r in frame.iterrows()
    )


def _same(name: str, mine: list[Row], want: list[Row]) -> bool:
    if mine == want:
        return True
    wrong = next((m, w) for m, w in itertools.zip_longest(mine, want) if m != w)
    print(f"{name}: {len(mine)} candles vs {len(want)}; first differing (ours, pandas'): {wrong}")
    return False


Candles = dict[int, list[Row]]  # period → a ticker's candles


def reference(trades: Mapping[str, list[Trade]]) -> dict[str, Candles]:
    """Each ticker's pandas candles, every period."""
    return {
        t: {p: candle_rows(expected_candles(v, p)) for p in PERIODS_S} for t, v in trades.items()
    }


def _counted(rows: Candles, want: Candles) -> bool:
    return all(sum(r[-1] for r in rows[p]) == sum(r[-1] for r in want[p]) for p in PERIODS_S)


def all_same(kind: str, got: Mapping[str, Candles], want: Mapping[str, Candles]) -> bool:
    return all(
        [  # every difference printed, not only the first
            _same(f"{kind} {t} {p}s", got[t][p], want[t][p]) for t in want for p in PERIODS_S
        ]
    )


def iceberg_candles_equal(
    settings: Settings, want: Mapping[str, Candles], timeout: float = 180.0
) -> bool:
    """Every candle of every period of each ticker in ``ohlc`` equals the reference's
    (:func:`reference`), once ``ohlc`` counts all its trades (its MERGE follows the ticks
    append in each batch)."""
    ohlc = load_table(settings, "ohlc")

    def stored(ticker: str) -> Candles:
        got = ohlc.scan(row_filter=f"ticker = '{ticker}'").to_pandas()
        return {p: candle_rows(got[got["period_s"] == p].set_index("open_time")) for p in PERIODS_S}

    deadline = time.monotonic() + timeout
    while True:
        ohlc.refresh()
        got = {t: stored(t) for t in want}
        if all(_counted(got[t], w) for t, w in want.items()):
            break
        if time.monotonic() > deadline:
            print(f"ohlc did not count every trade within {timeout:.0f}s")
            break
        time.sleep(2.0)
    return all_same("ohlc", got, want)


class Journal:
    """The candle updates the stream job published, read back from its journal
    (``candlewire.live``): the last of each candle wins, as for a subscriber."""

    def __init__(self, settings: Settings, tickers: Iterable[str]) -> None:
        self.wanted = {
            market_data_topic(t, f"ohlc:{p}").encode(): (t, p) for t in tickers for p in PERIODS_S
        }
        self.last: dict[tuple[str, int], dict[int, Row]] = {k: {} for k in self.wanted.values()}
        self.consumer = Consumer(consumer_config(settings, "bench-oracle"))
        self.consumer.assign(
            [
                TopicPartition(JOURNAL.name, p, 0)
                for p in sorted({journal_partition(k.decode()) for k in self.wanted})
            ]
        )

    def read(self, quiet_s: float = 1.0) -> None:
        """Take what the journal holds now: up to each partition's end as it was at the call,
        or until ``quiet_s`` passes without a record. The job journals on (idle marks, the
        stack's own feeds share the partitions), so a quiet spell alone may never come."""
        marks = {
            tp: self.consumer.get_watermark_offsets(tp, 10) for tp in self.consumer.assignment()
        }
        ends = {tp.partition: high for tp, (low, high) in marks.items() if high > low}
        parts = [tp for tp in marks if tp.partition in ends]  # an empty one has no position
        while True:
            records = self.consumer.consume(10_000, quiet_s)
            if not records:
                return
            for rec in records:
                if rec.error() is not None or rec.key() not in self.wanted:
                    continue
                candles = self.last[self.wanted[rec.key()]]
                for c in expect(from_record(rec.value()), jr.JournalBatch).candles:
                    candles[c.open_time_ms] = (
                        c.open_time_ms,
                        *(Decimal(x) for x in (c.open, c.high, c.low, c.close, c.volume)),
                        c.trade_count,
                    )
            if all(tp.offset >= ends[tp.partition] for tp in self.consumer.position(parts)):
                return

    def rows(self, ticker: str) -> Candles:
        return {p: sorted(self.last[ticker, p].values()) for p in PERIODS_S}

    def close(self) -> None:
        self.consumer.close()


def live_candles_equal(
    settings: Settings, want: Mapping[str, Candles], timeout: float = 180.0
) -> bool:
    """The last published update of every candle of every period of each ticker equals the
    reference's, once the updates count all its trades."""
    journal = Journal(settings, want)
    deadline = time.monotonic() + timeout
    try:
        while True:
            journal.read()
            got = {t: journal.rows(t) for t in want}
            if all(_counted(got[t], w) for t, w in want.items()):
                break
            if time.monotonic() > deadline:
                print(f"the journal's candles did not count every trade within {timeout:.0f}s")
                break
        return all_same("live", got, want)
    finally:
        journal.close()

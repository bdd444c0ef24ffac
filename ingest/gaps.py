"""Trades lost upstream (#37): found as a live stream's trades arrive, fetched again over REST.

A stream can miss trades three ways: the venue skips a trade id (on venues that number
trades consecutively per symbol), the connection drops and reconnects, or the ingestor that
streamed the ticker dies and a peer takes over from the last trade it announced in its
heartbeat. :class:`GapDetector` is told each of these as it happens and answers with a
:class:`~proto.market_pb2.Gap`; it does no I/O, so each rule is tested on its own.

:class:`GapRepairer` records the gap in ``candlewire.gaps`` (keyed by gap id, compacted: a
gap's latest record is its state), then on the ingestor's thread pool fetches the range
again with :meth:`Exchange.refetch`, drops what the stream already sent, produces the rest
to ``candlewire.ticks`` like live trades, and records the gap again as repaired or
unrepairable. The stream thread never waits for a venue's REST API.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from functools import partial
from typing import TYPE_CHECKING

from candlewire.kafka import GAPS, TICKS, consumer_config, key_partition
from ingest.exchanges.base import Exchange, ExchangeError, TradeRun
from ingest.jobs import retry, tick_checker
from ingest.sink import SinkError
from proto import market_pb2
from proto.requests_pb2 import StreamTail

if TYPE_CHECKING:
    from confluent_kafka import Consumer, TopicPartition

    from candlewire.config import Settings
    from ingest.metrics import IngestMetrics
    from ingest.sink import KafkaSink

log = logging.getLogger("candlewire.ingest")
S_NS = 1_000_000_000
REFETCH_CHUNK_NS = 60 * S_NS  # one refetch call's time window: bounds a repair's memory
# Without sequential ids a reconnect's last trade seen is not proof that nothing just before
# it was lost in flight, so the repair looks this far further back (and drops what was sent).
RECONNECT_LOOKBACK_NS = 5 * S_NS
# A dead peer announced the last trade it *received*; the trades it held undelivered (its
# producer's last moments, a Kafka stall) came before that, so a takeover's repair starts
# this far back too, and takes the announced trade itself. A resend costs nothing.
TAKEOVER_LOOKBACK_NS = 60 * S_NS
LOOKUP_RECORDS = 20_000  # the first window a ticker's partition is read back for its last trade
RECENT_IDS = 200_000
RECENT_HORIZON_NS = 600 * S_NS


def gap_id(ticker: str, cause: int, from_ns: int) -> str:
    return f"{ticker}|{market_pb2.GapCause.Name(cause)}|{from_ns}"


def new_gap(
    ticker: str, cause: int, before: StreamTail, after: StreamTail, ingestor_id: str
) -> market_pb2.Gap:
    """The one place a Gap is built: open, from the last trade before to the first after."""
    return market_pb2.Gap(
        gap_id=gap_id(ticker, cause, before.time_ns),
        ticker=ticker,
        cause=cause,
        from_ns=before.time_ns,
        to_ns=after.time_ns,
        from_trade_id=before.trade_id,
        to_trade_id=after.trade_id,
        status=market_pb2.GAP_OPEN,
        detected_ms=int(time.time() * 1000),
        ingestor_id=ingestor_id,
    )


def tail_of(tick: market_pb2.Tick) -> StreamTail:
    return StreamTail(ticker=tick.ticker, trade_id=tick.trade_id, time_ns=tick.exchange_time_ns)


def _number(trade_id: str) -> int | None:
    try:
        return int(trade_id)
    except ValueError:
        return None


def missing_ids(gap: market_pb2.Gap) -> int | None:
    """How many trades a gap between two sequential ids lacks; None when ids are not numbers."""
    try:
        return int(gap.to_trade_id) - int(gap.from_trade_id) - 1
    except ValueError:
        return None


def last_delivered(
    settings: Settings, ticker: str, timeout_s: float = 10.0, since_ns: int = 0
) -> StreamTail | None:
    """The ticker's last trade in the ticks topic; None when there is none there, or none
    written since ``since_ns`` (by Kafka's timestamps). What Kafka holds is what was
    delivered: a stream an ingestor starts after a restart of its own resumes from it.

    Its partition is read backwards in windows, the last LOOKUP_RECORDS records first, each
    window twice the one after it, down to the first record written since ``since_ns``: other
    tickers of the partition may have written any number after the ticker's last trade (an
    ingestor that restarts while its peers stream on). In the window that holds the ticker's
    trades the latest by time counts; a repair's older trades written after a newer one can
    make it an earlier one, which asks a repair for more than it needs and loses nothing."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    key = ticker.encode()
    partition = key_partition(TICKS, key)  # where the ingestors' producers put it
    # Each window is assigned afresh: little fetched ahead, little fetched twice.
    group = f"candlewire-tail-{uuid.uuid4().hex[:12]}"
    consumer = Consumer(consumer_config(settings, group, **{"queued.max.messages.kbytes": 4096}))
    deadline = time.monotonic() + timeout_s
    try:
        tp = TopicPartition(TICKS.name, partition)
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
        if since_ns > 0:
            at = TopicPartition(TICKS.name, partition, since_ns // 1_000_000)
            found = consumer.offsets_for_times([at], timeout=timeout_s)[0]
            if found.error is not None:
                raise KafkaException(found.error)
            low = max(low, high if found.offset < 0 else found.offset)  # -1: nothing since
        end, size = high, LOOKUP_RECORDS
        while end > low:
            start = max(low, end - size)
            last = _last_in(
                consumer, TopicPartition(TICKS.name, partition), key, start, end, deadline
            )
            if last is not None:
                return tail_of(last)
            end, size = start, size * 2
        return None
    finally:
        consumer.close()


def _last_in(
    consumer: Consumer, tp: TopicPartition, key: bytes, start: int, end: int, deadline: float
) -> market_pb2.Tick | None:
    """The latest by time of the key's ticks at offsets [start, end) of the partition."""
    from proto.envelope import EnvelopeError, expect, from_record

    tp.offset = start
    consumer.assign([tp])
    last: market_pb2.Tick | None = None
    at = start - 1
    while at < end - 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{tp.topic}[{tp.partition}] not read back to {start} in time")
        batch = consumer.consume(num_messages=1000, timeout=0.5)
        if not batch:  # past a transaction's marker, which no consumer is given
            at = max(at, consumer.position([tp])[0].offset - 1)
        for msg in batch:
            if msg.error() is not None:
                continue
            at = msg.offset()
            if at >= end or msg.key() != key:
                continue
            try:
                tick = expect(from_record(msg.value()), market_pb2.Tick)
            except EnvelopeError:
                continue
            # The latest by time: a repair writes older trades after newer ones.
            if last is None or tick.exchange_time_ns >= last.exchange_time_ns:
                last = tick
    return last


class GapDetector:
    """One stream's gaps, from what it is told: each trade, each reconnect; sans I/O.

    ``tail`` is the last trade a dead peer announced for this ticker: the stream then
    starts as a takeover, and its first trade closes the gap from there.
    """

    def __init__(
        self, ticker: str, sequential: bool, ingestor_id: str = "", tail: StreamTail | None = None
    ) -> None:
        self.ticker = ticker
        self.sequential = sequential
        self.ingestor_id = ingestor_id
        self._last = tail
        self._cause: int | None = market_pb2.TAKEOVER if tail is not None else None
        # The hot path's view of the last trade: its id as a number, and the trade itself,
        # made a StreamTail only when asked (a message per trade cost a third of a stream's
        # time at full speed).
        self._last_n: int | None = _number(tail.trade_id) if tail is not None else None
        self._last_tick: market_pb2.Tick | None = None

    @property
    def tail(self) -> StreamTail | None:
        """The last trade received (the highest id on a sequential venue)."""
        last = self._last_tick  # one read: the heartbeat asks from another thread
        return tail_of(last) if last is not None else self._last

    def resume_from(self, tail: StreamTail) -> None:
        """Before the first trade: start as a takeover from ``tail`` (a stream that ran
        here before a restart, its last trade in Kafka)."""
        self._last, self._cause = tail, market_pb2.TAKEOVER
        self._last_n = _number(tail.trade_id)

    def reconnected(self) -> None:
        """The stream dropped; the next trade tells whether anything was lost meanwhile."""
        if self._last is not None:
            self._cause = market_pb2.RECONNECT

    def observe(self, tick: market_pb2.Tick) -> market_pb2.Gap | None:
        """The gap this trade closes, if any."""
        if self.sequential and self._cause is None and (last := self._last_n) is not None:
            try:  # _number, inline: this runs for every trade
                n: int | None = int(tick.trade_id)
            except ValueError:
                n = None
            if n == last + 1:  # the next id: nothing lost, the common case
                self._last_n, self._last_tick = n, tick
                return None
        if self._last_tick is not None:  # the fast path's last trade, as a tail now
            self._last = tail_of(self._last_tick)  # before the next line: the heartbeat reads
            self._last_tick = None
        gap = self._observe(tick)
        if self.sequential and self._last is not None:
            self._last_n = _number(self._last.trade_id)
        return gap

    def observe_run(self, run: TradeRun) -> bool:
        """A whole run at once, when it provably continues the stream with nothing to tell:
        nothing pending, a trade seen before, and on a sequential venue each id the one
        before plus one. True then, its last trade now the tail; False having changed
        nothing, so the caller observes each trade as it would have (:meth:`observe`, the
        one rule)."""
        if self._cause is not None or not run:
            return not run
        if not self.sequential:  # each trade would only become the tail
            if self.tail is None:
                return False
            self._last, self._last_tick = tail_of(run.tick(len(run) - 1)), None
            return True
        if (last := self._last_n) is None:
            return False
        try:  # int(), as observe reads an id
            numbers = list(map(int, run.trade_ids))
        except ValueError:
            return False
        if numbers != list(range(last + 1, last + 1 + len(numbers))):
            return False
        self._last_n, self._last_tick = numbers[-1], run.tick(len(numbers) - 1)
        return True

    def _observe(self, tick: market_pb2.Tick) -> market_pb2.Gap | None:
        """Every case but the next id after the last: the first trade, a reconnect, a
        takeover, a jump, an id already passed, a venue without sequential ids."""
        before, cause, here = self.tail, self._cause, tail_of(tick)
        self._cause = None
        if before is None:
            self._last = here
            return None
        if self.sequential:
            try:
                step = int(tick.trade_id) - int(before.trade_id)
            except ValueError:
                step = 1  # not a number after all: nothing to tell from it
            if step <= 0:  # a trade we have already passed: the question stays open
                self._cause = cause
                return None
            self._last = here
            if step == 1:  # consecutive ids: nothing lost, reconnect or not
                return None
            cause = cause or market_pb2.TRADE_ID_JUMP
        else:
            if cause is not None and here.time_ns < before.time_ns:
                # Older than the last trade: one the venue sent again on resubscribing. The
                # question stays open for a trade that is new.
                self._cause = cause
                return None
            self._last = here
            if cause is None:
                return None
        return new_gap(self.ticker, cause, before, here, self.ingestor_id)

    @property
    def asking(self) -> bool:
        """Whether a reconnect or takeover waits for the trade that tells what was lost."""
        return self._cause is not None


class RecentIds:
    """Trade ids a stream sent lately, bounded by count and by event time, so a repair on a
    venue without sequential ids can drop what the stream already sent. Thread-safe: the
    stream adds, a repair asks."""

    def __init__(self, limit: int = RECENT_IDS, horizon_ns: int = RECENT_HORIZON_NS) -> None:
        self.limit, self.horizon_ns = limit, horizon_ns
        self._order: deque[tuple[int, str]] = deque()
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, trade_id: str, time_ns: int) -> None:
        self.add_all((trade_id,), (time_ns,))

    def add_all(self, trade_ids: Iterable[str], times_ns: Iterable[int]) -> None:
        """:meth:`add` of each in turn, under one lock."""
        with self._lock:
            ids, order = self._ids, self._order
            for trade_id, time_ns in zip(trade_ids, times_ns, strict=True):
                ids[trade_id] = time_ns
                order.append((time_ns, trade_id))
                while order and (
                    len(order) > self.limit or order[0][0] < time_ns - self.horizon_ns
                ):
                    old_ns, old_id = order.popleft()
                    if ids.get(old_id) == old_ns:
                        del ids[old_id]

    @property
    def oldest_ns(self) -> int:
        """The event time of the oldest id remembered (0: none)."""
        with self._lock:
            return self._order[0][0] if self._order else 0

    def __contains__(self, trade_id: object) -> bool:
        with self._lock:
            return trade_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)


class GapWatch:
    """What ``run_stream`` tells about one stream: its detector, the ids it sent (on venues
    without sequential ids) and where found gaps go."""

    def __init__(
        self,
        detector: GapDetector,
        found: Callable[[market_pb2.Gap, RecentIds | None], object],
    ) -> None:
        self.detector = detector
        self.recent = None if detector.sequential else RecentIds()
        self._found = found

    def observe_run(self, run: TradeRun) -> bool:
        """:meth:`GapDetector.observe_run`, and the run's ids remembered where a venue's ids
        are not sequential."""
        if not self.detector.observe_run(run):
            return False
        if self.recent is not None:
            self.recent.add_all(run.trade_ids, run.times_ns)
        return True

    def observe(self, tick: market_pb2.Tick) -> None:
        recent = self.recent
        if recent is not None and self.detector.asking and tick.trade_id in recent:
            return  # sent before the reconnect and sent again: it tells nothing of the gap
        gap = self.detector.observe(tick)
        if self.recent is not None:
            self.recent.add(tick.trade_id, tick.exchange_time_ns)
        if gap is not None:
            log.warning(
                "%s: %s gap after trade %s, before %s",
                gap.ticker,
                market_pb2.GapCause.Name(gap.cause),
                gap.from_trade_id,
                gap.to_trade_id,
            )
            self._found(gap, self.recent)

    def reconnected(self) -> None:
        self.detector.reconnected()


def _chunks(from_ns: int, to_ns: int) -> Iterator[tuple[int, int]]:
    """Inclusive, non-overlapping windows covering [from_ns, to_ns]: no trade in two."""
    lo = from_ns
    while lo <= to_ns:
        hi = min(lo + REFETCH_CHUNK_NS - 1, to_ns)
        yield lo, hi
        lo = hi + 1


class GapRepairer:
    """Records gaps and repairs them on ``executor``, writing through ``sink``."""

    def __init__(
        self,
        sink: KafkaSink,
        executor: Executor,
        *,
        ahead_s: float = 60.0,
        metrics: IngestMetrics | None = None,
        horizon_s: float = 600.0,
    ) -> None:
        self.sink, self.executor = sink, executor
        self.horizon_ns = int(horizon_s * S_NS)  # the stream's dedup horizon
        self._repairing: set[str] = set()  # gap ids whose repair runs here now
        self._problem = tick_checker(ahead_s, None)  # a repair's window: ahead only
        self.metrics = metrics

    def found(
        self, exchange: Exchange, gap: market_pb2.Gap, recent: RecentIds | None
    ) -> Future | None:
        """Record the gap as open now; repair it on the executor."""
        self._record(gap)
        return self.submit(exchange, gap, recent)

    def submit(
        self, exchange: Exchange, gap: market_pb2.Gap, recent: RecentIds | None = None
    ) -> Future | None:
        """Repair ``gap`` on the executor: under way (:meth:`repairing`) from now until it
        ends, queued or running, and a repair that raises is logged."""
        self._repairing.add(gap.gap_id)
        try:
            future = self.executor.submit(self.repair, exchange, gap, recent)
        except RuntimeError:  # the ingestor is stopping: the gap stays open, and says so
            self._repairing.discard(gap.gap_id)
            log.warning("gap %s left open: the ingestor is stopping", gap.gap_id)
            return None
        future.add_done_callback(partial(self._ended, gap.gap_id))
        return future

    def _ended(self, gap_id: str, future: Future) -> None:
        self._repairing.discard(gap_id)
        if not future.cancelled() and future.exception() is not None:
            log.error("gap %s not repaired: %s", gap_id, future.exception())

    def resend_floor_ns(self) -> int:
        """The earliest event time a trade resent now may have: one older could pass the
        stream's dedup horizon before it is judged, and be stored again as a late trade."""
        return time.time_ns() - self.horizon_ns * 9 // 10

    def repair(
        self, exchange: Exchange, gap: market_pb2.Gap, recent: RecentIds | None
    ) -> market_pb2.Gap:
        """Fetch the gap's trades again, produce those not sent yet, record the outcome."""
        self._repairing.add(gap.gap_id)
        try:
            return self._repair(exchange, gap, recent)
        finally:
            self._repairing.discard(gap.gap_id)

    def repairing(self, gap_id: str) -> bool:
        return gap_id in self._repairing

    def give_up(self, gap: market_pb2.Gap, why: str) -> None:
        """Record an open gap as unrepairable, and why."""
        done = market_pb2.Gap()
        done.CopyFrom(gap)
        done.status, done.reason = market_pb2.GAP_UNREPAIRABLE, why
        done.repaired_ms = int(time.time() * 1000)
        self._record(done)
        log.warning("gap %s given up: %s", gap.gap_id, why)

    def _repair(
        self, exchange: Exchange, gap: market_pb2.Gap, recent: RecentIds | None
    ) -> market_pb2.Gap:
        sequential = exchange.sequential_ids and missing_ids(gap) is not None
        start = gap.from_ns
        if gap.cause == market_pb2.TAKEOVER:
            # Not so far back that a resend would be older than the stream's dedup horizon
            # by the time it is judged (it would be stored again, as a late trade).
            start = max(start - TAKEOVER_LOOKBACK_NS, min(start, self.resend_floor_ns()))
        elif not sequential and gap.cause == market_pb2.RECONNECT and recent is not None:
            # Not before the oldest trade it remembers sending: what came earlier, it
            # cannot tell from what it missed (and a peer may have sent it).
            start = max(start - RECONNECT_LOOKBACK_NS, min(start, recent.oldest_ns))
        produced: set[str] = set()
        served, idless, failure, mark = 0, 0, None, self.sink.failures
        try:
            for lo, hi in _chunks(start, gap.to_ns):
                after = gap.from_trade_id if lo == gap.from_ns else None
                for tick in retry(exchange.refetch, gap.ticker, lo, hi, after):
                    if not tick.trade_id:  # which of these the stream sent, nothing tells
                        idless += 1
                        continue
                    if not self._wanted(tick, gap, sequential, recent) or tick.trade_id in produced:
                        continue
                    served += 1
                    tick.ingest_time_ns = time.time_ns()
                    if self._problem(tick, time.time_ns()) is None:
                        self.sink.send(TICKS.name, gap.ticker, tick)
                        produced.add(tick.trade_id)
        except ExchangeError as exc:
            failure = f"the venue would not serve the range: {exc or type(exc).__name__}"
        try:
            self.sink.flush(since=mark)
        except SinkError as exc:  # not taken: left open, which the owner's sweep repairs again
            log.warning("gap %s left open: Kafka did not take its trades: %s", gap.gap_id, exc)
            return gap
        done = market_pb2.Gap()
        done.CopyFrom(gap)
        done.refetched = len(produced)
        done.repaired_ms = int(time.time() * 1000)
        missing = missing_ids(gap) if sequential else None
        if failure is None and missing is not None and served < missing:
            failure = f"the venue served {served} of {missing} missing trades"
        if failure is None and idless:
            # Sent again, a trade without an id would be counted twice wherever the stream
            # had it: a gap left open is better than candles that are wrong.
            failure = f"{idless} trades came without an id, so the missed are not known"
        done.status = market_pb2.GAP_REPAIRED if failure is None else market_pb2.GAP_UNREPAIRABLE
        done.reason = failure or self._beyond_horizon(gap)
        self._record(done)
        if self.metrics is not None:
            self.metrics.refetched.inc(len(produced))
            self.metrics.repair_seconds.observe(
                max(0.0, done.repaired_ms / 1000 - gap.detected_ms / 1000)
            )
        log.info(
            "gap %s %s: %d trades fetched again%s",
            gap.gap_id,
            market_pb2.GapStatus.Name(done.status),
            done.refetched,
            f" ({failure})" if failure else "",
        )
        return done

    def _beyond_horizon(self, gap: market_pb2.Gap) -> str:
        """What a repaired gap did not mend: its trades older than the stream's dedup horizon
        are in ``ticks``, but the stream changes no candle for them (a resend would not be
        known from a new trade). Empty when it mended everything."""
        if gap.from_ns >= time.time_ns() - self.horizon_ns:
            return ""
        return (
            f"trades older than the dedup horizon ({self.horizon_ns // S_NS} s) are in ticks "
            "but change no candle"
        )

    @staticmethod
    def _wanted(
        tick: market_pb2.Tick, gap: market_pb2.Gap, sequential: bool, recent: RecentIds | None
    ) -> bool:
        """Whether a refetched trade is one the stream missed. On a takeover, the dead
        peer's announced last trade and those before it in the look-back are: it may not
        have delivered them."""
        takeover = gap.cause == market_pb2.TAKEOVER
        if sequential:
            try:
                after = int(gap.from_trade_id) < int(tick.trade_id) or takeover
                return after and int(tick.trade_id) < int(gap.to_trade_id)
            except ValueError:
                return False
        if tick.trade_id == gap.to_trade_id or (
            tick.trade_id == gap.from_trade_id and not takeover
        ):
            return False
        return recent is None or tick.trade_id not in recent

    def _record(self, gap: market_pb2.Gap) -> None:
        self.sink.send(GAPS.name, gap.gap_id, gap)
        if self.metrics is not None:
            cause = market_pb2.GapCause.Name(gap.cause)
            self.metrics.gaps.labels(cause, market_pb2.GapStatus.Name(gap.status)).inc()

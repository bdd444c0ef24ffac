"""``candlewire ingest``: take work from the relay, fetch from exchanges, write to Kafka.

One loop thread owns the sockets: the work queue and control channel (SUB, ``{EXCHANGE}:``
prefixes), peers' heartbeats (SUB on the relay's fanout) and our own heartbeat, an XPUB
connected into each relay's publisher ingress. Through that XPUB the relays hand us every
market-data topic's first subscription and last unsubscription, so a subscriber anywhere
starts its ticker's stream (on demand) and the last one leaving stops it after a grace
period (:mod:`candlewire.demand`). Fetches run on a small thread pool, live streams on a
thread each. Who does what is decided by :mod:`ingest.peers`. Gaps a stream finds in its
trades are repaired on the thread pool (:mod:`ingest.gaps`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial

import zmq

from candlewire.config import Settings
from candlewire.curve import INGESTOR_KEY, dial
from candlewire.demand import ERROR_REPEAT_S, Demand, subscription_error
from candlewire.runtime import MetricsServer, run_until_signal
from candlewire.topics import (
    LIVE_KEYS,
    TopicError,
    book_key,
    check_request_id,
    demanded_book,
    ingestor_topic,
    parse_ticker,
    stream_key,
    work_prefix,
)
from candlewire.zmqutil import harden, pending, publish_to_relays, subscriptions
from ingest.books import BookStream
from ingest.exchanges.base import Exchange, NoBook, UnknownSymbol, pages
from ingest.gaps import GapDetector, GapRepairer, GapWatch, last_delivered
from ingest.jobs import history_metadata, run_history, run_metadata, run_stream, send_history_error
from ingest.metrics import IngestMetrics
from ingest.peers import PeerView
from ingest.sink import KafkaSink, SinkError
from proto import market_pb2
from proto import requests_pb2 as rq
from proto.envelope import EnvelopeError, Names, decode_sub, encode, encode_topic

log = logging.getLogger("candlewire.ingest")
REQUEST_KINDS = Names.of(rq.DataRequestKind)  # the kinds this build can name
STREAM_END_S = 2.0  # at stop: how long a live job may take to send its last trades
# Fetches waiting for a slot (every ingestor of an exchange holds every request until one
# does it): beyond this many, a new request is answered with an error, not held.
MAX_QUEUED_FETCHES = 10_000
# A fetch a peer owns but has not taken for this long is dropped: the peer did it and we
# missed its word (its recent ``done`` list is short), or it is gone with it.
QUEUED_STALE_S = 600.0
AGE_EVERY_S = 10.0
# Gaps left open (an ingestor died mid-repair, Kafka refused the refetched trades): read from
# the gaps topic this often, and repaired again by their owner once this old.
SWEEP_EVERY_S = 60.0
OPEN_STALE_S = 120.0


def demand_id(key: str) -> str:
    """request_id of a live job held because someone subscribes (not an explicit request)."""
    return f"demand:{key.removeprefix('stream:')}"


@dataclass
class Job:
    key: str
    exchange: str
    future: Future | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    gaps: GapWatch | None = None  # a live stream's


class Ingestor:
    def __init__(
        self,
        settings: Settings,
        exchanges: list[Exchange],
        *,
        ingestor_id: str | None = None,
        heartbeat_s: float = 1.0,
        warmup_beats: int = 3,
        workers: int = 4,
        metrics: bool = True,
        always_on: list[str] | None = None,
        on_demand: bool = True,
        grace_s: float | None = None,
    ) -> None:
        self.settings = settings
        self.exchanges = {e.name: e for e in exchanges}
        self.id = ingestor_id or f"ing-{uuid.uuid4().hex[:12]}"
        self.heartbeat_s = heartbeat_s
        self.warmup_s = warmup_beats * heartbeat_s
        self.views = {name: PeerView(self.id) for name in self.exchanges}
        self.pending: dict[str, rq.DataRequest] = {}
        # Always-on streams: held like a subscription every ingestor of the exchange received,
        # so exactly one of them streams each ticker and another takes over if it dies.
        for ticker in always_on or []:
            exchange = ticker.split(":", 1)[0]
            if exchange in self.exchanges:
                self.pending[stream_key(ticker)] = rq.DataRequest(
                    request_id=f"always-on:{ticker}",
                    kind=rq.REALTIME_SUBSCRIBE,
                    ticker=ticker,
                    exchange=exchange,
                )
        self.on_demand = on_demand
        grace = settings.demand_grace_s if grace_s is None else grace_s
        self.demand = Demand(grace)
        self.book_demand = Demand(grace, accepts=demanded_book)
        # job key (stream:T, book:T) -> reason, text, next report
        self.failed: dict[str, tuple[int, str, float]] = {}
        self.jobs: dict[str, Job] = {}
        self.recent_done: dict[str, deque[str]] = {n: deque(maxlen=200) for n in self.exchanges}
        self.metrics = IngestMetrics()
        self._serve_metrics = metrics
        self.workers = workers  # fetches at once (history, metadata); gap repairs share them
        # Fetches waiting for a slot, by exchange, as of the last schedule and since.
        self._queued: Counter[str] = Counter()
        self._waiting_since: dict[str, float] = {}
        self._next_age = 0.0
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="ingest-job")
        self._sink = KafkaSink(settings)
        sink = self._sink
        self.metrics.undelivered.set_function(lambda: sink.failures)
        self._repairer = GapRepairer(
            self._sink,
            self._pool,
            ahead_s=settings.ingest.tick_ahead_s,
            metrics=self.metrics,
            horizon_s=settings.stream_dedup_horizon_s,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sweeper: threading.Thread | None = None
        self._swept: list[market_pb2.Gap] | None = None  # read by the sweeper, for the loop
        self._http: MetricsServer | None = None
        self._started = time.monotonic()  # again at start(): the warm-up counts from there

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Ingestor:
        self._started = time.monotonic()
        if self._serve_metrics:
            self._http = MetricsServer(self.metrics.registry, self.settings, "ingest_metrics")
        self._thread = threading.Thread(target=self._loop, name=f"ingest-{self.id}", daemon=True)
        self._thread.start()
        self._sweeper = threading.Thread(target=self._sweep_loop, name="gap-sweep", daemon=True)
        self._sweeper.start()
        log.info("ingestor %s serving %s", self.id, ", ".join(self.exchanges))
        return self

    def stop(self, flush_s: float = 10.0) -> None:
        """Stop the loop and every job, then give librdkafka ``flush_s`` to deliver what is
        queued: trades a stream has taken from the venue exist nowhere else."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for job in self.jobs.values():
            job.stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for exchange in self.exchanges.values():
            exchange.close()
        # A stream's last trades are sent as it ends; wait for that briefly, then deliver.
        wait([j.future for j in self.jobs.values() if j.future is not None], STREAM_END_S)
        try:
            self._sink.flush(flush_s, since=self._sink.failures)
        except SinkError as exc:
            log.warning("ingestor %s stopped with records undelivered: %s", self.id, exc)
        if self._http is not None:
            self._http.close()

    def run(self) -> None:
        run_until_signal(self.start, self.stop)

    # -- state -------------------------------------------------------------------------------

    def state(self, now: float) -> int:
        if now - self._started < self.warmup_s:
            return rq.READY
        return (
            rq.BUSY
            if any(j.future and not j.future.done() for j in self.jobs.values())
            else rq.AVAILABLE
        )

    def taking_work(self, now: float) -> bool:
        return self.state(now) in (rq.AVAILABLE, rq.BUSY)

    # -- the loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        ctx = zmq.Context()
        size = self.settings.max_message_bytes
        s = self.settings

        def sock(kind: int, linger_ms: int = 500) -> zmq.Socket:
            made = harden(ctx.socket(kind), max_message_bytes=size, linger_ms=linger_ms)
            return dial(made, s, "relay", INGESTOR_KEY)

        work, control, peers = sock(zmq.SUB), sock(zmq.SUB), sock(zmq.SUB)
        beat = publish_to_relays(sock(zmq.XPUB, linger_ms=1000))
        requests = sock(zmq.DEALER, linger_ms=1000)
        # Only to relays that are up: libzmq would otherwise queue every second request for
        # one that is down (round robin over its pipes) until it came back.
        requests.setsockopt(zmq.IMMEDIATE, 1)
        for name in self.exchanges:
            work.subscribe(work_prefix(name))
            control.subscribe(work_prefix(name))
            peers.subscribe(ingestor_topic(name))
        # Every relay: work and control come from whichever a request reached (a request
        # resent to another relay is still done once: by request_id), demand from all.
        for relay_sock, channel in (
            (work, "work_queue"),
            (control, "control"),
            (peers, "market_data"),
            (beat, "publisher_ingress"),
            (requests, "client_requests"),  # DEALER: each request to one relay, in turn
        ):
            for endpoint in self.settings.relays(channel):
                relay_sock.connect(endpoint)
        self._requests = requests
        poller = zmq.Poller()
        for s in (work, control, peers, beat, requests):
            poller.register(s, zmq.POLLIN)
        next_beat = 0.0
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(100))
                now = time.monotonic()
                if work in events:
                    self._drain(work, "work_queue", self._on_work)
                if control in events:
                    self._drain(control, "control", self._on_control)
                if peers in events:
                    self._drain(peers, "peers", self._on_peer)
                if beat in events:
                    self._drain_subscriptions(beat, now)
                if requests in events:
                    for _ in pending(requests):
                        pass  # the relay acknowledges our cancels; nothing waits on them
                self._expire(now)
                if (swept := self._swept) is not None:
                    self._swept = None
                    self.resweep(swept, now)
                self._reap(now)
                self._schedule(now)
                if now >= next_beat:
                    self._heartbeat(beat, now)
                    next_beat = now + self.heartbeat_s
                self._report_failures(beat, now)
                self.metrics.state.set(self.state(now))
                self._sink.poll()
            self._heartbeat(beat, time.monotonic(), final=True)
        finally:
            for s in (work, control, peers, beat, requests):
                s.close()
            ctx.term()

    def _drain(self, sock: zmq.Socket, name: str, handle) -> None:  # noqa: ANN001
        for _ in range(1000):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                _, msg = decode_sub(frames)
            except EnvelopeError:
                self.metrics.dropped.labels(name).inc()
                continue
            handle(msg)

    def _on_work(self, msg: object) -> None:
        if (
            not isinstance(msg, rq.DataRequest)
            or msg.exchange not in self.exchanges
            or msg.kind not in REQUEST_KINDS  # proto3 keeps a newer sender's kind as a number
        ):
            self.metrics.dropped.labels("work_queue").inc()
            return
        self.metrics.received.labels(REQUEST_KINDS[msg.kind].lower()).inc()
        if msg.kind == rq.REALTIME_SUBSCRIBE:
            self.pending[stream_key(msg.ticker)] = msg
        elif msg.kind == rq.REALTIME_CANCEL:
            self._cancel(msg.ticker)
        elif msg.kind in (rq.HISTORICAL, rq.SYMBOL_METADATA):
            try:
                check_request_id(msg.request_id)  # the relay refuses these; a job key's too
            except TopicError:
                self.metrics.dropped.labels("work_queue").inc()
                return
            key = msg.request_id
            if key in self.views[msg.exchange].done:
                return
            if key not in self.pending and self._queued[msg.exchange] >= MAX_QUEUED_FETCHES:
                self._shed(msg, time.monotonic())
                return
            self._queued[msg.exchange] += key not in self.pending
            self.pending[key] = msg

    def _shed(self, msg: rq.DataRequest, now: float) -> None:
        """A fetch beyond the queue's bound: its owner answers it with an error (once, as it
        would its failure) and says it is done, so the peers that hold it let it go."""
        self.metrics.fetches_dropped.labels("queue_full").inc()
        view = self.views[msg.exchange]
        if view.owner(msg.request_id, now, self.taking_work(now)) != self.id:
            return
        queued = self._queued[msg.exchange]
        log.warning("%s: %d fetches queued; refused %s", self.id, queued, msg.request_id)
        if msg.kind == rq.HISTORICAL:
            exchange = self.exchanges[msg.exchange]
            try:  # the relay checked the range; this runs on the loop's thread all the same
                windows = pages(msg.start_ms, msg.end_ms, msg.period_s, exchange.rows_per_page)
            except (ArithmeticError, ValueError):
                windows = []
            text = (
                f"ingestor {self.id} has {queued} fetches queued for {msg.exchange} "
                f"(at most {MAX_QUEUED_FETCHES}); retry later"
            )
            send_history_error(self._sink, history_metadata(msg, len(windows), self.id), text)
        view.mark_done(msg.request_id, now)
        self.recent_done[msg.exchange].append(msg.request_id)

    def _on_control(self, msg: object) -> None:
        if isinstance(msg, rq.IngestorControl) and msg.action == rq.CANCEL_REALTIME:
            if self.on_demand and self.demand.watched(msg.ticker):
                log.info("cancel of %s ignored: it has subscribers again", msg.ticker)
                return
            self._cancel(msg.ticker)

    # -- realtime on demand -------------------------------------------------------------------

    def _drain_subscriptions(self, beat: zmq.Socket, now: float) -> None:
        for subscribed, topic in subscriptions(beat):
            for demand, key_of in ((self.demand, stream_key), (self.book_demand, book_key)):
                change = demand.apply(subscribed, topic, now)
                if change is None or not self.on_demand:
                    continue
                ticker, watched = change
                exchange, key = parse_ticker(ticker).exchange, key_of(ticker)
                if watched and exchange in self.exchanges and key not in self.pending:
                    log.info("%s: %s has a subscriber; streaming on demand", self.id, key)
                    self.metrics.received.labels("demand").inc()
                    self.pending[key] = rq.DataRequest(
                        request_id=demand_id(key),
                        kind=rq.REALTIME_SUBSCRIBE,
                        ticker=ticker,
                        exchange=exchange,
                    )

    def _expire(self, now: float) -> None:
        """Stop on-demand streams whose last subscriber left a grace period ago."""
        for key in map(book_key, self.book_demand.expired(now)):
            req = self.pending.get(key)
            self.failed.pop(key, None)
            if req is not None and req.request_id == demand_id(key):
                del self.pending[key]
                self._stop_job(key)
        for ticker in self.demand.expired(now):
            key = stream_key(ticker)
            self.failed.pop(key, None)
            req = self.pending.get(key)
            if req is None or req.request_id != demand_id(key):
                continue  # always-on or explicitly requested: not ours to stop
            del self.pending[key]
            if key in self.jobs:
                # Tell every ingestor of the exchange, as an operator's cancel would.
                self._cancel(ticker)
                cancel = rq.IngestorControl(
                    request_id=f"{demand_id(key)}:{int(now * 1000)}",
                    action=rq.CANCEL_REALTIME,
                    exchange=req.exchange,
                    ticker=ticker,
                )
                try:
                    self._requests.send_multipart([b"", *encode(cancel)], zmq.NOBLOCK)
                except zmq.Again:  # no relay reachable: our stream is stopped all the same
                    log.warning("no relay reachable: the peers did not hear %s's cancel", ticker)

    def _report_failures(self, beat: zmq.Socket, now: float) -> None:
        """Tell a failed stream's subscribers why, for as long as they watch."""
        for key, (reason, text, due) in list(self.failed.items()):
            ticker = key.split(":", 1)[1]
            demand = self.book_demand if key == book_key(ticker) else self.demand
            if not demand.watched(ticker):
                del self.failed[key]
            elif now >= due:
                beat.send_multipart(subscription_error(ticker, reason, text, self.id))
                self.failed[key] = (reason, text, now + ERROR_REPEAT_S)

    def _on_peer(self, msg: object) -> None:
        if (
            isinstance(msg, rq.IngestorControl)
            and msg.action == rq.HEARTBEAT
            and msg.exchange in self.views
        ):
            self.views[msg.exchange].observe(msg, time.monotonic())

    def _cancel(self, ticker: str) -> None:
        key = stream_key(ticker)
        self.pending.pop(key, None)
        self._stop_job(key)

    def _stop_job(self, key: str) -> None:
        job = self.jobs.pop(key, None)
        if job is not None:
            job.stop.set()
            log.info("%s cancelled", key)

    def _schedule(self, now: float) -> None:
        for key, job in list(self.jobs.items()):
            if key.startswith(LIVE_KEYS) and self.views[job.exchange].outranked(key, now):
                log.info("%s: %s is streamed by a higher-ranked peer too; yielding", self.id, key)
                job.stop.set()
                del self.jobs[key]
        taking = self.taking_work(now)
        # Fetches start as the pool has room: one started beyond it would wait in the pool's
        # queue, unbounded, and be listed in every heartbeat as work this ingestor holds.
        fetching = sum(not k.startswith(LIVE_KEYS) for k in self.jobs)
        since: dict[str, float] = {}
        for key, req in list(self.pending.items()):
            if key in self.jobs:
                continue
            view = self.views[req.exchange]
            if key in view.done:
                del self.pending[key]
                continue
            fetch = not key.startswith(LIVE_KEYS)
            if not (fetch and fetching >= self.workers) and view.owner(key, now, taking) == self.id:
                self._start(key, req)
                fetching += fetch
            elif fetch:
                since[key] = self._waiting_since.get(key, now)
        self._waiting_since = since
        self._queued = Counter(self.pending[k].exchange for k in since)
        if now >= self._next_age:
            self._age(now, taking)
            self._next_age = now + AGE_EVERY_S

    def _age(self, now: float, taking: bool) -> None:
        """Drop the fetches a live peer has owned, and not taken, for QUEUED_STALE_S: ours
        wait, and so do those a peer works on (another takes them over if it dies)."""
        for key, first in list(self._waiting_since.items()):
            if now - first < QUEUED_STALE_S:
                continue
            req = self.pending[key]
            view = self.views[req.exchange]
            owner = view.owner(key, now, taking)
            peer = view.alive(now).get(owner or "")
            if peer is not None and key not in peer.working:  # taken: kept for its takeover
                log.warning(
                    "%s: dropped %s, queued %.0f s for %s", self.id, key, now - first, owner
                )
                self.metrics.fetches_dropped.labels("stale").inc()
                del self.pending[key], self._waiting_since[key]
                self._queued[req.exchange] -= 1

    def _start(self, key: str, req: rq.DataRequest) -> None:
        exchange = self.exchanges[req.exchange]
        job = Job(key, req.exchange)
        if req.kind == rq.HISTORICAL:
            job.future = self._pool.submit(run_history, req, exchange, self._sink, self.id)
        elif req.kind == rq.SYMBOL_METADATA:
            job.future = self._pool.submit(run_metadata, req, exchange, self._sink)
        elif key.startswith("book:"):
            job.future = Future()
            threading.Thread(
                target=self._book, args=(req.ticker, exchange, job), name=key, daemon=True
            ).start()
        else:
            # A stream another ingestor was running when it died starts from its last trade.
            tail = self.views[req.exchange].takeover_tail(
                req.ticker, time.monotonic(), time.time_ns(), self.settings.stream_dedup_horizon_s
            )
            detector = GapDetector(req.ticker, exchange.sequential_ids, self.id, tail)
            job.gaps = GapWatch(detector, partial(self._repairer.found, exchange))
            job.future = Future()
            threading.Thread(
                target=self._stream, args=(req.ticker, exchange, job), name=key, daemon=True
            ).start()
        self.jobs[key] = job
        log.info("%s: started %s", self.id, key)

    def _stream(self, ticker: str, exchange: Exchange, job: Job) -> None:
        try:
            self._resume(ticker, job)
            conf = self.settings.ingest
            count = self.metrics.dropped_ticks.labels
            sent = run_stream(
                ticker,
                exchange,
                self._sink,
                job.stop,
                (conf.tick_ahead_s, conf.tick_behind_s),
                lambda reason: count(reason).inc(),
                job.gaps,
            )
            job.future.set_result(sent)  # type: ignore[union-attr]
        except Exception as exc:
            job.future.set_exception(exc)  # type: ignore[union-attr]

    def _resume(self, ticker: str, job: Job) -> None:
        """A stream of the ingestor's first minute (``[ingest] resume_within_s``) with no
        peer's tail resumes from its last trade in Kafka, if within the dedup horizon: the
        downtime of an ingestor that restarted is a gap (the tails it announced died with
        it when no peer heard them)."""
        detector = job.gaps.detector if job.gaps is not None else None
        if detector is None or detector.tail is not None:
            return
        now = time.monotonic()
        if now - self._started > self.settings.ingest.resume_within_s:
            return
        if self.views[job.exchange].alive(now):
            return  # peers hear tails: a takeover's comes from their heartbeats
        try:
            since_ns = time.time_ns() - self._repairer.horizon_ns
            tail = last_delivered(self.settings, ticker, since_ns=since_ns)
        except Exception:  # Kafka away: the stream starts as a new one
            log.warning("%s: %s's last trade not read from Kafka", self.id, ticker, exc_info=True)
            return
        if tail is not None and tail.time_ns >= since_ns:
            log.info(
                "%s: %s resumes from its last trade in Kafka, %s", self.id, ticker, tail.trade_id
            )
            detector.resume_from(tail)

    def _book(self, ticker: str, exchange: Exchange, job: Job) -> None:
        count = self.metrics.book_events.labels
        stream = BookStream(ticker, exchange, self._sink, lambda event: count(event).inc())
        try:
            job.future.set_result(stream.run(job.stop))  # type: ignore[union-attr]
        except Exception as exc:
            job.future.set_exception(exc)  # type: ignore[union-attr]

    def _reap(self, now: float) -> None:
        for key, job in list(self.jobs.items()):
            if job.future is None or not job.future.done():
                continue
            del self.jobs[key]
            kind = "stream" if key.startswith(LIVE_KEYS) else "fetch"
            exc = job.future.exception()
            self.metrics.completed.labels(kind, "error" if exc else "ok").inc()
            if exc is not None:
                log.error("%s failed: %s", key, exc)
            elif kind == "fetch" and isinstance(job.future.result(), int):
                self.metrics.rows.inc(job.future.result())
            if kind == "fetch":
                self.pending.pop(key, None)
                self.views[job.exchange].mark_done(key, now)
                self.recent_done[job.exchange].append(key)
            elif exc is not None:
                self.pending.pop(key, None)  # unknown symbol: do not restart
                if isinstance(exc, NoBook):
                    self.failed[key] = (rq.NO_BOOK, str(exc), now)
                elif isinstance(exc, UnknownSymbol):
                    self.failed[key] = (rq.UNKNOWN_SYMBOL, str(exc), now)
            elif not job.stop.is_set():  # it ended by itself: a replay reached its end
                self.pending.pop(key, None)

    # -- gaps left open --------------------------------------------------------------------

    def _sweep_loop(self) -> None:
        """Reads the gaps topic each SWEEP_EVERY_S, off the loop thread; the loop decides."""
        while not self._stop.wait(SWEEP_EVERY_S):
            try:
                self._swept = self.open_gaps()
            except Exception:  # Kafka away, say: the next sweep reads again
                log.warning("%s: the gaps topic was not read", self.id, exc_info=True)

    def open_gaps(self) -> list[market_pb2.Gap] | None:
        """The gaps open in the gaps topic; None when it was not read to its end (a gap
        whose outcome was not reached would look open)."""
        from candlewire.gaps import read_gaps

        log_ = read_gaps(self.settings, timeout_s=10.0)
        if not log_.complete:
            return None
        return [g for g in log_.listed() if g.status == market_pb2.GAP_OPEN]

    def sweep_gaps(self, now: float) -> list[str]:
        """:meth:`open_gaps` and :meth:`resweep` at once, on the caller's thread."""
        return self.resweep(self.open_gaps() or [], now)

    def resweep(self, gaps: list[market_pb2.Gap], now: float) -> list[str]:
        """Repair again the open gaps of our exchanges that stayed open OPEN_STALE_S: their
        repair died with its ingestor, or Kafka refused what it fetched. A gap's recorder
        repairs it again while it lives (none is under way here), else its owner by
        rendezvous among the live peers. One whose range began before the dedup horizon
        (less a margin) is given up: repaired now, its trades could be stored twice. On
        the loop thread, which alone uses the peer views. Returns the gap ids taken."""
        taking, stale_ms = self.taking_work(now), time.time() * 1000 - OPEN_STALE_S * 1000
        oldest_ns = self._repairer.resend_floor_ns()
        taken = []
        for gap in gaps:
            exchange = gap.ticker.partition(":")[0]
            if exchange not in self.exchanges or gap.detected_ms > stale_ms:
                continue
            if self._repairer.repairing(gap.gap_id):
                continue
            view = self.views[exchange]
            recorder = gap.ingestor_id
            if recorder == self.id or recorder in view.alive(now):
                owner: str | None = recorder
            else:
                owner = view.owner(gap.gap_id, now, taking)
            if owner != self.id:
                continue
            if gap.from_ns < oldest_ns:
                self._repairer.give_up(gap, "left open past the dedup horizon")
                continue
            log.info("%s: repairing gap %s again: it stayed open", self.id, gap.gap_id)
            if self._repairer.submit(self.exchanges[exchange], gap) is None:
                break  # stopping
            taken.append(gap.gap_id)
        return taken

    def _heartbeat(self, beat: zmq.Socket, now: float, final: bool = False) -> None:
        state = rq.DONE if final else self.state(now)
        for name in self.exchanges:
            mine = [j for j in self.jobs.values() if j.exchange == name and not j.stop.is_set()]
            working = [j.key for j in mine]
            tails = [j.gaps.detector.tail for j in mine if j.gaps and j.gaps.detector.tail]
            hb = rq.IngestorControl(
                action=rq.HEARTBEAT,
                exchange=name,
                ingestor_id=self.id,
                state=state,
                working=working,
                done=list(self.recent_done[name]),
                time_ms=int(time.time() * 1000),
                interval_ms=int(self.heartbeat_s * 1000),
                tails=tails,
            )
            beat.send_multipart(encode_topic(ingestor_topic(name), hb))

"""A live L2 book stream (#38): a venue's snapshot and deltas, checked, into ``candlewire.books``.

Nothing reaches Kafka unchecked: every delta goes through :class:`candlewire.book.BookSync`
first, with the venue's checksum formula when it has one. A missing delta or a checksum
mismatch is never applied and never written: the stream fetches a fresh snapshot from the
venue, writes it with the reason, and goes on from it; the event is counted. What a reader
of the topic sees for a ticker is therefore always a snapshot followed by deltas that apply
to it exactly. A periodic snapshot of the checked book gives ``since=`` and ``history`` a
recent starting point.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from candlewire.book import SNAPSHOT_EVERY_S, BookError, BookSync, Verdict
from candlewire.kafka import BOOKS
from ingest.exchanges.base import BookBroken, Exchange, ExchangeError, NoBook, UnknownSymbol
from ingest.jobs import retry
from ingest.sink import KafkaSink, RecordTooLarge
from proto import book_pb2

log = logging.getLogger("candlewire.ingest")
RETRY_S = 1.0  # between rounds of snapshots that did not catch up with the stream
QUIET_CHECK_S = 1.0  # how often a quiet book is looked at for its periodic snapshot
_RESNAPSHOT = {
    Verdict.GAP: book_pb2.SNAPSHOT_SEQUENCE,
    Verdict.CHECKSUM: book_pb2.SNAPSHOT_CHECKSUM,
}


class BookStream:
    """One ticker's book from one venue, written as it is checked."""

    def __init__(
        self,
        ticker: str,
        exchange: Exchange,
        sink: KafkaSink,
        counted: Callable[[str], None] = lambda _event: None,
        snapshot_s: float = SNAPSHOT_EVERY_S,
    ) -> None:
        self.ticker, self.exchange, self.sink = ticker, exchange, sink
        self.counted, self.snapshot_s = counted, snapshot_s
        self.sync = BookSync(ticker, exchange.book_checksum())
        # The stream's thread and the quiet book's snapshots: each write follows the last.
        self._lock = threading.RLock()
        self.sent = 0
        self._next_snapshot = 0.0
        self._next_try = 0.0  # when an untrusted book asks for a snapshot again

    def run(self, stop: threading.Event) -> int:
        """Until ``stop``; reconnects on exchange errors, each time from a fresh snapshot."""
        done = threading.Event()
        quiet = threading.Thread(
            target=self._snapshot_while_quiet,
            args=(done,),
            name=f"{self.ticker}-quiet",
            daemon=True,
        )
        quiet.start()
        try:
            return self._run(stop)
        except RecordTooLarge as exc:  # it would be as large again: a book this stream cannot serve
            raise NoBook(f"{self.ticker}: {exc}") from None
        finally:
            done.set()

    def _run(self, stop: threading.Event) -> int:
        reason = book_pb2.SNAPSHOT_START
        while not stop.is_set():
            try:
                deltas = self.exchange.book_deltas(self.ticker, stop)
                with self._lock:
                    # Nothing from before a reconnect is trusted, nor held: a venue may
                    # number its updates afresh.
                    self.sync = BookSync(self.ticker, self.sync.checksum)
                    self._resnapshot(reason)
                reason = book_pb2.SNAPSHOT_START
                for delta in deltas:
                    with self._lock:
                        self._on_delta(delta)
                if not stop.is_set():
                    log.info("book %s ended: the exchange has no more", self.ticker)
                    break
            except (UnknownSymbol, NoBook):
                raise
            except BookBroken as exc:  # the adapter's library found it: the same as ours
                log.warning("book %s: %s; from a fresh snapshot", self.ticker, exc)
                self.counted(exc.kind.value)
                reason = _RESNAPSHOT[exc.kind]
                stop.wait(RETRY_S)  # a venue that keeps failing is not asked in a tight loop
            except ExchangeError as exc:
                log.warning("book %s: %s; reconnecting", self.ticker, exc)
                stop.wait(1.0)
        return self.sent

    def _on_delta(self, delta: book_pb2.BookDelta) -> None:
        verdict = self.sync.on_delta(delta)
        if verdict is Verdict.APPLIED:
            self._send(delta)
        elif verdict in _RESNAPSHOT:
            log.warning("book %s: %s at venue seq %d", self.ticker, verdict.value, delta.venue_seq)
            self.counted(verdict.value)
            self._resnapshot(_RESNAPSHOT[verdict])
            return
        elif verdict is Verdict.MALFORMED:
            self.counted(verdict.value)
        elif verdict is Verdict.WAITING and time.monotonic() >= self._next_try:
            self._resnapshot(book_pb2.SNAPSHOT_SEQUENCE)  # the last tries did not catch up
            return
        # STALE: the overlap of a snapshot and the stream
        self._periodic()

    def _periodic(self) -> None:
        """The checked book's periodic snapshot, when one is due."""
        book = self.sync.book
        if book is not None and time.monotonic() >= self._next_snapshot:
            self._send(book.snapshot(book_pb2.SNAPSHOT_PERIODIC))

    def _snapshot_while_quiet(self, done: threading.Event) -> None:
        """The periodic snapshot of a book with no updates, which no delta brings: a
        subscriber who joins looks back about one interval for a snapshot to start from."""
        while not done.wait(min(QUIET_CHECK_S, self.snapshot_s)):
            with self._lock:
                try:
                    self._periodic()
                except Exception:  # as large as the stream's own snapshot, which went
                    log.exception("book %s: no quiet snapshots from now", self.ticker)
                    return

    def _resnapshot(self, reason: book_pb2.SnapshotReason) -> None:
        """The venue's snapshot, written, then the held deltas it does not include. Held
        deltas that still do not follow on ask for another, up to three times; after that
        the stream asks again a second later (a REST snapshot that lags the stream)."""
        for _ in range(3):
            snap = retry(self.exchange.book_snapshot, self.ticker)
            snap.reason = reason
            try:
                held = self.sync.on_snapshot(snap)
            except BookError as exc:
                self.counted(Verdict.MALFORMED.value)
                raise ExchangeError(f"{self.ticker}: snapshot unusable: {exc}") from None
            self._send(snap)
            for delta, verdict in held:
                if verdict is Verdict.APPLIED:
                    self._send(delta)
            if self.sync.book is not None:
                return
            reason = book_pb2.SNAPSHOT_SEQUENCE
        self._next_try = time.monotonic() + RETRY_S

    def _send(self, msg: book_pb2.BookDelta | book_pb2.BookSnapshot) -> None:
        if isinstance(msg, book_pb2.BookSnapshot):
            self._next_snapshot = time.monotonic() + self.snapshot_s
        self.sink.send(BOOKS.name, self.ticker, msg)
        self.sent += 1

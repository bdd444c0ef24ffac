"""``candlewire journal``: FETCH over ZMQ, so no subscriber loses a message for good.

One ROUTER (``journal``), one loop: each FetchRequest gets one FetchReply, a bounded chunk
read from the journal (:mod:`journal.reader`). The client asks for the next chunk as it
receives this one, from the reply's head, before it reads the runs: one chunk ahead, never
more (like the spec's sync protocol, one step early), so a slow client costs the service
nothing while it is slow, and its memory stays at two chunks.

Bad input is answered when it can be (FETCH_BAD_REQUEST names the problem) and otherwise
dropped and counted; it never stops the loop.
"""

from __future__ import annotations

import logging
import threading
import time

import zmq
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from candlewire.config import Settings
from candlewire.curve import Guard, serve
from candlewire.runtime import MetricsServer, bind, run_until_signal
from candlewire.zmqutil import harden
from journal.reader import Fetched, JournalReader
from proto import journal_pb2 as jr
from proto.envelope import EnvelopeError, decode, encode_with, expect, fitted, split_route

log = logging.getLogger("candlewire.journal")
# Replies (and requests) queued for one client, at most: a client asks one chunk ahead,
# never more. At the default (100,000) one DEALER that asked and did not read had the
# service hold every reply, each up to 7 MB; past this the ROUTER drops them, and a client
# that waited asks again (Lazy Pirate), while one that floods is held back by TCP.
PEER_QUEUE = 8
STOP_WAIT_S = 30.0  # a fetch's longest: its Kafka calls time out within seconds


class JournalMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.replies = Counter(
            "candlewire_journal_replies",
            "FetchReplies sent, by status",
            ["status"],
            registry=self.registry,
        )
        self.records = Counter(
            "candlewire_journal_records_served",
            "Journalled messages sent in FetchReplies",
            registry=self.registry,
        )
        self.dropped = Counter(
            "candlewire_journal_dropped_frames",
            "Inbound messages dropped without a reply, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.skipped = Counter(
            "candlewire_journal_skipped_records",
            "A topic's journal records not served: undecodable, or no run of that topic",
            registry=self.registry,
        )
        self.left_to_journal = Counter(
            "candlewire_journal_archive_left_to_journal",
            "Archived trades published after the journal's oldest record, left to the journal",
            registry=self.registry,
        )
        self.seconds = Histogram(
            "candlewire_journal_fetch_seconds",
            "Time to read one chunk",
            registry=self.registry,
        )
        self.up = Gauge("candlewire_journal_up", "1 while serving", registry=self.registry)


class JournalService:
    def __init__(self, settings: Settings, *, metrics: bool = True) -> None:
        self.settings = settings
        self.metrics = JournalMetrics()
        self._serve_metrics = metrics
        self._ctx = zmq.Context()
        self._guard = Guard.start(self._ctx, settings)
        self._sock = harden(
            self._ctx.socket(zmq.ROUTER), max_message_bytes=64 << 10, hwm=PEER_QUEUE
        )
        serve(self._sock, settings, "journal", "journal")
        try:
            bind(self._sock, settings, "journal")
        except OSError:
            self._sock.close(linger=0)
            if self._guard is not None:
                self._guard.stop()
            self._ctx.term()
            raise
        self.reader = JournalReader(settings)
        self._http: MetricsServer | None = None

    def run(self) -> None:
        run_until_signal(self.start, self.stop, healthy=self._serving)

    def start(self) -> JournalService:
        if self._serve_metrics:
            self._http = MetricsServer(self.metrics.registry, self.settings, "journal_metrics")
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="journal", daemon=True)
        self._thread.start()
        self.metrics.up.set(1)
        log.info("journal service on %s", self.settings.bind("journal"))
        return self

    def _serving(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop once the fetch in hand is answered. The loop's socket and Kafka consumers are
        closed only after its thread has ended: a ZMQ socket or a Kafka consumer closed by one
        thread while another uses it (a fetch still running on a loaded machine, after
        several queued requests) is undefined, and libzmq's or librdkafka's asserts abort."""
        self._running = False
        self._thread.join(STOP_WAIT_S)
        self.metrics.up.set(0)
        if self._thread.is_alive():  # a fetch bounded by Kafka's timeouts, yet still going
            log.warning(
                "journal loop still busy after %.0fs: its sockets are left open", STOP_WAIT_S
            )
        else:
            self._sock.close(linger=0)
            self.reader.close()
            if self._guard is not None:
                self._guard.stop()
            self._ctx.term()
        if self._http is not None:
            self._http.close()

    def _loop(self) -> None:
        while self._running:
            if not self._sock.poll(200):
                continue
            frames = self._sock.recv_multipart()
            try:
                reply = self.handle(frames)
            except Exception:  # a bug must not stop the service: log it, drop the request
                log.exception("dropped a request")
                self.metrics.dropped.labels("internal_error").inc()
                continue
            if reply is not None:
                self._sock.send_multipart(reply)

    def handle(self, frames: list[bytes]) -> list[bytes] | None:
        """One request's reply frames (route included), or None when it is dropped."""
        route, body, _is_req = split_route(frames)
        try:
            req = expect(decode(body), jr.FetchRequest)
        except EnvelopeError as exc:
            self.metrics.dropped.labels(exc.reason).inc()
            return None
        started = time.perf_counter()
        try:
            reply, runs, count, skipped, left = self.reader.fetch(req)
        except ValueError as exc:  # BadRequest, TopicError
            reply, runs, count, skipped, left = self._failed(req, jr.FETCH_BAD_REQUEST, exc)
        except Exception as exc:  # Kafka unreachable, timeouts: the client retries
            log.warning("fetch of %s failed: %s", req.topic, exc)
            reply, runs, count, skipped, left = self._failed(req, jr.FETCH_UNAVAILABLE, exc)
        self.metrics.seconds.observe(time.perf_counter() - started)
        self.metrics.replies.labels(jr.FetchStatus.Name(reply.status)).inc()
        self.metrics.records.inc(count)
        if skipped:
            self.metrics.skipped.inc(skipped)
        if left:
            self.metrics.left_to_journal.inc(left)
        return [*route, *encode_with(reply, "runs", runs)]

    @staticmethod
    def _failed(req: jr.FetchRequest, status: int, exc: Exception) -> Fetched:
        return Fetched(
            jr.FetchReply(request_id=req.request_id, status=status, error=fitted(str(exc))), [], 0
        )


def main(settings: Settings | None = None) -> None:
    """Entry point for ``candlewire journal``."""
    JournalService(settings or Settings()).run()

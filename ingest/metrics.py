"""Prometheus metrics of one ingestor.

Each ingestor gets its own registry so several can run in one process (tests, embedding).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class IngestMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.received = Counter(
            "candlewire_ingest_requests", "Requests received, by kind", ["kind"], registry=r
        )
        self.completed = Counter(
            "candlewire_ingest_jobs",
            "Jobs finished, by kind and result",
            ["kind", "result"],
            registry=r,
        )
        self.rows = Counter("candlewire_ingest_rows", "History rows written to Kafka", registry=r)
        self.dropped = Counter(
            "candlewire_ingest_dropped_frames", "Undecodable frames dropped", ["socket"], registry=r
        )
        self.fetches_dropped = Counter(
            "candlewire_ingest_fetches_dropped",
            "Fetches not held: the queue full (the owner answers with an error), or a peer's, "
            "not taken for long (stale)",
            ["reason"],
            registry=r,
        )
        self.dropped_ticks = Counter(
            "candlewire_ingest_dropped_ticks",
            "Trades from exchanges not written, by reason (price, size, ahead, behind...)",
            ["reason"],
            registry=r,
        )
        self.gaps = Counter(
            "candlewire_ingest_gaps",
            "Gaps in live streams: GAP_OPEN when found, then GAP_REPAIRED or GAP_UNREPAIRABLE",
            ["cause", "status"],
            registry=r,
        )
        self.refetched = Counter(
            "candlewire_ingest_refetched_ticks",
            "Trades of gaps fetched again and written to the ticks topic",
            registry=r,
        )
        self.repair_seconds = Histogram(
            "candlewire_ingest_gap_repair_seconds",
            "From a gap's detection to its repair (or giving up)",
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800),
            registry=r,
        )
        self.book_events = Counter(
            "candlewire_ingest_book_events",
            "L2 book updates not written: gap and checksum (each followed by a fresh snapshot), "
            "malformed",
            ["event"],
            registry=r,
        )
        self.undelivered = Gauge(
            "candlewire_ingest_undelivered_records",
            "Records Kafka did not take (librdkafka gave up on them) since the ingestor started",
            registry=r,
        )
        self.state = Gauge("candlewire_ingest_state", "1 READY, 2 AVAILABLE, 3 BUSY", registry=r)

"""Prometheus counters of one relay.

Each relay gets its own registry so several can run in one process (tests, embedding).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class RelayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "candlewire_relay_requests",
            "History requests answered, by result",
            ["result"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "candlewire_relay_rejections",
            "History requests rejected, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.dropped = Counter(
            "candlewire_relay_dropped_frames",
            "Inbound messages dropped without a reply, by socket and reason",
            ["socket", "reason"],
            registry=self.registry,
        )
        self.work_published = Counter(
            "candlewire_relay_work_published",
            "DataRequests published on the work queue",
            registry=self.registry,
        )
        self.held = Counter(
            "candlewire_relay_dispatched_history",
            "Accepted history work published, by what released it: its notification topic"
            " already subscribed (not_held), subscribed while held (heard), the hold ran out"
            " (timed_out), or too much was held already (hold_full)",
            ["released"],
            registry=self.registry,
        )
        self.served_exchanges = Gauge(
            "candlewire_relay_work_topics",
            "Work-queue topic prefixes with at least one ingestor subscribed",
            registry=self.registry,
        )
        self.watched_tickers = Gauge(
            "candlewire_relay_watched_tickers",
            "Tickers with at least one market-data subscriber on this relay",
            registry=self.registry,
        )
        self.unserved_reports = Counter(
            "candlewire_relay_unserved_reports",
            "SubscriptionError NO_INGESTOR messages published to subscribers",
            registry=self.registry,
        )
        self.refused = Counter(
            "candlewire_relay_refused",
            "Peers (CURVE keys) and messages refused, by channel and reason",
            ["channel", "reason"],
            registry=self.registry,
        )
        self.publishers = Gauge(
            "candlewire_relay_discovered_publishers",
            "Stream-publisher endpoints found by DNS that the relay is connected to",
            registry=self.registry,
        )
        self.discovery_failures = Counter(
            "candlewire_relay_discovery_failures",
            "Lookups of a publisher name that failed (its last addresses were kept)",
            registry=self.registry,
        )
        self.up = Gauge("candlewire_relay_up", "1 while serving", registry=self.registry)

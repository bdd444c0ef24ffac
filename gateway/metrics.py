"""Prometheus counters of one gateway (its own registry, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.up = Gauge("candlewire_gateway_up", "1 while the gateway serves", registry=r)
        self.sessions = Gauge("candlewire_gateway_sessions", "Open WebSocket sessions", registry=r)
        self.users = Gauge("candlewire_gateway_users", "Users with a session", registry=r)
        self.informational = Counter(
            "candlewire_gateway_informational",
            "Fast-path events, by result (sent to sessions, or no session here)",
            ["result"],
            registry=r,
        )
        self.informational_batch = Histogram(
            "candlewire_gateway_informational_batch_events",
            "Fast-path events taken from the SUB in one loop turn (events_coalesce_ms)",
            buckets=(1, 4, 16, 64, 256),
            registry=r,
        )
        self.critical = Counter(
            "candlewire_gateway_critical",
            "Critical-path events, by ack; duplicates answered again; elsewhere: another gateway delivers it",
            ["result"],
            registry=r,
        )
        self.channel = Counter(
            "candlewire_gateway_channel_sends",
            "Delivery attempts, by channel and outcome",
            ["channel", "outcome"],
            registry=r,
        )
        self.retries = Counter(
            "candlewire_gateway_retries_finished",
            "Queued deliveries this gateway tried, by how they ended (lapsed: past the claim's"
            " lease, due again; taken_over: another gateway's outcome stood)",
            ["result"],
            registry=r,
        )
        self.dropped = Counter(
            "candlewire_gateway_dropped_frames",
            "Inbound messages dropped, by socket and reason",
            ["socket", "reason"],
            registry=r,
        )
        self.refused = Counter(
            "candlewire_gateway_refused",
            "Peers (CURVE keys) and events refused, by channel and reason",
            ["channel", "reason"],
            registry=r,
        )
        self.slow_disconnects = Counter(
            "candlewire_gateway_slow_disconnects",
            "Sessions closed because their outbox filled",
            registry=r,
        )
        self.auth_failures = Counter(
            "candlewire_gateway_auth_failures", "Sessions refused at sign-in", registry=r
        )
        self.origin_refused = Counter(
            "candlewire_gateway_origin_refused",
            "WebSocket handshakes refused: a browser page from another origin",
            registry=r,
        )
        self.rate_limited = Counter(
            "candlewire_gateway_rate_limited",
            "Sessions closed for sending more messages than their rate allows",
            registry=r,
        )
        self.candles = Counter(
            "candlewire_gateway_candles", "Candle updates forwarded to sessions", registry=r
        )
        self.metadata_reloads = Counter(
            "candlewire_gateway_metadata_reloads",
            "Symbol-metadata reloads from Iceberg",
            registry=r,
        )
        self.symbols = Gauge("candlewire_gateway_symbols", "Symbols known", registry=r)
        self.telegram_sessions = Gauge(
            "candlewire_gateway_telegram_sessions",
            "Telegram chats in session (/start without /stop)",
            registry=r,
        )
        self.telegram_polls = Counter(
            "candlewire_gateway_telegram_polls",
            "getUpdates answers, by result (ok, rate_limited, conflict, error, unreachable, "
            "malformed)",
            ["result"],
            registry=r,
        )
        self.telegram_updates = Counter(
            "candlewire_gateway_telegram_updates",
            "Bot updates, by kind (start, stop, unlinked chat, invalid user id, failed, "
            "ignored, malformed)",
            ["kind"],
            registry=r,
        )
        self.telegram_messages = Counter(
            "candlewire_gateway_telegram_session_messages",
            "Messages to Telegram sessions, by result (sent, queue_full, rate_limited, retried, "
            "given_up, blocked, failed, stopped)",
            ["result"],
            registry=r,
        )

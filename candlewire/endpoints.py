"""Every port candlewire uses, declared once.

The endpoint table of ``docs/reference/ports.md`` is generated from ``ENDPOINTS``
(``candlewire endpoints``) and a test keeps the two equal. The spec gives 5557 both to the stream processor's PUB and to
the ingestor control channel; the stream processor keeps 5557 and control moves to 5556.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    name: str
    port: int
    binder: str
    pattern: str
    purpose: str


ENDPOINTS: dict[str, Endpoint] = {
    e.name: e
    for e in (
        Endpoint(
            "work_queue",
            5555,
            "relay",
            "XPUB → ingestor SUB",
            "DataRequest work, `{EXCHANGE}:` topics",
        ),
        Endpoint(
            "control",
            5556,
            "relay",
            "XPUB → ingestor SUB",
            "IngestorControl broadcast (spec's 5557, moved)",
        ),
        Endpoint(
            "stream_pub",
            5557,
            "stream processor",
            "XPUB ← relay XSUB connects",
            "market data and notifications",
        ),
        Endpoint(
            "stream_live",
            5562,
            "stream processor",
            "XPUB ← relay XSUB connects",
            "live ticks and candles of the real-time live path",
        ),
        Endpoint(
            "market_data",
            5558,
            "relay",
            "XPUB ← client SUB",
            "market data and notifications to clients",
        ),
        Endpoint(
            "client_requests",
            5559,
            "relay",
            "ROUTER ← client REQ",
            "SubmitHistoricalRequest → SubmitResponse",
        ),
        Endpoint(
            "publisher_ingress",
            5560,
            "relay",
            "XSUB ← publisher PUB",
            "publishers connect here (or are dialled: static list, DNS)",
        ),
        Endpoint(
            "journal",
            5561,
            "journal service",
            "ROUTER ← client DEALER",
            "FetchRequest → FetchReply: ranges of live topics",
        ),
        Endpoint(
            "user_events",
            5570,
            "user container",
            "XPUB ← gateway SUB",
            "informational UserEvent fast path",
        ),
        Endpoint(
            "stream_events",
            5563,
            "stream processor",
            "XPUB ← gateway SUB",
            "ALERT_TRIGGERED UserEvents of CEP firings (informational path)",
        ),
        Endpoint(
            "critical_events",
            5571,
            "gateway",
            "ROUTER ← container DEALER",
            "critical UserEvent → EventAck",
        ),
        Endpoint(
            "gateway_http", 8765, "gateway", "HTTP + WebSocket", "user sessions and the live page"
        ),
        Endpoint("relay_metrics", 9101, "relay", "HTTP", "Prometheus metrics, health"),
        Endpoint("ingest_metrics", 9102, "ingestor", "HTTP", "Prometheus metrics, health"),
        Endpoint("stream_metrics", 9103, "stream processor", "HTTP", "Prometheus metrics, health"),
        Endpoint("gateway_metrics", 9104, "gateway", "HTTP", "Prometheus metrics, health"),
        Endpoint("journal_metrics", 9105, "journal service", "HTTP", "Prometheus metrics, health"),
        Endpoint(
            "kafka", 9092, "Kafka broker", "Kafka protocol", "ticks, OHLC batches, symbol metadata"
        ),
        Endpoint("kafka_controller", 9093, "Kafka broker", "KRaft controller", "broker-internal"),
        Endpoint(
            "postgres",
            5433,
            "PostgreSQL",
            "SQL",
            "Iceberg catalog, Dagster storage, user directory",
        ),
        Endpoint("dagster", 3000, "Dagster webserver", "HTTP", "UI and GraphQL"),
        Endpoint(
            "spark_master", 7077, "Spark master", "Spark RPC", "a local standalone cluster's master"
        ),
        Endpoint("spark_master_ui", 8080, "Spark master", "HTTP", "its UI and /json status"),
        Endpoint("s3", 9000, "S3Proxy", "S3 API (HTTP)", "an s3:// Iceberg warehouse, when local"),
    )
}


def markdown_table() -> str:
    """The docs' endpoint table (``docs/reference/ports.md``), so docs cannot drift from code."""
    rows = ["| name | port | bound by | pattern | carries |", "|---|---|---|---|---|"]
    rows += [
        f"| `{e.name}` | {e.port} | {e.binder} | {e.pattern} | {e.purpose} |"
        for e in ENDPOINTS.values()
    ]
    return "\n".join(rows)

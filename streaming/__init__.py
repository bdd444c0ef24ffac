"""The Spark Structured Streaming job. Read in order: :mod:`streaming.decode` (Kafka records
to rows), :mod:`streaming.candles` (forming candles and event time), :mod:`streaming.sql` and
:mod:`streaming.tables` (Iceberg writes), :mod:`streaming.publisher` (ZMQ out),
:mod:`streaming.progress` and :mod:`streaming.recovery` (what survives a restart),
:mod:`streaming.queries` (one module per query), :mod:`streaming.job` (starts them)."""

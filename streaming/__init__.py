"""The Spark Structured Streaming job. Read in order: :mod:`streaming.decode` (Kafka records
to rows), :mod:`streaming.publisher` (ZMQ out), :mod:`streaming.progress` (what survives a
restart), :mod:`streaming.job` (the queries)."""

"""The Spark Structured Streaming job. Read in order: :mod:`streaming.decode` (Kafka records
to rows), :mod:`streaming.sql` and :mod:`streaming.tables` (Iceberg writes), :mod:`streaming.publisher` (ZMQ out),
:mod:`streaming.progress` and :mod:`streaming.recovery` (what survives a restart),
:mod:`streaming.queries` (one module per query), :mod:`streaming.job` (starts them).

The market rules (judging resends and late trades, folding trades into candles, trigger
semantics) run in the JVM, once: ``jvm/decoder``'s ``FeedState``, ``TradeIds`` and
``Triggers``, in the committing query's tasks and in the live path of either engine. Their
Python copies in ``tests/reference/`` are what tests hold them to."""

from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Side(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SIDE_UNSPECIFIED: _ClassVar[Side]
    BUY: _ClassVar[Side]
    SELL: _ClassVar[Side]

class MarketStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MARKET_STATUS_UNSPECIFIED: _ClassVar[MarketStatus]
    TRADING: _ClassVar[MarketStatus]
    HALTED: _ClassVar[MarketStatus]
    DELISTED: _ClassVar[MarketStatus]

class GapCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GAP_CAUSE_UNSPECIFIED: _ClassVar[GapCause]
    TRADE_ID_JUMP: _ClassVar[GapCause]
    RECONNECT: _ClassVar[GapCause]
    TAKEOVER: _ClassVar[GapCause]

class GapStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GAP_STATUS_UNSPECIFIED: _ClassVar[GapStatus]
    GAP_OPEN: _ClassVar[GapStatus]
    GAP_REPAIRED: _ClassVar[GapStatus]
    GAP_UNREPAIRABLE: _ClassVar[GapStatus]
SIDE_UNSPECIFIED: Side
BUY: Side
SELL: Side
MARKET_STATUS_UNSPECIFIED: MarketStatus
TRADING: MarketStatus
HALTED: MarketStatus
DELISTED: MarketStatus
GAP_CAUSE_UNSPECIFIED: GapCause
TRADE_ID_JUMP: GapCause
RECONNECT: GapCause
TAKEOVER: GapCause
GAP_STATUS_UNSPECIFIED: GapStatus
GAP_OPEN: GapStatus
GAP_REPAIRED: GapStatus
GAP_UNREPAIRABLE: GapStatus

class Tick(_message.Message):
    __slots__ = ("ticker", "trade_id", "price", "size", "side", "exchange_time_ns", "ingest_time_ns", "stream")
    TICKER_FIELD_NUMBER: _ClassVar[int]
    TRADE_ID_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SIDE_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    INGEST_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ticker: str
    trade_id: str
    price: str
    size: str
    side: Side
    exchange_time_ns: int
    ingest_time_ns: int
    stream: StreamPosition
    def __init__(self, ticker: _Optional[str] = ..., trade_id: _Optional[str] = ..., price: _Optional[str] = ..., size: _Optional[str] = ..., side: _Optional[_Union[Side, str]] = ..., exchange_time_ns: _Optional[int] = ..., ingest_time_ns: _Optional[int] = ..., stream: _Optional[_Union[StreamPosition, _Mapping]] = ...) -> None: ...

class StreamPosition(_message.Message):
    __slots__ = ("epoch", "seq", "publish_time_ms", "source_partition", "source_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PARTITION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    seq: int
    publish_time_ms: int
    source_partition: int
    source_offset: int
    def __init__(self, epoch: _Optional[int] = ..., seq: _Optional[int] = ..., publish_time_ms: _Optional[int] = ..., source_partition: _Optional[int] = ..., source_offset: _Optional[int] = ...) -> None: ...

class StreamHead(_message.Message):
    __slots__ = ("topic", "last")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    topic: str
    last: StreamPosition
    def __init__(self, topic: _Optional[str] = ..., last: _Optional[_Union[StreamPosition, _Mapping]] = ...) -> None: ...

class FeedIdle(_message.Message):
    __slots__ = ("ticker", "event_time_ns", "last_trade_ns")
    TICKER_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_TRADE_NS_FIELD_NUMBER: _ClassVar[int]
    ticker: str
    event_time_ns: int
    last_trade_ns: int
    def __init__(self, ticker: _Optional[str] = ..., event_time_ns: _Optional[int] = ..., last_trade_ns: _Optional[int] = ...) -> None: ...

class OHLC(_message.Message):
    __slots__ = ("ticker", "period_s", "open_time_ms", "open", "high", "low", "close", "volume", "trade_count", "closed", "update_time_ms", "stream", "revision")
    TICKER_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    OPEN_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    VOLUME_FIELD_NUMBER: _ClassVar[int]
    TRADE_COUNT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ticker: str
    period_s: int
    open_time_ms: int
    open: str
    high: str
    low: str
    close: str
    volume: str
    trade_count: int
    closed: bool
    update_time_ms: int
    stream: StreamPosition
    revision: int
    def __init__(self, ticker: _Optional[str] = ..., period_s: _Optional[int] = ..., open_time_ms: _Optional[int] = ..., open: _Optional[str] = ..., high: _Optional[str] = ..., low: _Optional[str] = ..., close: _Optional[str] = ..., volume: _Optional[str] = ..., trade_count: _Optional[int] = ..., closed: bool = ..., update_time_ms: _Optional[int] = ..., stream: _Optional[_Union[StreamPosition, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class HistoryRequestMetadata(_message.Message):
    __slots__ = ("request_id", "client_id", "notification_topic", "ticker", "period_s", "start_ms", "end_ms", "expected_pages", "expected_rows", "ingestor_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_TOPIC_FIELD_NUMBER: _ClassVar[int]
    TICKER_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_PAGES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ROWS_FIELD_NUMBER: _ClassVar[int]
    INGESTOR_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    client_id: str
    notification_topic: str
    ticker: str
    period_s: int
    start_ms: int
    end_ms: int
    expected_pages: int
    expected_rows: int
    ingestor_id: str
    def __init__(self, request_id: _Optional[str] = ..., client_id: _Optional[str] = ..., notification_topic: _Optional[str] = ..., ticker: _Optional[str] = ..., period_s: _Optional[int] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., expected_pages: _Optional[int] = ..., expected_rows: _Optional[int] = ..., ingestor_id: _Optional[str] = ...) -> None: ...

class OHLCBatch(_message.Message):
    __slots__ = ("request_id", "page", "rows", "metadata", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    page: int
    rows: _containers.RepeatedCompositeFieldContainer[OHLC]
    metadata: HistoryRequestMetadata
    error: str
    def __init__(self, request_id: _Optional[str] = ..., page: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[OHLC, _Mapping]]] = ..., metadata: _Optional[_Union[HistoryRequestMetadata, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class Market(_message.Message):
    __slots__ = ("ticker", "exchange", "base", "quote", "tick_size", "lot_size", "min_notional", "status", "update_time_ms", "exchange_symbol", "request_id", "snapshot_size")
    TICKER_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    QUOTE_FIELD_NUMBER: _ClassVar[int]
    TICK_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOT_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_NOTIONAL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_SYMBOL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_SIZE_FIELD_NUMBER: _ClassVar[int]
    ticker: str
    exchange: str
    base: str
    quote: str
    tick_size: str
    lot_size: str
    min_notional: str
    status: MarketStatus
    update_time_ms: int
    exchange_symbol: str
    request_id: str
    snapshot_size: int
    def __init__(self, ticker: _Optional[str] = ..., exchange: _Optional[str] = ..., base: _Optional[str] = ..., quote: _Optional[str] = ..., tick_size: _Optional[str] = ..., lot_size: _Optional[str] = ..., min_notional: _Optional[str] = ..., status: _Optional[_Union[MarketStatus, str]] = ..., update_time_ms: _Optional[int] = ..., exchange_symbol: _Optional[str] = ..., request_id: _Optional[str] = ..., snapshot_size: _Optional[int] = ...) -> None: ...

class SymbolMetadataUpdated(_message.Message):
    __slots__ = ("exchange", "symbol_count", "added", "removed", "changed", "update_time_ms", "snapshot_id", "request_id", "added_tickers")
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    SYMBOL_COUNT_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ADDED_TICKERS_FIELD_NUMBER: _ClassVar[int]
    exchange: str
    symbol_count: int
    added: int
    removed: int
    changed: int
    update_time_ms: int
    snapshot_id: int
    request_id: str
    added_tickers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, exchange: _Optional[str] = ..., symbol_count: _Optional[int] = ..., added: _Optional[int] = ..., removed: _Optional[int] = ..., changed: _Optional[int] = ..., update_time_ms: _Optional[int] = ..., snapshot_id: _Optional[int] = ..., request_id: _Optional[str] = ..., added_tickers: _Optional[_Iterable[str]] = ...) -> None: ...

class Gap(_message.Message):
    __slots__ = ("gap_id", "ticker", "cause", "from_ns", "to_ns", "from_trade_id", "to_trade_id", "status", "detected_ms", "repaired_ms", "refetched", "reason", "ingestor_id")
    GAP_ID_FIELD_NUMBER: _ClassVar[int]
    TICKER_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    FROM_NS_FIELD_NUMBER: _ClassVar[int]
    TO_NS_FIELD_NUMBER: _ClassVar[int]
    FROM_TRADE_ID_FIELD_NUMBER: _ClassVar[int]
    TO_TRADE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETECTED_MS_FIELD_NUMBER: _ClassVar[int]
    REPAIRED_MS_FIELD_NUMBER: _ClassVar[int]
    REFETCHED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INGESTOR_ID_FIELD_NUMBER: _ClassVar[int]
    gap_id: str
    ticker: str
    cause: GapCause
    from_ns: int
    to_ns: int
    from_trade_id: str
    to_trade_id: str
    status: GapStatus
    detected_ms: int
    repaired_ms: int
    refetched: int
    reason: str
    ingestor_id: str
    def __init__(self, gap_id: _Optional[str] = ..., ticker: _Optional[str] = ..., cause: _Optional[_Union[GapCause, str]] = ..., from_ns: _Optional[int] = ..., to_ns: _Optional[int] = ..., from_trade_id: _Optional[str] = ..., to_trade_id: _Optional[str] = ..., status: _Optional[_Union[GapStatus, str]] = ..., detected_ms: _Optional[int] = ..., repaired_ms: _Optional[int] = ..., refetched: _Optional[int] = ..., reason: _Optional[str] = ..., ingestor_id: _Optional[str] = ...) -> None: ...

from proto import cep_pb2 as _cep_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LiveFeed(_message.Message):
    __slots__ = ("ticker", "clock_ns", "trade_ids", "trade_times_ns", "trade_time_deltas", "trade_number_deltas", "text_positions")
    TICKER_FIELD_NUMBER: _ClassVar[int]
    CLOCK_NS_FIELD_NUMBER: _ClassVar[int]
    TRADE_IDS_FIELD_NUMBER: _ClassVar[int]
    TRADE_TIMES_NS_FIELD_NUMBER: _ClassVar[int]
    TRADE_TIME_DELTAS_FIELD_NUMBER: _ClassVar[int]
    TRADE_NUMBER_DELTAS_FIELD_NUMBER: _ClassVar[int]
    TEXT_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    ticker: str
    clock_ns: int
    trade_ids: _containers.RepeatedScalarFieldContainer[str]
    trade_times_ns: _containers.RepeatedScalarFieldContainer[int]
    trade_time_deltas: _containers.RepeatedScalarFieldContainer[int]
    trade_number_deltas: _containers.RepeatedScalarFieldContainer[int]
    text_positions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ticker: _Optional[str] = ..., clock_ns: _Optional[int] = ..., trade_ids: _Optional[_Iterable[str]] = ..., trade_times_ns: _Optional[_Iterable[int]] = ..., trade_time_deltas: _Optional[_Iterable[int]] = ..., trade_number_deltas: _Optional[_Iterable[int]] = ..., text_positions: _Optional[_Iterable[int]] = ...) -> None: ...

class LiveCandle(_message.Message):
    __slots__ = ("ticker", "period_s", "open_ms", "open", "high", "low", "close", "volume", "trade_count", "first_trade_ns", "last_trade_ns", "closed", "revision")
    TICKER_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    OPEN_MS_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    VOLUME_FIELD_NUMBER: _ClassVar[int]
    TRADE_COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_TRADE_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_TRADE_NS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ticker: str
    period_s: int
    open_ms: int
    open: str
    high: str
    low: str
    close: str
    volume: str
    trade_count: int
    first_trade_ns: int
    last_trade_ns: int
    closed: bool
    revision: int
    def __init__(self, ticker: _Optional[str] = ..., period_s: _Optional[int] = ..., open_ms: _Optional[int] = ..., open: _Optional[str] = ..., high: _Optional[str] = ..., low: _Optional[str] = ..., close: _Optional[str] = ..., volume: _Optional[str] = ..., trade_count: _Optional[int] = ..., first_trade_ns: _Optional[int] = ..., last_trade_ns: _Optional[int] = ..., closed: bool = ..., revision: _Optional[int] = ...) -> None: ...

class LiveRestore(_message.Message):
    __slots__ = ("feeds", "candles", "offsets", "triggers", "registered")
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    FEEDS_FIELD_NUMBER: _ClassVar[int]
    CANDLES_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TRIGGERS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    feeds: _containers.RepeatedCompositeFieldContainer[LiveFeed]
    candles: _containers.RepeatedCompositeFieldContainer[LiveCandle]
    offsets: _containers.ScalarMap[int, int]
    triggers: _cep_pb2.CepState
    registered: _containers.RepeatedCompositeFieldContainer[_cep_pb2.CEPTriggerRequest]
    def __init__(self, feeds: _Optional[_Iterable[_Union[LiveFeed, _Mapping]]] = ..., candles: _Optional[_Iterable[_Union[LiveCandle, _Mapping]]] = ..., offsets: _Optional[_Mapping[int, int]] = ..., triggers: _Optional[_Union[_cep_pb2.CepState, _Mapping]] = ..., registered: _Optional[_Iterable[_Union[_cep_pb2.CEPTriggerRequest, _Mapping]]] = ...) -> None: ...

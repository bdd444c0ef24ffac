from proto import market_pb2 as _market_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SnapshotReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SNAPSHOT_REASON_UNSPECIFIED: _ClassVar[SnapshotReason]
    SNAPSHOT_START: _ClassVar[SnapshotReason]
    SNAPSHOT_PERIODIC: _ClassVar[SnapshotReason]
    SNAPSHOT_CHECKSUM: _ClassVar[SnapshotReason]
    SNAPSHOT_SEQUENCE: _ClassVar[SnapshotReason]
SNAPSHOT_REASON_UNSPECIFIED: SnapshotReason
SNAPSHOT_START: SnapshotReason
SNAPSHOT_PERIODIC: SnapshotReason
SNAPSHOT_CHECKSUM: SnapshotReason
SNAPSHOT_SEQUENCE: SnapshotReason

class BookLevel(_message.Message):
    __slots__ = ("price", "size")
    PRICE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    price: str
    size: str
    def __init__(self, price: _Optional[str] = ..., size: _Optional[str] = ...) -> None: ...

class BookDelta(_message.Message):
    __slots__ = ("ticker", "venue_seq", "prev_seq", "exchange_time_ns", "ingest_time_ns", "bids", "asks", "checksum", "stream")
    TICKER_FIELD_NUMBER: _ClassVar[int]
    VENUE_SEQ_FIELD_NUMBER: _ClassVar[int]
    PREV_SEQ_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    INGEST_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    BIDS_FIELD_NUMBER: _ClassVar[int]
    ASKS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ticker: str
    venue_seq: int
    prev_seq: int
    exchange_time_ns: int
    ingest_time_ns: int
    bids: _containers.RepeatedCompositeFieldContainer[BookLevel]
    asks: _containers.RepeatedCompositeFieldContainer[BookLevel]
    checksum: int
    stream: _market_pb2.StreamPosition
    def __init__(self, ticker: _Optional[str] = ..., venue_seq: _Optional[int] = ..., prev_seq: _Optional[int] = ..., exchange_time_ns: _Optional[int] = ..., ingest_time_ns: _Optional[int] = ..., bids: _Optional[_Iterable[_Union[BookLevel, _Mapping]]] = ..., asks: _Optional[_Iterable[_Union[BookLevel, _Mapping]]] = ..., checksum: _Optional[int] = ..., stream: _Optional[_Union[_market_pb2.StreamPosition, _Mapping]] = ...) -> None: ...

class BookSnapshot(_message.Message):
    __slots__ = ("ticker", "venue_seq", "exchange_time_ns", "ingest_time_ns", "bids", "asks", "reason", "stream")
    TICKER_FIELD_NUMBER: _ClassVar[int]
    VENUE_SEQ_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    INGEST_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    BIDS_FIELD_NUMBER: _ClassVar[int]
    ASKS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ticker: str
    venue_seq: int
    exchange_time_ns: int
    ingest_time_ns: int
    bids: _containers.RepeatedCompositeFieldContainer[BookLevel]
    asks: _containers.RepeatedCompositeFieldContainer[BookLevel]
    reason: SnapshotReason
    stream: _market_pb2.StreamPosition
    def __init__(self, ticker: _Optional[str] = ..., venue_seq: _Optional[int] = ..., exchange_time_ns: _Optional[int] = ..., ingest_time_ns: _Optional[int] = ..., bids: _Optional[_Iterable[_Union[BookLevel, _Mapping]]] = ..., asks: _Optional[_Iterable[_Union[BookLevel, _Mapping]]] = ..., reason: _Optional[_Union[SnapshotReason, str]] = ..., stream: _Optional[_Union[_market_pb2.StreamPosition, _Mapping]] = ...) -> None: ...

from proto import book_pb2 as _book_pb2
from proto import market_pb2 as _market_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FetchStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FETCH_STATUS_UNSPECIFIED: _ClassVar[FetchStatus]
    FETCH_OK: _ClassVar[FetchStatus]
    FETCH_OUT_OF_RANGE: _ClassVar[FetchStatus]
    FETCH_BAD_REQUEST: _ClassVar[FetchStatus]
    FETCH_UNAVAILABLE: _ClassVar[FetchStatus]
FETCH_STATUS_UNSPECIFIED: FetchStatus
FETCH_OK: FetchStatus
FETCH_OUT_OF_RANGE: FetchStatus
FETCH_BAD_REQUEST: FetchStatus
FETCH_UNAVAILABLE: FetchStatus

class FetchRequest(_message.Message):
    __slots__ = ("request_id", "topic", "after", "since_ms", "until", "cursor", "max_messages")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    topic: str
    after: _market_pb2.StreamPosition
    since_ms: int
    until: _market_pb2.StreamPosition
    cursor: int
    max_messages: int
    def __init__(self, request_id: _Optional[str] = ..., topic: _Optional[str] = ..., after: _Optional[_Union[_market_pb2.StreamPosition, _Mapping]] = ..., since_ms: _Optional[int] = ..., until: _Optional[_Union[_market_pb2.StreamPosition, _Mapping]] = ..., cursor: _Optional[int] = ..., max_messages: _Optional[int] = ...) -> None: ...

class FetchReply(_message.Message):
    __slots__ = ("request_id", "status", "error", "runs", "cursor", "done", "available_from_ms", "archive_until_ms", "passed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FROM_MS_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status: FetchStatus
    error: str
    runs: _containers.RepeatedCompositeFieldContainer[JournalBatch]
    cursor: int
    done: bool
    available_from_ms: int
    archive_until_ms: int
    passed: bool
    def __init__(self, request_id: _Optional[str] = ..., status: _Optional[_Union[FetchStatus, str]] = ..., error: _Optional[str] = ..., runs: _Optional[_Iterable[_Union[JournalBatch, _Mapping]]] = ..., cursor: _Optional[int] = ..., done: bool = ..., available_from_ms: _Optional[int] = ..., archive_until_ms: _Optional[int] = ..., passed: bool = ...) -> None: ...

class JournalBatch(_message.Message):
    __slots__ = ("topic", "first", "last", "ticks", "candles", "book_deltas", "book_snapshots")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    TICKS_FIELD_NUMBER: _ClassVar[int]
    CANDLES_FIELD_NUMBER: _ClassVar[int]
    BOOK_DELTAS_FIELD_NUMBER: _ClassVar[int]
    BOOK_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    first: _market_pb2.StreamPosition
    last: _market_pb2.StreamPosition
    ticks: _containers.RepeatedCompositeFieldContainer[_market_pb2.Tick]
    candles: _containers.RepeatedCompositeFieldContainer[_market_pb2.OHLC]
    book_deltas: _containers.RepeatedCompositeFieldContainer[_book_pb2.BookDelta]
    book_snapshots: _containers.RepeatedCompositeFieldContainer[_book_pb2.BookSnapshot]
    def __init__(self, topic: _Optional[str] = ..., first: _Optional[_Union[_market_pb2.StreamPosition, _Mapping]] = ..., last: _Optional[_Union[_market_pb2.StreamPosition, _Mapping]] = ..., ticks: _Optional[_Iterable[_Union[_market_pb2.Tick, _Mapping]]] = ..., candles: _Optional[_Iterable[_Union[_market_pb2.OHLC, _Mapping]]] = ..., book_deltas: _Optional[_Iterable[_Union[_book_pb2.BookDelta, _Mapping]]] = ..., book_snapshots: _Optional[_Iterable[_Union[_book_pb2.BookSnapshot, _Mapping]]] = ...) -> None: ...

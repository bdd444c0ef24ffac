from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataRequestKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DATA_REQUEST_KIND_UNSPECIFIED: _ClassVar[DataRequestKind]
    HISTORICAL: _ClassVar[DataRequestKind]
    REALTIME_SUBSCRIBE: _ClassVar[DataRequestKind]
    REALTIME_CANCEL: _ClassVar[DataRequestKind]
    SYMBOL_METADATA: _ClassVar[DataRequestKind]

class ControlAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTROL_ACTION_UNSPECIFIED: _ClassVar[ControlAction]
    CANCEL_REALTIME: _ClassVar[ControlAction]
    CONFIG_UPDATE: _ClassVar[ControlAction]
    HEARTBEAT: _ClassVar[ControlAction]

class IngestorState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INGESTOR_STATE_UNSPECIFIED: _ClassVar[IngestorState]
    READY: _ClassVar[IngestorState]
    AVAILABLE: _ClassVar[IngestorState]
    BUSY: _ClassVar[IngestorState]
    DONE: _ClassVar[IngestorState]

class NotifyMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NOTIFY_CLIENT: _ClassVar[NotifyMode]
    NOTIFY_REQUEST: _ClassVar[NotifyMode]

class SubmitStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBMIT_OK: _ClassVar[SubmitStatus]
    SUBMIT_REJECTED: _ClassVar[SubmitStatus]

class RejectReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECT_REASON_UNSPECIFIED: _ClassVar[RejectReason]
    BAD_TICKER: _ClassVar[RejectReason]
    BAD_PERIOD: _ClassVar[RejectReason]
    BAD_RANGE: _ClassVar[RejectReason]
    RANGE_TOO_LARGE: _ClassVar[RejectReason]
    BAD_REQUEST_ID: _ClassVar[RejectReason]
    MALFORMED: _ClassVar[RejectReason]
    UNSUPPORTED_VERSION: _ClassVar[RejectReason]
    UNEXPECTED_TYPE: _ClassVar[RejectReason]
    NO_INGESTOR: _ClassVar[RejectReason]
    UNKNOWN_SYMBOL: _ClassVar[RejectReason]
    BAD_TRIGGER_REQUEST: _ClassVar[RejectReason]
    NO_TRIGGER_DESK: _ClassVar[RejectReason]
    FORBIDDEN: _ClassVar[RejectReason]
    NO_BOOK: _ClassVar[RejectReason]

class HistoryStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HISTORY_OK: _ClassVar[HistoryStatus]
    HISTORY_ERROR: _ClassVar[HistoryStatus]
DATA_REQUEST_KIND_UNSPECIFIED: DataRequestKind
HISTORICAL: DataRequestKind
REALTIME_SUBSCRIBE: DataRequestKind
REALTIME_CANCEL: DataRequestKind
SYMBOL_METADATA: DataRequestKind
CONTROL_ACTION_UNSPECIFIED: ControlAction
CANCEL_REALTIME: ControlAction
CONFIG_UPDATE: ControlAction
HEARTBEAT: ControlAction
INGESTOR_STATE_UNSPECIFIED: IngestorState
READY: IngestorState
AVAILABLE: IngestorState
BUSY: IngestorState
DONE: IngestorState
NOTIFY_CLIENT: NotifyMode
NOTIFY_REQUEST: NotifyMode
SUBMIT_OK: SubmitStatus
SUBMIT_REJECTED: SubmitStatus
REJECT_REASON_UNSPECIFIED: RejectReason
BAD_TICKER: RejectReason
BAD_PERIOD: RejectReason
BAD_RANGE: RejectReason
RANGE_TOO_LARGE: RejectReason
BAD_REQUEST_ID: RejectReason
MALFORMED: RejectReason
UNSUPPORTED_VERSION: RejectReason
UNEXPECTED_TYPE: RejectReason
NO_INGESTOR: RejectReason
UNKNOWN_SYMBOL: RejectReason
BAD_TRIGGER_REQUEST: RejectReason
NO_TRIGGER_DESK: RejectReason
FORBIDDEN: RejectReason
NO_BOOK: RejectReason
HISTORY_OK: HistoryStatus
HISTORY_ERROR: HistoryStatus

class DataRequest(_message.Message):
    __slots__ = ("request_id", "kind", "ticker", "exchange", "period_s", "start_ms", "end_ms", "client_id", "notification_topic", "submit_time_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TICKER_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kind: DataRequestKind
    ticker: str
    exchange: str
    period_s: int
    start_ms: int
    end_ms: int
    client_id: str
    notification_topic: str
    submit_time_ms: int
    def __init__(self, request_id: _Optional[str] = ..., kind: _Optional[_Union[DataRequestKind, str]] = ..., ticker: _Optional[str] = ..., exchange: _Optional[str] = ..., period_s: _Optional[int] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., client_id: _Optional[str] = ..., notification_topic: _Optional[str] = ..., submit_time_ms: _Optional[int] = ...) -> None: ...

class IngestorControl(_message.Message):
    __slots__ = ("action", "ticker", "request_id", "config", "exchange", "ingestor_id", "state", "working", "done", "time_ms", "interval_ms", "tails")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TICKER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    INGESTOR_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WORKING_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    TAILS_FIELD_NUMBER: _ClassVar[int]
    action: ControlAction
    ticker: str
    request_id: str
    config: _containers.ScalarMap[str, str]
    exchange: str
    ingestor_id: str
    state: IngestorState
    working: _containers.RepeatedScalarFieldContainer[str]
    done: _containers.RepeatedScalarFieldContainer[str]
    time_ms: int
    interval_ms: int
    tails: _containers.RepeatedCompositeFieldContainer[StreamTail]
    def __init__(self, action: _Optional[_Union[ControlAction, str]] = ..., ticker: _Optional[str] = ..., request_id: _Optional[str] = ..., config: _Optional[_Mapping[str, str]] = ..., exchange: _Optional[str] = ..., ingestor_id: _Optional[str] = ..., state: _Optional[_Union[IngestorState, str]] = ..., working: _Optional[_Iterable[str]] = ..., done: _Optional[_Iterable[str]] = ..., time_ms: _Optional[int] = ..., interval_ms: _Optional[int] = ..., tails: _Optional[_Iterable[_Union[StreamTail, _Mapping]]] = ...) -> None: ...

class StreamTail(_message.Message):
    __slots__ = ("ticker", "trade_id", "time_ns")
    TICKER_FIELD_NUMBER: _ClassVar[int]
    TRADE_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    ticker: str
    trade_id: str
    time_ns: int
    def __init__(self, ticker: _Optional[str] = ..., trade_id: _Optional[str] = ..., time_ns: _Optional[int] = ...) -> None: ...

class SubmitHistoricalRequest(_message.Message):
    __slots__ = ("request_id", "client_id", "ticker", "period_s", "start_ms", "end_ms", "notify")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TICKER_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    client_id: str
    ticker: str
    period_s: int
    start_ms: int
    end_ms: int
    notify: NotifyMode
    def __init__(self, request_id: _Optional[str] = ..., client_id: _Optional[str] = ..., ticker: _Optional[str] = ..., period_s: _Optional[int] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., notify: _Optional[_Union[NotifyMode, str]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("request_id", "status", "notification_topic", "reason", "error_message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_TOPIC_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status: SubmitStatus
    notification_topic: str
    reason: RejectReason
    error_message: str
    def __init__(self, request_id: _Optional[str] = ..., status: _Optional[_Union[SubmitStatus, str]] = ..., notification_topic: _Optional[str] = ..., reason: _Optional[_Union[RejectReason, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class HistoryReadyNotification(_message.Message):
    __slots__ = ("request_id", "status", "row_count", "iceberg_table", "ticker", "period_s", "start_ms", "end_ms", "error_message", "snapshot_id", "completed_time_ms", "client_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROW_COUNT_FIELD_NUMBER: _ClassVar[int]
    ICEBERG_TABLE_FIELD_NUMBER: _ClassVar[int]
    TICKER_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status: HistoryStatus
    row_count: int
    iceberg_table: str
    ticker: str
    period_s: int
    start_ms: int
    end_ms: int
    error_message: str
    snapshot_id: int
    completed_time_ms: int
    client_id: str
    def __init__(self, request_id: _Optional[str] = ..., status: _Optional[_Union[HistoryStatus, str]] = ..., row_count: _Optional[int] = ..., iceberg_table: _Optional[str] = ..., ticker: _Optional[str] = ..., period_s: _Optional[int] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., error_message: _Optional[str] = ..., snapshot_id: _Optional[int] = ..., completed_time_ms: _Optional[int] = ..., client_id: _Optional[str] = ...) -> None: ...

class SubscriptionError(_message.Message):
    __slots__ = ("ticker", "reason", "error_message", "source", "time_ms")
    TICKER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ticker: str
    reason: RejectReason
    error_message: str
    source: str
    time_ms: int
    def __init__(self, ticker: _Optional[str] = ..., reason: _Optional[_Union[RejectReason, str]] = ..., error_message: _Optional[str] = ..., source: _Optional[str] = ..., time_ms: _Optional[int] = ...) -> None: ...

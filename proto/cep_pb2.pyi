from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Comparison(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPARISON_UNSPECIFIED: _ClassVar[Comparison]
    CROSSES_ABOVE: _ClassVar[Comparison]
    CROSSES_BELOW: _ClassVar[Comparison]
    GREATER_THAN: _ClassVar[Comparison]
    LESS_THAN: _ClassVar[Comparison]

class TriggerField(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRIGGER_FIELD_UNSPECIFIED: _ClassVar[TriggerField]
    LAST_PRICE: _ClassVar[TriggerField]
    CANDLE_CLOSE: _ClassVar[TriggerField]
    CANDLE_VOLUME: _ClassVar[TriggerField]
COMPARISON_UNSPECIFIED: Comparison
CROSSES_ABOVE: Comparison
CROSSES_BELOW: Comparison
GREATER_THAN: Comparison
LESS_THAN: Comparison
TRIGGER_FIELD_UNSPECIFIED: TriggerField
LAST_PRICE: TriggerField
CANDLE_CLOSE: TriggerField
CANDLE_VOLUME: TriggerField

class CEPTriggerRequest(_message.Message):
    __slots__ = ("trigger_id", "client_id", "ticker", "field", "period_s", "comparison", "threshold", "once", "notification_topic")
    TRIGGER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TICKER_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    COMPARISON_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    ONCE_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_TOPIC_FIELD_NUMBER: _ClassVar[int]
    trigger_id: str
    client_id: str
    ticker: str
    field: TriggerField
    period_s: int
    comparison: Comparison
    threshold: str
    once: bool
    notification_topic: str
    def __init__(self, trigger_id: _Optional[str] = ..., client_id: _Optional[str] = ..., ticker: _Optional[str] = ..., field: _Optional[_Union[TriggerField, str]] = ..., period_s: _Optional[int] = ..., comparison: _Optional[_Union[Comparison, str]] = ..., threshold: _Optional[str] = ..., once: bool = ..., notification_topic: _Optional[str] = ...) -> None: ...

class CEPTriggerAck(_message.Message):
    __slots__ = ("trigger_id", "accepted", "error_message")
    TRIGGER_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    trigger_id: str
    accepted: bool
    error_message: str
    def __init__(self, trigger_id: _Optional[str] = ..., accepted: bool = ..., error_message: _Optional[str] = ...) -> None: ...

class CEPTriggerEvent(_message.Message):
    __slots__ = ("trigger_id", "ticker", "value", "fired_time_ms", "event_time_ms")
    TRIGGER_ID_FIELD_NUMBER: _ClassVar[int]
    TICKER_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FIRED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    trigger_id: str
    ticker: str
    value: str
    fired_time_ms: int
    event_time_ms: int
    def __init__(self, trigger_id: _Optional[str] = ..., ticker: _Optional[str] = ..., value: _Optional[str] = ..., fired_time_ms: _Optional[int] = ..., event_time_ms: _Optional[int] = ...) -> None: ...

from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Direction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIRECTION_UNSPECIFIED: _ClassVar[Direction]
    UP: _ClassVar[Direction]
    DOWN: _ClassVar[Direction]
    EITHER: _ClassVar[Direction]

class TriggerAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRIGGER_ACTION_UNSPECIFIED: _ClassVar[TriggerAction]
    ADD: _ClassVar[TriggerAction]
    REMOVE: _ClassVar[TriggerAction]
    LIST: _ClassVar[TriggerAction]

class TriggerRejectReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRIGGER_REJECT_REASON_UNSPECIFIED: _ClassVar[TriggerRejectReason]
    BAD_TRIGGER: _ClassVar[TriggerRejectReason]
    UNKNOWN_TICKER: _ClassVar[TriggerRejectReason]
    OVER_LIMIT: _ClassVar[TriggerRejectReason]
    NO_SUCH_TRIGGER: _ClassVar[TriggerRejectReason]
    DUPLICATE_TRIGGER: _ClassVar[TriggerRejectReason]
DIRECTION_UNSPECIFIED: Direction
UP: Direction
DOWN: Direction
EITHER: Direction
TRIGGER_ACTION_UNSPECIFIED: TriggerAction
ADD: TriggerAction
REMOVE: TriggerAction
LIST: TriggerAction
TRIGGER_REJECT_REASON_UNSPECIFIED: TriggerRejectReason
BAD_TRIGGER: TriggerRejectReason
UNKNOWN_TICKER: TriggerRejectReason
OVER_LIMIT: TriggerRejectReason
NO_SUCH_TRIGGER: TriggerRejectReason
DUPLICATE_TRIGGER: TriggerRejectReason

class PriceCross(_message.Message):
    __slots__ = ("level", "direction")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    level: str
    direction: Direction
    def __init__(self, level: _Optional[str] = ..., direction: _Optional[_Union[Direction, str]] = ...) -> None: ...

class PercentMove(_message.Message):
    __slots__ = ("percent", "window_s", "direction")
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    percent: str
    window_s: int
    direction: Direction
    def __init__(self, percent: _Optional[str] = ..., window_s: _Optional[int] = ..., direction: _Optional[_Union[Direction, str]] = ...) -> None: ...

class WindowVolume(_message.Message):
    __slots__ = ("volume", "window_s")
    VOLUME_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    volume: str
    window_s: int
    def __init__(self, volume: _Optional[str] = ..., window_s: _Optional[int] = ...) -> None: ...

class CandleClose(_message.Message):
    __slots__ = ("period_s", "level", "direction")
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    period_s: int
    level: str
    direction: Direction
    def __init__(self, period_s: _Optional[int] = ..., level: _Optional[str] = ..., direction: _Optional[_Union[Direction, str]] = ...) -> None: ...

class RangeBreakout(_message.Message):
    __slots__ = ("period_s", "candles", "direction")
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    CANDLES_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    period_s: int
    candles: int
    direction: Direction
    def __init__(self, period_s: _Optional[int] = ..., candles: _Optional[int] = ..., direction: _Optional[_Union[Direction, str]] = ...) -> None: ...

class CEPTriggerRequest(_message.Message):
    __slots__ = ("trigger_id", "client_id", "ticker", "once", "notification_topic", "user_id", "action", "price_cross", "percent_move", "window_volume", "candle_close", "range_breakout", "cooldown_s", "critical", "request_id", "registered_ms")
    TRIGGER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TICKER_FIELD_NUMBER: _ClassVar[int]
    ONCE_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_TOPIC_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PRICE_CROSS_FIELD_NUMBER: _ClassVar[int]
    PERCENT_MOVE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_VOLUME_FIELD_NUMBER: _ClassVar[int]
    CANDLE_CLOSE_FIELD_NUMBER: _ClassVar[int]
    RANGE_BREAKOUT_FIELD_NUMBER: _ClassVar[int]
    COOLDOWN_S_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_MS_FIELD_NUMBER: _ClassVar[int]
    trigger_id: str
    client_id: str
    ticker: str
    once: bool
    notification_topic: str
    user_id: str
    action: TriggerAction
    price_cross: PriceCross
    percent_move: PercentMove
    window_volume: WindowVolume
    candle_close: CandleClose
    range_breakout: RangeBreakout
    cooldown_s: int
    critical: bool
    request_id: str
    registered_ms: int
    def __init__(self, trigger_id: _Optional[str] = ..., client_id: _Optional[str] = ..., ticker: _Optional[str] = ..., once: bool = ..., notification_topic: _Optional[str] = ..., user_id: _Optional[str] = ..., action: _Optional[_Union[TriggerAction, str]] = ..., price_cross: _Optional[_Union[PriceCross, _Mapping]] = ..., percent_move: _Optional[_Union[PercentMove, _Mapping]] = ..., window_volume: _Optional[_Union[WindowVolume, _Mapping]] = ..., candle_close: _Optional[_Union[CandleClose, _Mapping]] = ..., range_breakout: _Optional[_Union[RangeBreakout, _Mapping]] = ..., cooldown_s: _Optional[int] = ..., critical: bool = ..., request_id: _Optional[str] = ..., registered_ms: _Optional[int] = ...) -> None: ...

class CEPTriggerAck(_message.Message):
    __slots__ = ("trigger_id", "accepted", "error_message", "reason", "request_id", "triggers")
    TRIGGER_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRIGGERS_FIELD_NUMBER: _ClassVar[int]
    trigger_id: str
    accepted: bool
    error_message: str
    reason: TriggerRejectReason
    request_id: str
    triggers: _containers.RepeatedCompositeFieldContainer[CEPTriggerRequest]
    def __init__(self, trigger_id: _Optional[str] = ..., accepted: bool = ..., error_message: _Optional[str] = ..., reason: _Optional[_Union[TriggerRejectReason, str]] = ..., request_id: _Optional[str] = ..., triggers: _Optional[_Iterable[_Union[CEPTriggerRequest, _Mapping]]] = ...) -> None: ...

class CEPTriggerEvent(_message.Message):
    __slots__ = ("trigger_id", "ticker", "value", "fired_time_ms", "event_time_ms", "firing", "reference", "client_id", "user_id", "registered_ms", "evaluator_started_ms")
    TRIGGER_ID_FIELD_NUMBER: _ClassVar[int]
    TICKER_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FIRED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    FIRING_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_MS_FIELD_NUMBER: _ClassVar[int]
    EVALUATOR_STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    trigger_id: str
    ticker: str
    value: str
    fired_time_ms: int
    event_time_ms: int
    firing: int
    reference: str
    client_id: str
    user_id: str
    registered_ms: int
    evaluator_started_ms: int
    def __init__(self, trigger_id: _Optional[str] = ..., ticker: _Optional[str] = ..., value: _Optional[str] = ..., fired_time_ms: _Optional[int] = ..., event_time_ms: _Optional[int] = ..., firing: _Optional[int] = ..., reference: _Optional[str] = ..., client_id: _Optional[str] = ..., user_id: _Optional[str] = ..., registered_ms: _Optional[int] = ..., evaluator_started_ms: _Optional[int] = ...) -> None: ...

class CepTrade(_message.Message):
    __slots__ = ("time_ns", "seq", "price", "size")
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    time_ns: int
    seq: int
    price: str
    size: str
    def __init__(self, time_ns: _Optional[int] = ..., seq: _Optional[int] = ..., price: _Optional[str] = ..., size: _Optional[str] = ...) -> None: ...

class CepCandle(_message.Message):
    __slots__ = ("period_s", "open_ms", "high", "low", "close", "last_ns")
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    OPEN_MS_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    LAST_NS_FIELD_NUMBER: _ClassVar[int]
    period_s: int
    open_ms: int
    high: str
    low: str
    close: str
    last_ns: int
    def __init__(self, period_s: _Optional[int] = ..., open_ms: _Optional[int] = ..., high: _Optional[str] = ..., low: _Optional[str] = ..., close: _Optional[str] = ..., last_ns: _Optional[int] = ...) -> None: ...

class CepArmed(_message.Message):
    __slots__ = ("trigger", "since", "fired", "next_ns", "from_ns")
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    NEXT_NS_FIELD_NUMBER: _ClassVar[int]
    FROM_NS_FIELD_NUMBER: _ClassVar[int]
    trigger: CEPTriggerRequest
    since: int
    fired: int
    next_ns: int
    from_ns: int
    def __init__(self, trigger: _Optional[_Union[CEPTriggerRequest, _Mapping]] = ..., since: _Optional[int] = ..., fired: _Optional[int] = ..., next_ns: _Optional[int] = ..., from_ns: _Optional[int] = ...) -> None: ...

class CepFeed(_message.Message):
    __slots__ = ("ticker", "clock_ns", "seq", "last_price", "armed", "window", "periods", "forming", "closed", "judged_clock_ns", "trade_ids", "trade_times_ns")
    TICKER_FIELD_NUMBER: _ClassVar[int]
    CLOCK_NS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_PRICE_FIELD_NUMBER: _ClassVar[int]
    ARMED_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    PERIODS_FIELD_NUMBER: _ClassVar[int]
    FORMING_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    JUDGED_CLOCK_NS_FIELD_NUMBER: _ClassVar[int]
    TRADE_IDS_FIELD_NUMBER: _ClassVar[int]
    TRADE_TIMES_NS_FIELD_NUMBER: _ClassVar[int]
    ticker: str
    clock_ns: int
    seq: int
    last_price: str
    armed: _containers.RepeatedCompositeFieldContainer[CepArmed]
    window: _containers.RepeatedCompositeFieldContainer[CepTrade]
    periods: _containers.RepeatedScalarFieldContainer[int]
    forming: _containers.RepeatedCompositeFieldContainer[CepCandle]
    closed: _containers.RepeatedCompositeFieldContainer[CepCandle]
    judged_clock_ns: int
    trade_ids: _containers.RepeatedScalarFieldContainer[str]
    trade_times_ns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ticker: _Optional[str] = ..., clock_ns: _Optional[int] = ..., seq: _Optional[int] = ..., last_price: _Optional[str] = ..., armed: _Optional[_Iterable[_Union[CepArmed, _Mapping]]] = ..., window: _Optional[_Iterable[_Union[CepTrade, _Mapping]]] = ..., periods: _Optional[_Iterable[int]] = ..., forming: _Optional[_Iterable[_Union[CepCandle, _Mapping]]] = ..., closed: _Optional[_Iterable[_Union[CepCandle, _Mapping]]] = ..., judged_clock_ns: _Optional[int] = ..., trade_ids: _Optional[_Iterable[str]] = ..., trade_times_ns: _Optional[_Iterable[int]] = ...) -> None: ...

class CepState(_message.Message):
    __slots__ = ("feeds", "offsets", "started_ms")
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    FEEDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    feeds: _containers.RepeatedCompositeFieldContainer[CepFeed]
    offsets: _containers.ScalarMap[int, int]
    started_ms: int
    def __init__(self, feeds: _Optional[_Iterable[_Union[CepFeed, _Mapping]]] = ..., offsets: _Optional[_Mapping[int, int]] = ..., started_ms: _Optional[int] = ...) -> None: ...

class CepFiring(_message.Message):
    __slots__ = ("trigger", "event")
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    trigger: CEPTriggerRequest
    event: CEPTriggerEvent
    def __init__(self, trigger: _Optional[_Union[CEPTriggerRequest, _Mapping]] = ..., event: _Optional[_Union[CEPTriggerEvent, _Mapping]] = ...) -> None: ...

class CepFirings(_message.Message):
    __slots__ = ("firings",)
    FIRINGS_FIELD_NUMBER: _ClassVar[int]
    firings: _containers.RepeatedCompositeFieldContainer[CepFiring]
    def __init__(self, firings: _Optional[_Iterable[_Union[CepFiring, _Mapping]]] = ...) -> None: ...

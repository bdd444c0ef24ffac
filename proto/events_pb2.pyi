from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ORDER_PLACED: _ClassVar[EventType]
    ORDER_FILLED: _ClassVar[EventType]
    ORDER_CANCELLED: _ClassVar[EventType]
    ALERT_TRIGGERED: _ClassVar[EventType]
    POSITION_UPDATED: _ClassVar[EventType]
    WORKSPACE_CHANGED: _ClassVar[EventType]
    STRATEGY_LOG: _ClassVar[EventType]

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INFORMATIONAL: _ClassVar[Priority]
    NORMAL: _ClassVar[Priority]
    CRITICAL: _ClassVar[Priority]

class ChannelType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTIVE_SESSION: _ClassVar[ChannelType]
    WEB: _ClassVar[ChannelType]
    TELEGRAM: _ClassVar[ChannelType]
    EMAIL: _ClassVar[ChannelType]
    PUSH: _ClassVar[ChannelType]

class AckStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERED: _ClassVar[AckStatus]
    QUEUED: _ClassVar[AckStatus]
    ERROR: _ClassVar[AckStatus]
ORDER_PLACED: EventType
ORDER_FILLED: EventType
ORDER_CANCELLED: EventType
ALERT_TRIGGERED: EventType
POSITION_UPDATED: EventType
WORKSPACE_CHANGED: EventType
STRATEGY_LOG: EventType
INFORMATIONAL: Priority
NORMAL: Priority
CRITICAL: Priority
ACTIVE_SESSION: ChannelType
WEB: ChannelType
TELEGRAM: ChannelType
EMAIL: ChannelType
PUSH: ChannelType
DELIVERED: AckStatus
QUEUED: AckStatus
ERROR: AckStatus

class ChannelPreference(_message.Message):
    __slots__ = ("channel", "only_if_active")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    ONLY_IF_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    channel: ChannelType
    only_if_active: bool
    def __init__(self, channel: _Optional[_Union[ChannelType, str]] = ..., only_if_active: bool = ...) -> None: ...

class DeliverySpec(_message.Message):
    __slots__ = ("priority", "channels")
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    priority: Priority
    channels: _containers.RepeatedCompositeFieldContainer[ChannelPreference]
    def __init__(self, priority: _Optional[_Union[Priority, str]] = ..., channels: _Optional[_Iterable[_Union[ChannelPreference, _Mapping]]] = ...) -> None: ...

class UserEvent(_message.Message):
    __slots__ = ("user_id", "event_id", "timestamp", "event_type", "payload", "delivery")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    event_id: str
    timestamp: int
    event_type: EventType
    payload: bytes
    delivery: DeliverySpec
    def __init__(self, user_id: _Optional[str] = ..., event_id: _Optional[str] = ..., timestamp: _Optional[int] = ..., event_type: _Optional[_Union[EventType, str]] = ..., payload: _Optional[bytes] = ..., delivery: _Optional[_Union[DeliverySpec, _Mapping]] = ...) -> None: ...

class EventAck(_message.Message):
    __slots__ = ("event_id", "status", "error_message")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    status: AckStatus
    error_message: str
    def __init__(self, event_id: _Optional[str] = ..., status: _Optional[_Union[AckStatus, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

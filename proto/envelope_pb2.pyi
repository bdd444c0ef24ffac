from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class MessageType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_TYPE_UNSPECIFIED: _ClassVar[MessageType]
    DATA_REQUEST: _ClassVar[MessageType]
    INGESTOR_CONTROL: _ClassVar[MessageType]
    TICK: _ClassVar[MessageType]
    OHLC_CANDLE: _ClassVar[MessageType]
    MARKET: _ClassVar[MessageType]
    CEP_TRIGGER_REQUEST: _ClassVar[MessageType]
    CEP_TRIGGER_ACK: _ClassVar[MessageType]
    CEP_TRIGGER_EVENT: _ClassVar[MessageType]
    OHLC_BATCH: _ClassVar[MessageType]
    SUBMIT_HISTORICAL_REQUEST: _ClassVar[MessageType]
    SUBMIT_RESPONSE: _ClassVar[MessageType]
    HISTORY_READY_NOTIFICATION: _ClassVar[MessageType]
    SYMBOL_METADATA_UPDATED: _ClassVar[MessageType]
    SUBSCRIPTION_ERROR: _ClassVar[MessageType]
    FEED_IDLE: _ClassVar[MessageType]
    STREAM_HEAD: _ClassVar[MessageType]
    FETCH_REQUEST: _ClassVar[MessageType]
    FETCH_REPLY: _ClassVar[MessageType]
    JOURNAL_BATCH: _ClassVar[MessageType]
    GAP: _ClassVar[MessageType]
    BOOK_DELTA: _ClassVar[MessageType]
    BOOK_SNAPSHOT: _ClassVar[MessageType]
    USER_EVENT: _ClassVar[MessageType]
    EVENT_ACK: _ClassVar[MessageType]
MESSAGE_TYPE_UNSPECIFIED: MessageType
DATA_REQUEST: MessageType
INGESTOR_CONTROL: MessageType
TICK: MessageType
OHLC_CANDLE: MessageType
MARKET: MessageType
CEP_TRIGGER_REQUEST: MessageType
CEP_TRIGGER_ACK: MessageType
CEP_TRIGGER_EVENT: MessageType
OHLC_BATCH: MessageType
SUBMIT_HISTORICAL_REQUEST: MessageType
SUBMIT_RESPONSE: MessageType
HISTORY_READY_NOTIFICATION: MessageType
SYMBOL_METADATA_UPDATED: MessageType
SUBSCRIPTION_ERROR: MessageType
FEED_IDLE: MessageType
STREAM_HEAD: MessageType
FETCH_REQUEST: MessageType
FETCH_REPLY: MessageType
JOURNAL_BATCH: MessageType
GAP: MessageType
BOOK_DELTA: MessageType
BOOK_SNAPSHOT: MessageType
USER_EVENT: MessageType
EVENT_ACK: MessageType

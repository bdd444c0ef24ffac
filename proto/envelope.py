"""The wire envelope: ``[version byte]``, ``[type byte + protobuf]``.

One table, ``MESSAGE_CLASSES``, maps the type byte to its message class; encoding and
decoding read nothing else. Every way a message can be wrong raises one specific subclass
of :class:`EnvelopeError`, so services can count drops by reason and never crash on input.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, TypeVar

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from proto import book_pb2, cep_pb2, envelope_pb2, events_pb2, journal_pb2, market_pb2, requests_pb2

if TYPE_CHECKING:
    from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

PROTOCOL_VERSION = 1
VERSION_FRAME = bytes([PROTOCOL_VERSION])

# Field limits every decoder applies: no id, ticker, topic or reason comes near them, so a
# field past one is hostile or broken, and one such field could otherwise flow on into
# Kafka, Iceberg and every subscriber. streaming.decode's JVM twin (DecodeTick) has the
# string limit too.
MAX_STRING_BYTES = 4096
MAX_BYTES_FIELD = 64 << 10  # a UserEvent's payload
MAX_REPEATED = 100_000

T = envelope_pb2.MessageType
MESSAGE_CLASSES: dict[int, type[Message]] = {
    T.DATA_REQUEST: requests_pb2.DataRequest,
    T.INGESTOR_CONTROL: requests_pb2.IngestorControl,
    T.TICK: market_pb2.Tick,
    T.OHLC_CANDLE: market_pb2.OHLC,
    T.MARKET: market_pb2.Market,
    T.CEP_TRIGGER_REQUEST: cep_pb2.CEPTriggerRequest,
    T.CEP_TRIGGER_ACK: cep_pb2.CEPTriggerAck,
    T.CEP_TRIGGER_EVENT: cep_pb2.CEPTriggerEvent,
    T.OHLC_BATCH: market_pb2.OHLCBatch,
    T.SUBMIT_HISTORICAL_REQUEST: requests_pb2.SubmitHistoricalRequest,
    T.SUBMIT_RESPONSE: requests_pb2.SubmitResponse,
    T.HISTORY_READY_NOTIFICATION: requests_pb2.HistoryReadyNotification,
    T.SYMBOL_METADATA_UPDATED: market_pb2.SymbolMetadataUpdated,
    T.SUBSCRIPTION_ERROR: requests_pb2.SubscriptionError,
    T.FEED_IDLE: market_pb2.FeedIdle,
    T.STREAM_HEAD: market_pb2.StreamHead,
    T.FETCH_REQUEST: journal_pb2.FetchRequest,
    T.FETCH_REPLY: journal_pb2.FetchReply,
    T.JOURNAL_BATCH: journal_pb2.JournalBatch,
    T.USER_EVENT: events_pb2.UserEvent,
    T.EVENT_ACK: events_pb2.EventAck,
    T.GAP: market_pb2.Gap,
    T.BOOK_DELTA: book_pb2.BookDelta,
    T.BOOK_SNAPSHOT: book_pb2.BookSnapshot,
}
TYPE_IDS: dict[type[Message], int] = {cls: type_id for type_id, cls in MESSAGE_CLASSES.items()}
# A Kafka record's first two bytes per type (version, type id): one lookup per record.
_RECORD_HEADS: dict[type[Message], bytes] = {
    cls: bytes([PROTOCOL_VERSION, type_id]) for cls, type_id in TYPE_IDS.items()
}
# A body frame's first byte per type, made once (``bytes([n])`` an encode is a fifth of a
# small message's encoding).
_BODY_HEADS: dict[type[Message], bytes] = {cls: bytes([n]) for cls, n in TYPE_IDS.items()}

M = TypeVar("M", bound=Message)


class EnvelopeError(ValueError):
    """Base of every decoding failure; ``reason`` is a short label for metrics."""

    reason = "malformed"


class UnsupportedVersion(EnvelopeError):
    reason = "unsupported_version"


class UnknownMessageType(EnvelopeError):
    reason = "unknown_type"


class MissingFrame(EnvelopeError):
    reason = "missing_frame"


class UnexpectedFrames(EnvelopeError):
    reason = "unexpected_frames"


class MalformedPayload(EnvelopeError):
    reason = "malformed_payload"


class OversizedField(EnvelopeError):
    reason = "oversized_field"


class UnexpectedMessage(EnvelopeError):
    """A valid message of a type this receiver does not accept here."""

    reason = "unexpected_message"


def type_id(msg: Message) -> int:
    try:
        return TYPE_IDS[type(msg)]
    except KeyError:
        raise _unknown(type(msg)) from None


def _unknown(cls: type[Message]) -> UnknownMessageType:
    """The error for a message type without an envelope type id, whichever table missed it."""
    return UnknownMessageType(f"{cls.__name__} has no envelope type id")


def encode(msg: Message) -> list[bytes]:
    """The two logical frames."""
    return [VERSION_FRAME, _body_of(msg)]


def encode_topic(topic: str, msg: Message) -> list[bytes]:
    """PUB frames: topic, then the envelope."""
    return [topic.encode(), VERSION_FRAME, _body_of(msg)]


def _body_of(msg: Message) -> bytes:
    """The body frame: the type byte, then the message."""
    head = _BODY_HEADS.get(type(msg))
    if head is None:
        raise _unknown(type(msg))
    return head + msg.SerializeToString()


def decode(frames: Sequence[bytes]) -> Message:
    """Decode exactly the two envelope frames."""
    return decode_body(_body(frames))


def _body(frames: Sequence[bytes]) -> bytes:
    """The body of exactly two envelope frames, its version checked."""
    if len(frames) < 2:
        raise MissingFrame(f"expected 2 envelope frames, got {len(frames)}")
    if len(frames) > 2:
        raise UnexpectedFrames(f"expected 2 envelope frames, got {len(frames)}")
    version, body = bytes(frames[0]), bytes(frames[1])
    _check_version(version)
    return body


def _check_version(version: bytes) -> None:
    if version != VERSION_FRAME:
        raise UnsupportedVersion(f"protocol version frame {version[:8].hex() or '(empty)'}")


def unchecked_payload(frames: Sequence[bytes], cls: type[Message]) -> bytes:
    """The payload of two envelope frames that hold a ``cls``, with frames, version and type
    checked as :func:`decode` checks them but no field held to its limit yet: for a glance at
    a few small fields (a FetchReply's cursor, before its runs are read) ahead of
    :func:`payload_of` or :func:`decode`, which check the rest."""
    body = _body(frames)
    got = _class_of(body)
    if got is not cls:
        raise UnexpectedMessage(f"expected {cls.__name__}, got {got.__name__}")
    return body[1:]


def payload_of(frames: Sequence[bytes], cls: type[Message], depth: int = 0) -> bytes:
    """The payload of two envelope frames that hold a ``cls``, for a reader that parses it
    its own way (the Arrow replay reads a FetchReply's ticks as columns, #35). Frames,
    version and type are checked as :func:`decode` checks them, and the fields of the
    message and of its sub-messages ``depth`` levels down are held to their limits; deeper
    fields are the caller's to check, or to leave to :func:`decode_body`."""
    payload = unchecked_payload(frames, cls)
    if len(payload) > _SMALL:
        try:
            _check_sizes(_LIMITS[cls.DESCRIPTOR.full_name], [payload], cls.__name__, depth)
        except (DecodeError, RuntimeWarning) as exc:
            raise MalformedPayload(f"{cls.__name__}: {exc}") from None
    return payload


def fitted(text: str, limit: int = MAX_STRING_BYTES) -> str:
    """``text`` cut to what a string field may hold (``limit`` UTF-8 bytes, never inside a
    character, "…" at the cut): an error's text (a venue's whole HTML page, say) must not
    make the message carrying it one every receiver refuses."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "…"


def check_sizes(msg: Message, max_bytes: int | None = None) -> None:
    """Raise OversizedField when ``msg`` holds a field past what :func:`decode` accepts, or
    is over ``max_bytes`` whole: for a sender, which must not send what every receiver
    refuses (a journalled one would send it again for ever)."""
    payload = msg.SerializeToString()
    name = type(msg).__name__
    if max_bytes is not None and len(payload) > max_bytes:
        raise OversizedField(f"{name}: {len(payload)} bytes, at most {max_bytes}")
    if len(payload) > _SMALL:
        _check_sizes(_LIMITS[msg.DESCRIPTOR.full_name], [payload], name)


def checked_payload(frames: Sequence[bytes], cls: type[Message]) -> tuple[bytes, Message]:
    """:func:`payload_of` with ``depth`` 1, and the parse that checked it: ``cls``'s fields
    that have a limit, each repeated sub-message as its own such fields (for a FetchReply,
    each run's ticks as bytes: how many there are, read without another parse, #35)."""
    payload = unchecked_payload(frames, cls)
    name = cls.DESCRIPTOR.full_name
    try:
        shadow = _nested_shadow(name).FromString(payload)
        _check_shadows(_LIMITS[name], [shadow], cls.__name__, 1)
    except (DecodeError, RuntimeWarning) as exc:
        raise MalformedPayload(f"{cls.__name__}: {exc}") from None
    return payload, shadow


def _class_of(body: bytes) -> type[Message]:
    """The message class a body's type byte names."""
    if not body:
        raise MissingFrame("message frame is empty: no type byte")
    cls = MESSAGE_CLASSES.get(body[0])
    if cls is None:
        raise UnknownMessageType(f"message type 0x{body[0]:02x}")
    return cls


def decode_body(body: bytes) -> Message:
    return _decode_payload(_class_of(body), body[1:])


def _decode_payload(cls: type[M], payload: bytes) -> M:
    """A ``cls`` parsed from its payload, every field held to its limit."""
    msg = cls()
    try:
        msg.ParseFromString(payload)
    except (DecodeError, RuntimeWarning) as exc:
        raise MalformedPayload(f"{cls.__name__}: {exc}") from None
    if len(payload) > _SMALL:
        _check_sizes(_LIMITS[cls.DESCRIPTOR.full_name], [payload], cls.__name__)
    return msg


# No field of a message this small can be past a limit: a string or bytes field is shorter
# than the bytes that carry it, and a repeated field takes at least a byte an item.
_SMALL = min(MAX_STRING_BYTES, MAX_BYTES_FIELD, MAX_REPEATED)
SUB_PAYLOAD_MAX = _SMALL  # the largest payload :func:`sub_payloads` passes


@dataclass(frozen=True)
class _Limits:
    """The limits of one message type, checked on its wire bytes (#35). ``shadow`` parses
    them in C with every string and sub-message field as bytes, so a sub-message of at most
    ``_SMALL`` bytes (every tick of a FETCH chunk) is passed over by its length alone, and
    only the few bigger ones are looked into: the cost no longer grows in Python with the
    number of messages."""

    shadow: type[Message]
    counted: tuple[str, ...]  # repeated and map fields
    sized: tuple[tuple[str, int, bool], ...]  # string and bytes fields: limit, is repeated
    nested: tuple[tuple[str, str, bool], ...]  # message fields: type, occurrences merge


_SIZE_LIMITS = {
    FieldDescriptor.TYPE_STRING: MAX_STRING_BYTES,
    FieldDescriptor.TYPE_BYTES: MAX_BYTES_FIELD,
}


def _size_limits(roots: Iterable[type[Message]]) -> dict[str, _Limits]:
    """``_Limits`` of every message type ``roots`` can hold, by full name."""
    descriptors: dict[str, Descriptor] = {}
    todo = [cls.DESCRIPTOR for cls in roots]
    while todo:
        desc = todo.pop()
        if desc.full_name not in descriptors:
            descriptors[desc.full_name] = desc
            todo.extend(f.message_type for f in desc.fields if f.message_type is not None)
    file = descriptor_pb2.FileDescriptorProto(name="size_limits.proto", syntax="proto3")
    file.message_type.extend(map(_shadow_shape, descriptors.values()))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: _Limits(
            shadow=message_factory.GetMessageClass(
                pool.FindMessageTypeByName(name.replace(".", "_"))
            ),
            counted=tuple(f.name for f in desc.fields if f.is_repeated),
            sized=tuple(
                (f.name, _SIZE_LIMITS[f.type], f.is_repeated)
                for f in desc.fields
                if f.type in _SIZE_LIMITS
            ),
            nested=tuple(
                (f.name, f.message_type.full_name, not f.is_repeated)
                for f in desc.fields
                if f.message_type is not None
            ),
        )
        for name, desc in descriptors.items()
    }


def _shadow_shape(desc: Descriptor) -> descriptor_pb2.DescriptorProto:
    """``desc`` with strings as bytes (their length in UTF-8 bytes, with no decoding) and
    each sub-message field as repeated bytes: every occurrence, singular ones too, which
    the parser merges. Singular scalars, which have no limit, are left out."""
    F = descriptor_pb2.FieldDescriptorProto
    shape = descriptor_pb2.DescriptorProto(name=desc.full_name.replace(".", "_"))
    for field in desc.fields:
        label = F.LABEL_REPEATED if field.is_repeated else F.LABEL_OPTIONAL
        if field.message_type is not None:
            kind, label = F.TYPE_BYTES, F.LABEL_REPEATED
        elif field.type in _SIZE_LIMITS:
            kind = F.TYPE_BYTES
        elif field.is_repeated:  # counted alone; an enum value is an int32 on the wire
            kind = F.TYPE_INT32 if field.type == F.TYPE_ENUM else field.type
        else:
            continue
        shape.field.add(name=field.name, number=field.number, type=kind, label=label)
    return shape


_LIMITS = _size_limits(MESSAGE_CLASSES.values())
_DESCRIPTORS = {cls.DESCRIPTOR.full_name: cls.DESCRIPTOR for cls in MESSAGE_CLASSES.values()}


def _check_sizes(
    limits: _Limits, occurrences: list[bytes], path: str, depth: int | None = None
) -> None:
    """Raise OversizedField naming a field past its limit. ``occurrences`` are the wire
    bytes of one message: a singular sub-message may come in parts, merged on parsing,
    whose repeated fields add up. What the wire holds is judged, so a field a later part
    (or a map entry with the same key) overwrites is refused all the same, and a map's
    entries are counted as sent. ``depth``: how many levels of sub-messages to look into
    (None: all)."""
    _check_shadows(limits, [limits.shadow.FromString(part) for part in occurrences], path, depth)


def _check_shadows(
    limits: _Limits, shadows: list[Message], path: str, depth: int | None = None
) -> None:
    """:func:`_check_sizes` of the occurrences as parsed. A repeated sub-message field that
    :func:`_nested_shadow` parsed holds its items' shadows, each checked as it is."""
    for name in limits.counted:
        count = sum(map(len, map(attrgetter(name), shadows)))
        if count > MAX_REPEATED:
            raise OversizedField(f"{path}.{name}: {count} items, at most {MAX_REPEATED}")
    for name, limit, repeated in limits.sized:
        values = map(attrgetter(name), shadows)
        longest = max(map(len, chain.from_iterable(values) if repeated else values), default=0)
        if longest > limit:
            raise OversizedField(f"{path}.{name}: {longest} bytes, at most {limit}")
    if depth == 0:
        return
    deeper = None if depth is None else depth - 1
    for name, type_name, merged in limits.nested:
        where, fields = f"{path}.{name}", [getattr(shadow, name) for shadow in shadows]
        if merged:
            parts = list(chain.from_iterable(fields))
            if sum(map(len, parts)) > _SMALL:
                _check_sizes(_LIMITS[type_name], parts, where, deeper)
        elif shadows[0].DESCRIPTOR.fields_by_name[name].message_type is not None:
            for item in chain.from_iterable(fields):  # parsed already; a small one passes
                _check_shadows(_LIMITS[type_name], [item], where, deeper)
        else:  # each read once (a run's bytes are a copy); no tick is as big
            for part in [p for p in chain.from_iterable(fields) if len(p) > _SMALL]:
                _check_sizes(_LIMITS[type_name], [part], where, deeper)


@cache
def _nested_shadow(full_name: str) -> type[Message]:
    """The shadow of ``full_name`` (:func:`_shadow_shape`) with each repeated sub-message
    field parsed as its type's shadow, not kept as bytes: one parse reads the message's
    fields and its items' (a FetchReply's runs, and how many ticks each holds), where the
    bytes of each item were copied out of the first parse and parsed again (#35)."""
    desc = _DESCRIPTORS[full_name]
    file = descriptor_pb2.FileDescriptorProto(name=f"nested/{full_name}.proto", syntax="proto3")
    root = _shadow_shape(desc)
    shapes = {desc.full_name: root}
    for field in desc.fields:
        sub = field.message_type
        if sub is None or not field.is_repeated or sub.full_name in shapes:
            continue
        shapes[sub.full_name] = _shadow_shape(sub)
        (shaped,) = (f for f in root.field if f.number == field.number)
        shaped.type = FieldDescriptor.TYPE_MESSAGE
        shaped.type_name = f".{shapes[sub.full_name].name}"
    file.message_type.extend(shapes.values())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(root.name))


def decode_sub(frames: Sequence[bytes]) -> tuple[str, Message]:
    """SUB side: ``[topic, version, body]``."""
    if len(frames) < 3:
        raise MissingFrame(f"expected topic + 2 envelope frames, got {len(frames)}")
    try:
        topic = bytes(frames[0]).decode()
    except UnicodeDecodeError:
        raise MalformedPayload("topic frame is not UTF-8") from None
    return topic, decode(frames[1:])


def sub_payloads(
    run: Sequence[Sequence[bytes]], topic: bytes | None, cls: type[Message]
) -> list[bytes | None]:
    """Each of a run of SUB messages' payload, when it is ``[topic, version, body]`` whose
    body is a ``cls`` of at most ``_SMALL`` bytes, so no field in it can be past a limit
    (what :func:`decode_sub` checks before it parses, for a receiver that parses several at
    once); None for any other, which the receiver decodes alone, and so refuses and counts
    what is wrong. ``topic`` None: any ASCII topic (UTF-8, as :func:`decode_sub` asks)."""
    head, most, out = TYPE_IDS[cls], _SMALL + 1, []
    append = out.append
    for frames in run:
        if (
            len(frames) == 3
            and (frames[0] == topic if topic is not None else frames[0].isascii())
            and frames[1] == VERSION_FRAME
            and (body := frames[2])
            and body[0] == head
            and len(body) <= most
        ):
            append(body[1:])
        else:
            append(None)
    return out


def _run_head(n: int) -> bytes:
    """Field 1's tag and a length of ``n`` as protobuf writes them (a varint)."""
    head = bytearray(b"\n")
    while n > 0x7F:
        head.append(n & 0x7F | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head)


# Each payload's tag and length as a run of field-1 items frames it, for every length
# :func:`sub_payloads` passes: concatenated, a run's payloads parse as one repeated field.
RUN_HEADS = tuple(map(_run_head, range(SUB_PAYLOAD_MAX + 1)))


@cache
def _run_class(cls: type[Message]) -> type[Message]:
    """A message of one repeated ``cls`` field, number 1, in ``cls``'s own pool, so that its
    items are ``cls`` messages: it parses a run of payloads at once (:func:`decode_subs`)."""
    desc, pool = cls.DESCRIPTOR, descriptor_pool.Default()
    name = f"candlewire.runs.{desc.full_name.replace('.', '_')}"
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    except KeyError:
        pass
    F = FieldDescriptor
    file = descriptor_pb2.FileDescriptorProto(
        name=f"candlewire/runs/{desc.full_name}.proto",
        package="candlewire.runs",
        syntax="proto3",
        dependency=[desc.file.name],
    )
    run = file.message_type.add(name=name.rpartition(".")[2])
    run.field.add(
        name="items",
        number=1,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_REPEATED,
        type_name=f".{desc.full_name}",
    )
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def decode_subs(run: Sequence[Sequence[bytes]], cls: type[M]) -> list[M | None]:
    """A run of SUB messages (``[topic, version, body]`` each) decoded as ``cls`` in one
    parse: for a receiver of many small ones (the gateway's user events, #35), where
    :func:`decode_sub` and :func:`expect` cost 2.6 µs a message in Python and this 0.8. A
    message that is not a small ``cls`` (:func:`sub_payloads`) is None, and so is every
    one of a run that does not parse, whatever the parser raises: the receiver decodes
    those alone, and so refuses and counts what is wrong. It never raises: a receiver
    calls it for a whole batch, outside its guard of each message."""
    payloads = sub_payloads(run, None, cls)
    passed = [p for p in payloads if p is not None]
    if not passed:
        return [None] * len(payloads)
    heads = RUN_HEADS
    try:
        items = iter(
            _run_class(cls).FromString(b"".join([heads[len(p)] + p for p in passed])).items
        )  # type: ignore[attr-defined]
    except Exception:  # DecodeError; pure-Python protobuf's UnicodeDecodeError too: each alone
        return [None] * len(payloads)
    return [None if p is None else next(items) for p in payloads]


def split_route(frames: Sequence[bytes]) -> tuple[list[bytes], list[bytes], bool]:
    """ROUTER side: split identity frames from the envelope.

    Returns ``(route, body, is_req)``. A REQ peer's route ends with the empty delimiter
    frame and must always get a reply; a DEALER peer's route is its identity alone.
    """
    frames = [bytes(f) for f in frames]
    for i, frame in enumerate(frames[1:], start=1):
        if not frame:
            return frames[: i + 1], frames[i + 1 :], True
    return frames[:1], frames[1:], False


def decode_router(frames: Sequence[bytes]) -> tuple[list[bytes], Message]:
    """ROUTER side: identity frames (with delimiter, if any), then the envelope."""
    route, body, _ = split_route(frames)
    return route, decode(body)


def expect(msg: Message, cls: type[M]) -> M:
    """Narrow a decoded message to the one type the caller accepts."""
    if not isinstance(msg, cls):
        raise UnexpectedMessage(f"expected {cls.__name__}, got {type(msg).__name__}")
    return msg


def to_record(msg: Message) -> bytes:
    """Kafka value: the envelope's two frames concatenated."""
    head = _RECORD_HEADS.get(type(msg))
    if head is None:
        raise _unknown(type(msg))
    return head + msg.SerializeToString()


def record_head(cls: type[Message]) -> bytes:
    """What :func:`to_record` puts before a ``cls`` message's bytes: a writer that serializes
    many of one type adds it itself."""
    head = _RECORD_HEADS.get(cls)
    if head is None:
        raise _unknown(cls)
    return head


def from_record(value: bytes) -> Message:
    """A Kafka record's value (version, type, payload) decoded as :func:`decode` decodes the
    two frames."""
    return from_record_and_payload(value)[0]


def from_record_and_payload(value: bytes) -> tuple[Message, bytes]:
    """:func:`from_record`, and the message's own bytes in the record (after its version
    and type bytes): checked, for a writer that passes them on as they are
    (:func:`encode_with`). The same checks, in the same order, on one copy of the payload,
    which the parser and the limits' check read and the writer is handed: from_record
    sliced the record twice on the way to the parser, and a third copy was made for the
    writer (a run is about 440 kB, #35). Bytes, not a view: upb copies a memoryview before
    it parses it."""
    if not value:
        raise MissingFrame("empty record")
    _check_version(value[:1])
    cls, payload = _class_of(value[1:2]), value[2:]
    return _decode_payload(cls, payload), payload


def encode_with(msg: Message, field: str, items: Sequence[bytes]) -> list[bytes]:
    """:func:`encode` of ``msg`` with ``items`` added to its repeated message field
    ``field`` after its own: each the serialized bytes of one element, as they came (the
    journal's runs, checked as they are read from Kafka, are not parsed and serialized again
    for each reply, #35). A message's bytes followed by more of its fields are that message
    merged with them, so both halves are written: ``msg``, then each item as protobuf
    writes an element of a repeated field (its tag, its length, its bytes), framed here and
    joined once. Built as a message of repeated bytes, a 7 MB chunk of runs was copied
    into it, grown by doubling as it was serialized, and copied out again: a fifth of the
    journal service's CPU."""
    tag = _length_delimited_tag(msg.DESCRIPTOR.full_name, field)
    parts = [bytes([type_id(msg)]), msg.SerializeToString()]
    for item in items:
        parts += (tag, _varint(len(item)), item)
    return [VERSION_FRAME, b"".join(parts)]


@cache
def _length_delimited_tag(full_name: str, field: str) -> bytes:
    """The tag of an element of ``field`` of ``full_name`` on the wire: its number and wire
    type 2 (length-delimited), as a varint."""
    number = _DESCRIPTORS[full_name].fields_by_name[field].number
    return _varint(number << 3 | 2)


def _varint(value: int) -> bytes:
    """``value`` (not negative) as a protobuf varint: 7 bits a byte, the low ones first."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def derive(cls: type[M], source: Message, **values: object) -> M:
    """A ``cls`` message carrying every field ``source`` has under the same name and type,
    then ``values``: a request's fields travel from message to message (request, work,
    page metadata, notification) without being listed again at each hop."""
    theirs = source.DESCRIPTOR.fields_by_name
    msg = cls()
    for name, field in cls.DESCRIPTOR.fields_by_name.items():
        other = theirs.get(name)
        same = (
            other is not None
            and other.type == field.type
            and other.enum_type is field.enum_type
            and other.message_type is field.message_type
            and other.is_repeated == field.is_repeated
        )
        if not same or name in values:
            continue
        if field.is_repeated:
            getattr(msg, name).extend(getattr(source, name))
        elif field.message_type is not None:
            if source.HasField(name):
                getattr(msg, name).CopyFrom(getattr(source, name))
        else:
            setattr(msg, name, getattr(source, name))
    for name, value in values.items():
        setattr(msg, name, value)
    return msg


class Names(dict[int, str]):
    """An enum's names by number. A number this build does not know (a newer sender's:
    proto3 keeps it) is shown as the number, where ``EnumTypeWrapper.Name`` raises; and a
    lookup here costs a tenth of that call."""

    def __missing__(self, number: int) -> str:
        return str(number)

    @classmethod
    def of(cls, enum: EnumTypeWrapper) -> Names:
        return cls({v.number: v.name for v in enum.DESCRIPTOR.values})

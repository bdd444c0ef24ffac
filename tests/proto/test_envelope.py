from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.message import Message

from proto import book_pb2, envelope_pb2, events_pb2, journal_pb2, market_pb2, requests_pb2
from proto.envelope import (
    MAX_BYTES_FIELD,
    MAX_REPEATED,
    MAX_STRING_BYTES,
    MESSAGE_CLASSES,
    TYPE_IDS,
    VERSION_FRAME,
    EnvelopeError,
    MalformedPayload,
    MissingFrame,
    OversizedField,
    UnexpectedFrames,
    UnexpectedMessage,
    UnknownMessageType,
    UnsupportedVersion,
    checked_payload,
    decode,
    decode_body,
    decode_router,
    decode_sub,
    derive,
    encode,
    encode_topic,
    encode_with,
    expect,
    from_record,
    from_record_and_payload,
    payload_of,
    record_head,
    split_route,
    to_record,
)


def test_table_covers_every_type_id_in_the_spec() -> None:
    spec_ids = {0x01, 0x03, 0x04, 0x05, 0x06, 0x09, 0x0A, 0x0B, 0x0C}
    spec_ids |= {0x10, 0x11, 0x12, 0x13, 0x20, 0x21}
    # SubscriptionError: realtime on demand's answer to unservable subscriptions; FeedIdle: a
    # quiet feed's clock, in the ticks topic; StreamHead, FetchRequest, FetchReply: sequenced
    # live streams and the journal service; JournalBatch: a record of the journal topic;
    # Gap: a range an ingestor's trade stream missed, in candlewire.gaps; BookDelta and
    # BookSnapshot: L2 books (#38)
    ours = {0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1B, 0x1C}
    assert set(MESSAGE_CLASSES) == spec_ids | ours
    assert len(set(MESSAGE_CLASSES.values())) == len(spec_ids | ours)


def test_deprecated_ids_are_reserved_not_reused() -> None:
    file = descriptor_pb2.FileDescriptorProto.FromString(envelope_pb2.DESCRIPTOR.serialized_pb)
    (enum,) = [e for e in file.enum_type if e.name == "MessageType"]
    reserved = {n for r in enum.reserved_range for n in range(r.start, r.end + 1)}
    assert {0x02, 0x07, 0x08} <= reserved
    assert not {v.number for v in enum.value} & {0x02, 0x07, 0x08}
    for type_id in (0x02, 0x07, 0x08):
        with pytest.raises(UnknownMessageType):
            decode([b"\x01", bytes([type_id])])


def test_a_message_type_without_an_envelope_id_is_refused_by_every_encoder() -> None:
    """A message the envelope has no type byte for is never sent with some other type's:
    each encoder raises, naming the type."""
    stranger = events_pb2.DeliverySpec()  # a part of UserEvent, never sent alone
    for encoder in (encode, lambda m: encode_topic("USER:u1", m), to_record):
        with pytest.raises(UnknownMessageType, match="DeliverySpec"):
            encoder(stranger)
    with pytest.raises(UnknownMessageType, match="DeliverySpec"):
        record_head(events_pb2.DeliverySpec)


@pytest.mark.parametrize("type_id", sorted(MESSAGE_CLASSES))
def test_round_trip_every_type(type_id: int) -> None:
    msg = MESSAGE_CLASSES[type_id]()
    for name in ("ticker", "request_id", "event_id", "trigger_id", "user_id", "exchange"):
        if name in msg.DESCRIPTOR.fields_by_name:
            setattr(msg, name, f"value-{type_id}")
    frames = encode(msg)
    assert frames[0] == b"\x01"
    assert frames[1][0] == type_id
    assert decode(frames) == msg
    assert from_record(to_record(msg)) == msg


def test_prices_round_trip_exactly() -> None:
    tick = market_pb2.Tick(price="0.000000012345678901", size="123456789.123456789")
    out = decode(encode(tick))
    assert out.price == "0.000000012345678901"
    assert out.size == "123456789.123456789"


def test_sub_and_router_framing() -> None:
    note = requests_pb2.HistoryReadyNotification(request_id="r1", row_count=3)
    topic, msg = decode_sub(encode_topic("HISTORY_READY:r1", note))
    assert topic == "HISTORY_READY:r1" and msg == note
    route, msg = decode_router([b"id", b"", *encode(note)])
    assert route == [b"id", b""] and msg == note
    route, body, is_req = split_route([b"id", *encode(note)])
    assert route == [b"id"] and not is_req and decode(body) == note
    route, body, is_req = split_route([b"proxy", b"id", b"", *encode(note)])
    assert route == [b"proxy", b"id", b""] and is_req


@pytest.mark.parametrize(
    ("frames", "error"),
    [
        ([b"\x02", b"\x04"], UnsupportedVersion),
        ([b"", b"\x04"], UnsupportedVersion),
        ([b"\x01\x01", b"\x04"], UnsupportedVersion),
        ([b"\x01", b"\x7f"], UnknownMessageType),
        ([b"\x01", b"\x00"], UnknownMessageType),
        ([b"\x01"], MissingFrame),
        ([], MissingFrame),
        ([b"\x01", b""], MissingFrame),
        ([b"\x01", b"\x04", b"extra"], UnexpectedFrames),
        ([b"\x01", b"\x04\xff\xff\xff"], MalformedPayload),
        ([b"\x01", b"\x10\x0a\x05ab"], MalformedPayload),
    ],
)
def test_each_malformed_case_raises_its_own_error(frames: list[bytes], error: type) -> None:
    with pytest.raises(error):
        decode(frames)


def test_sub_frames_missing_or_non_utf8_topic() -> None:
    with pytest.raises(MissingFrame):
        decode_sub([b"topic", b"\x01"])
    with pytest.raises(MalformedPayload):
        decode_sub([b"\xff\xfe", *encode(market_pb2.Tick())])


def test_expect_narrows_type() -> None:
    ack = events_pb2.EventAck(event_id="e")
    assert expect(ack, events_pb2.EventAck) is ack
    with pytest.raises(UnexpectedMessage):
        expect(ack, events_pb2.UserEvent)


def test_derive_copies_the_fields_both_messages_name_and_overrides_the_rest() -> None:
    rq = requests_pb2
    req = rq.SubmitHistoricalRequest(
        request_id="r1",
        client_id="c1",
        ticker="SIM:BTC/USDT",
        period_s=60,
        start_ms=1,
        end_ms=2,
        notify=rq.NOTIFY_REQUEST,
    )
    work = derive(rq.DataRequest, req, kind=rq.HISTORICAL, end_ms=9, notification_topic="t")
    assert (work.request_id, work.client_id, work.ticker) == ("r1", "c1", "SIM:BTC/USDT")
    assert (work.period_s, work.start_ms, work.end_ms) == (60, 1, 9)
    assert (work.kind, work.notification_topic) == (rq.HISTORICAL, "t")
    meta = derive(market_pb2.HistoryRequestMetadata, work, expected_pages=3)
    note = derive(rq.HistoryReadyNotification, meta, row_count=5)
    assert (note.request_id, note.ticker, note.end_ms, note.row_count) == (
        "r1",
        "SIM:BTC/USDT",
        9,
        5,
    )
    assert meta.notification_topic == "t" and meta.expected_pages == 3


OVER = "x" * (MAX_STRING_BYTES + 1)


@pytest.mark.parametrize(
    "msg",
    [
        requests_pb2.SubmitHistoricalRequest(request_id="r", ticker=OVER),
        events_pb2.UserEvent(user_id="u", payload=b"p" * (MAX_BYTES_FIELD + 1)),
        # nested, repeated and map fields are walked too
        journal_pb2.FetchReply(
            runs=[journal_pb2.JournalBatch(ticks=[market_pb2.Tick(ticker="A:B/C", trade_id=OVER)])]
        ),
        requests_pb2.IngestorControl(working=["ok", OVER]),
        requests_pb2.IngestorControl(config={"k": OVER}),
        requests_pb2.IngestorControl(config={OVER: "v"}),
        requests_pb2.IngestorControl(done=["d"] * (MAX_REPEATED + 1)),
        market_pb2.Tick(
            ticker="A:" + "é" * (MAX_STRING_BYTES // 2) + "/B"
        ),  # bytes, not characters
    ],
)
def test_a_field_past_its_limit_is_refused(msg) -> None:
    with pytest.raises(OversizedField) as err:
        decode(encode(msg))
    assert err.value.reason == "oversized_field"


def test_fields_at_their_limits_pass() -> None:
    at = "x" * MAX_STRING_BYTES
    for msg in (
        requests_pb2.SubmitHistoricalRequest(request_id="r", ticker=at, client_id=at),
        events_pb2.UserEvent(user_id="u", payload=b"p" * MAX_BYTES_FIELD),
        requests_pb2.IngestorControl(config={at: at}, done=["d"] * 1000),
    ):
        assert decode(encode(msg)) == msg


def fetch_reply(runs: int, ticks: int) -> journal_pb2.FetchReply:
    reply = journal_pb2.FetchReply(request_id="f", status=journal_pb2.FETCH_OK, cursor=1)
    for r in range(runs):
        run = reply.runs.add(topic="SIM:R/USDT|tick")
        run.ticks.extend(
            market_pb2.Tick(ticker="SIM:R/USDT", trade_id=str(r * ticks + i), price="1.5")
            for i in range(ticks)
        )
    return reply


def test_a_field_past_its_limit_is_refused_in_the_last_of_100k_fetched_ticks() -> None:
    """The check passes over each small tick by its length (#35); it still finds the one
    oversized field however far into a chunk it is."""
    reply = fetch_reply(runs=10, ticks=10_000)
    assert decode(encode(reply)) == reply
    reply.runs[-1].ticks[-1].trade_id = OVER
    with pytest.raises(OversizedField) as err:
        decode(encode(reply))
    assert err.value.reason == "oversized_field"


def test_a_payload_for_a_reader_of_its_own_is_checked_to_the_depth_it_asks() -> None:
    """``payload_of`` checks frames, version, type and the limits down to ``depth``; what
    lies deeper is the reader's (the Arrow replay checks the ticks' texts itself)."""
    reply = fetch_reply(runs=3, ticks=100)
    frames = encode(reply)
    assert payload_of(frames, journal_pb2.FetchReply, depth=1) == frames[1][1:]
    reply.runs[-1].ticks[-1].trade_id = OVER  # a tick's: two levels down
    assert payload_of(encode(reply), journal_pb2.FetchReply, depth=1)
    with pytest.raises(OversizedField):
        decode(encode(reply))
    reply = fetch_reply(runs=3, ticks=100)
    reply.runs[1].topic = OVER  # a run's: one level down
    assert payload_of(encode(reply), journal_pb2.FetchReply, depth=0)
    with pytest.raises(OversizedField, match=r"runs\.topic"):
        payload_of(encode(reply), journal_pb2.FetchReply, depth=1)
    reply = fetch_reply(runs=1, ticks=100)
    reply.error = OVER  # its own
    with pytest.raises(OversizedField, match="error"):
        payload_of(encode(reply), journal_pb2.FetchReply)
    with pytest.raises(UnexpectedMessage):
        payload_of(encode(market_pb2.Tick(ticker="A:B/C")), journal_pb2.FetchReply)
    for bad, error in (
        ([VERSION_FRAME], MissingFrame),
        ([b"\x09", frames[1]], UnsupportedVersion),
        ([VERSION_FRAME, b"\xff"], UnknownMessageType),
        ([VERSION_FRAME, frames[1][:1] + b"\xff" * 9000], MalformedPayload),
    ):
        with pytest.raises(error):
            payload_of(bad, journal_pb2.FetchReply)


def test_a_singular_sub_message_sent_in_parts_is_counted_whole() -> None:
    """The parser merges the parts of a singular field, so their repeated items add up."""
    half = events_pb2.UserEvent(
        delivery=events_pb2.DeliverySpec(
            channels=[events_pb2.ChannelPreference()] * (MAX_REPEATED // 2 + 1)
        )
    ).SerializeToString()
    body = bytes([envelope_pb2.USER_EVENT])
    assert len(decode_body(body + half).delivery.channels) == MAX_REPEATED // 2 + 1
    with pytest.raises(OversizedField):
        decode_body(body + half + half)


def test_sub_payloads_passes_small_messages_of_one_topic_and_type_only() -> None:
    from proto.envelope import SUB_PAYLOAD_MAX, sub_payloads

    delta = book_pb2.BookDelta(ticker="X", venue_seq=3)
    good = encode_topic("X|book", delta)
    assert (
        sub_payloads([good, good], b"X|book", book_pb2.BookDelta) == [delta.SerializeToString()] * 2
    )
    assert sub_payloads([good], b"X|tick", book_pb2.BookDelta) == [None]
    assert sub_payloads([good], b"X|book", book_pb2.BookSnapshot) == [None]
    bad = [
        [b"X|book", b"\x02", good[2]],  # another version
        [b"X|book", good[1]],  # a frame missing
        [*good, b""],  # one too many
        [b"X|book", good[1], b""],  # no type byte
        encode_topic("X|book", book_pb2.BookDelta(ticker="X" * (SUB_PAYLOAD_MAX + 1))),
    ]
    got = sub_payloads([good, *bad, good], b"X|book", book_pb2.BookDelta)
    assert got == [delta.SerializeToString(), *[None] * len(bad), delta.SerializeToString()]


def _decoded_alone(frames: list[bytes]) -> Message | EnvelopeError:
    try:
        return expect(decode_sub(frames)[1], events_pb2.UserEvent)
    except EnvelopeError as exc:
        return exc


def test_a_run_of_user_events_decodes_as_each_alone_and_leaves_the_rest_to_it() -> None:
    """:func:`decode_subs` (the gateway's one parse of a batch of events, #35) gives each
    small UserEvent as :func:`decode_sub` reads it, and None for everything else: a frame
    missing or too many, another version or type, a topic that is not ASCII, a payload past
    ``SUB_PAYLOAD_MAX``. Nothing it gives is what decode_sub would refuse."""
    from proto.envelope import SUB_PAYLOAD_MAX, decode_subs

    events = [
        events_pb2.UserEvent(event_id=f"e{i}", user_id="u1", payload=b'{"i": %d}' % i)
        for i in range(40)
    ]
    good = [encode_topic("USER:u1", e) for e in events]
    bad = [
        [b"USER:u1", b"\x02", good[0][2]],
        [b"USER:u1", good[0][1]],
        [*good[0], b""],
        [b"USER:u1", good[0][1], b""],
        [b"USER:\xc3\xa9", *good[0][1:]],  # UTF-8 yet not ASCII: left to decode_sub
        [b"USER:\xff", *good[0][1:]],  # not UTF-8: refused alone
        encode_topic("USER:u1", market_pb2.Tick(ticker="X")),
        encode_topic("USER:u1", events_pb2.UserEvent(payload=b"x" * SUB_PAYLOAD_MAX)),
    ]
    run = [*good[:20], *bad, *good[20:]]
    got = decode_subs(run, events_pb2.UserEvent)
    assert got == [*events[:20], *[None] * len(bad), *events[20:]]
    assert all(type(e) is events_pb2.UserEvent for e in got if e is not None)
    assert decode_subs([], events_pb2.UserEvent) == []
    # One payload that does not parse: the whole run is left to decode_sub, which refuses
    # that one and reads the others.
    broken = [b"USER:u1", VERSION_FRAME, bytes([TYPE_IDS[events_pb2.UserEvent]]) + b"\x0a\x05ab"]
    assert decode_subs([good[0], broken, good[1]], events_pb2.UserEvent) == [None] * 3
    assert isinstance(_decoded_alone(broken), MalformedPayload)


def test_a_run_whose_parse_raises_anything_is_left_to_decode_sub(monkeypatch) -> None:
    """The pure-Python protobuf raises UnicodeDecodeError on a bad string where upb raises
    DecodeError: whatever the run's parse raises, every message is left to decode_sub, and
    the gateway's loop, which calls this for a batch outside its guard of each event, goes
    on."""
    import proto.envelope as envelope

    class Raising:
        @staticmethod
        def FromString(_data: bytes) -> None:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    good = encode_topic("USER:u1", events_pb2.UserEvent(event_id="e1"))
    monkeypatch.setattr(envelope, "_run_class", lambda cls: Raising)
    assert envelope.decode_subs([good, good], events_pb2.UserEvent) == [None, None]


def test_a_run_of_user_events_never_takes_what_decode_sub_refuses() -> None:
    """Random corruptions of a run's messages: what :func:`decode_subs` gives equals
    :func:`decode_sub`'s reading of the same frames, never something it refuses."""
    from proto.envelope import decode_subs

    rng = random.Random(11)
    for _ in range(300):
        run = [
            encode_topic(
                f"USER:u{rng.randrange(3)}",
                events_pb2.UserEvent(event_id=f"e{i}", payload=rng.randbytes(rng.randrange(30))),
            )
            for i in range(rng.randint(1, 12))
        ]
        for frames in rng.sample(run, rng.randint(0, len(run))):
            k = rng.randrange(3)
            at = rng.randrange(len(frames[k]) + 1)
            frames[k] = frames[k][:at] + rng.randbytes(rng.randint(0, 3)) + frames[k][at + 1 :]
        for frames, event in zip(run, decode_subs(run, events_pb2.UserEvent), strict=True):
            if event is not None:
                assert _decoded_alone(frames) == event


@pytest.mark.parametrize(
    "record",
    [
        b"",
        b"\x02\x19",
        b"\x01",
        b"\x01\x7f",
        b"\x01\x19\xff\xff\xff",
        b"\x01\x19\x0a\x05ab",
        to_record(journal_pb2.JournalBatch(topic="X|tick")),
        b"\x01\x19",
    ],
)
def test_a_record_and_its_payload_are_read_as_from_record_reads_the_record(record: bytes) -> None:
    """The journal's reading of a record (its payload copied once, #35) refuses what
    :func:`from_record` refuses, with the same error, and reads the same message."""
    try:
        expected: Message | EnvelopeError = from_record(record)
    except EnvelopeError as exc:
        expected = exc
    try:
        msg, payload = from_record_and_payload(record)
    except EnvelopeError as exc:
        assert type(exc) is type(expected) and str(exc) == str(expected)
    else:
        assert msg == expected and payload == record[2:]


def test_a_run_past_a_limit_in_a_record_is_refused_as_from_record_refuses_it() -> None:
    reply = fetch_reply(runs=1, ticks=100)
    run = reply.runs[0]
    run.ticks[-1].trade_id = OVER
    with pytest.raises(OversizedField):
        from_record_and_payload(to_record(run))


@pytest.mark.parametrize("sizes", [[], [0], [1, 127, 128, 16_383, 16_384, 2_097_152], [300] * 50])
def test_a_reply_with_runs_as_bytes_is_what_protobuf_writes_for_them(sizes: list[int]) -> None:
    """``encode_with`` frames each item itself; the bytes are those protobuf writes for the
    reply followed by a message holding the items as the repeated field, lengths of one
    varint byte or several."""
    reply = journal_pb2.FetchReply(request_id="f", status=journal_pb2.FETCH_OK, cursor=9)
    items = [journal_pb2.JournalBatch(topic="X" * n).SerializeToString() for n in sizes]
    runs = journal_pb2.FetchReply(runs=[journal_pb2.JournalBatch.FromString(i) for i in items])
    head = bytes([TYPE_IDS[journal_pb2.FetchReply]])
    expected = [VERSION_FRAME, head + reply.SerializeToString() + runs.SerializeToString()]
    assert encode_with(reply, "runs", items) == expected


def _verdict(check: Callable[[list[bytes]], object], frames: list[bytes]) -> type | None:
    try:
        check(frames)
    except EnvelopeError as exc:
        return type(exc)
    return None


def test_a_payload_checked_with_its_runs_parsed_once_is_judged_as_payload_of_judges_it() -> None:
    """``checked_payload`` (#35: the runs' fields read in the one parse that checks them)
    refuses what ``payload_of(depth=1)`` refuses, with the same error, and beyond it only a
    run whose own fields do not parse (refused whole by the decoder too). Each run's ticks
    are counted as they are sent."""
    reply = fetch_reply(runs=3, ticks=100)
    payload, checked = checked_payload(encode(reply), journal_pb2.FetchReply)
    assert payload == encode(reply)[1][1:]
    assert [len(run.ticks) for run in checked.runs] == [100, 100, 100]
    cases = []
    for where in ("topic", "error", "tick", "runs", "ticks"):
        bad = fetch_reply(runs=3, ticks=100)
        if where == "topic":
            bad.runs[1].topic = OVER
        elif where == "error":
            bad.error = OVER
        elif where == "tick":
            bad.runs[2].ticks[-1].trade_id = OVER  # two levels down: the reader's
        elif where == "runs":
            del bad.runs[:]
            bad.runs.extend([journal_pb2.JournalBatch()] * (MAX_REPEATED + 1))
        else:
            bad.runs[0].ticks.extend([market_pb2.Tick()] * MAX_REPEATED)
        cases.append(encode(bad))
    frames = encode(reply)
    cases += [
        [VERSION_FRAME],
        [b"\x09", frames[1]],
        [VERSION_FRAME, b"\xff"],
        [VERSION_FRAME, frames[1][:1] + b"\xff" * 9000],
        encode(market_pb2.Tick(ticker="A:B/C")),
    ]
    small = encode(fetch_reply(runs=2, ticks=3))
    rng = random.Random(35)
    for _ in range(300):  # bytes changed at random, in a chunk and in a small reply
        body = bytearray(rng.choice([frames, small])[1])
        for _ in range(rng.randrange(1, 4)):
            body[rng.randrange(1, len(body))] = rng.randrange(256)
        cases.append([VERSION_FRAME, bytes(body)])
    for case in cases:
        old = _verdict(lambda f: payload_of(f, journal_pb2.FetchReply, depth=1), case)
        new = _verdict(lambda f: checked_payload(f, journal_pb2.FetchReply), case)
        assert new == old or (old is None and new is MalformedPayload and _undecodable(case))
    with pytest.raises(OversizedField, match=r"runs\.topic"):
        checked_payload(cases[0], journal_pb2.FetchReply)


def _undecodable(frames: list[bytes]) -> bool:
    try:
        decode(frames)
    except EnvelopeError:
        return True
    return False


def test_a_number_no_release_names_is_shown_as_itself() -> None:
    """What a newer sender's enum value comes to: a name that is its number, where a lookup
    by ``Name`` raised (in the client, the event publisher's thread, the gateway)."""
    from candlewire.errors import RequestRejected, SubscriptionFailed
    from proto.envelope import Names

    statuses = Names.of(market_pb2.MarketStatus)
    assert statuses[market_pb2.TRADING] == "TRADING" and statuses[42] == "42"
    assert RequestRejected(requests_pb2.SubmitResponse(reason=77)).reason == "77"
    assert SubscriptionFailed(requests_pb2.SubscriptionError(reason=77)).reason == "77"

"""The book rule (candlewire.book): which delta applies, which waits, which untrusts a book."""

from __future__ import annotations

import contextlib
import random
import time
import zlib
from decimal import Decimal

import pytest

from candlewire.book import (
    _RUN_COLUMNS,
    REPLAYED,
    RUN_MAX,
    RUN_MIN,
    Book,
    BookError,
    BookFeed,
    BookSync,
    DeltaRun,
    Verdict,
    _run_levels,
    _text_levels,
    _wire_levels,
    delta_pieces,
    kraken_checksum,
    okx_checksum,
    replay,
)
from proto import book_pb2
from proto.envelope import RUN_HEADS, EnvelopeError, decode_sub, encode_topic
from proto.market_pb2 import StreamHead, StreamPosition

T = "OKX:BTC/USDT"


def levels(*pairs: tuple[str, str]) -> list[book_pb2.BookLevel]:
    return [book_pb2.BookLevel(price=p, size=s) for p, s in pairs]


def snap(seq: int, bids=(("100", "1"), ("99", "2")), asks=(("101", "1"), ("102", "3"))):
    return book_pb2.BookSnapshot(ticker=T, venue_seq=seq, bids=levels(*bids), asks=levels(*asks))


def delta(seq: int, bids=(), asks=(), prev: int = 0, checksum: int | None = None):
    d = book_pb2.BookDelta(
        ticker=T, venue_seq=seq, prev_seq=prev, bids=levels(*bids), asks=levels(*asks)
    )
    if checksum is not None:
        d.checksum = checksum
    return d


def test_levels_are_sorted_best_first_and_zero_removes() -> None:
    sync = BookSync(T)
    sync.on_snapshot(snap(10))
    assert sync.on_delta(delta(11, bids=[("99.5", "4"), ("100", "0.000")])) is Verdict.APPLIED
    book = sync.book
    assert book is not None and book.seq == 11
    assert book.bids() == [(Decimal("99.5"), Decimal(4)), (Decimal(99), Decimal(2))]
    assert book.asks(1) == [(Decimal(101), Decimal(1))]


def test_repeats_and_deltas_older_than_the_snapshot_are_stale() -> None:
    sync = BookSync(T)
    sync.on_snapshot(snap(10))
    assert sync.on_delta(delta(10, bids=[("100", "9")])) is Verdict.STALE
    assert sync.on_delta(delta(11, bids=[("100", "5")])) is Verdict.APPLIED
    assert sync.on_delta(delta(11, bids=[("100", "7")])) is Verdict.STALE
    assert sync.book is not None and sync.book.bids(1) == [(Decimal(100), Decimal(5))]


def test_a_missing_delta_untrusts_the_book_until_a_snapshot() -> None:
    sync = BookSync(T)
    sync.on_snapshot(snap(10))
    assert sync.on_delta(delta(12, bids=[("100", "5")])) is Verdict.GAP
    assert sync.needs_snapshot
    assert sync.on_delta(delta(13, asks=[("101", "2")])) is Verdict.WAITING
    # The fresh snapshot includes 12; 13 was held and applies on top of it.
    held = sync.on_snapshot(snap(12, bids=[("100", "5")]))
    assert [v for _, v in held] == [Verdict.STALE, Verdict.APPLIED]
    assert sync.book is not None and sync.book.seq == 13
    assert sync.book.asks(1) == [(Decimal(101), Decimal(2))]


def test_deltas_before_the_first_snapshot_wait_and_only_newer_ones_apply() -> None:
    """The seam of cryptofeed#1082 and #1016: the stream runs before the snapshot arrives."""
    sync = BookSync(T, buffer_limit=3)
    for seq in range(5, 10):  # 5 and 6 fall out of the bounded buffer
        assert sync.on_delta(delta(seq, bids=[("100", str(seq))])) is Verdict.WAITING
    held = sync.on_snapshot(snap(7, bids=[("100", "7")]))
    assert [(d.venue_seq, v) for d, v in held] == [
        (7, Verdict.STALE),
        (8, Verdict.APPLIED),
        (9, Verdict.APPLIED),
    ]
    assert sync.book is not None and sync.book.bids(1) == [(Decimal(100), Decimal(9))]


def test_an_overlapping_delta_numbered_by_its_first_and_last_update_applies() -> None:
    """Binance-style: after a snapshot at 10, the delta covering updates 8..12 applies."""
    sync = BookSync(T)
    sync.on_snapshot(snap(10))
    assert sync.on_delta(delta(12, prev=7, bids=[("100", "3")])) is Verdict.APPLIED
    assert sync.on_delta(delta(15, prev=13, bids=[("100", "4")])) is Verdict.GAP


def test_a_checksum_mismatch_untrusts_the_book() -> None:
    sync = BookSync(T, okx_checksum)
    sync.on_snapshot(snap(1))
    right = delta(2, bids=[("100", "2")])
    expected = Book.from_snapshot(snap(1))
    expected.apply(right)
    right.checksum = okx_checksum(expected)
    assert sync.on_delta(right) is Verdict.APPLIED
    wrong = delta(3, bids=[("100", "3")], checksum=(right.checksum + 1) & 0xFFFFFFFF)
    assert sync.on_delta(wrong) is Verdict.CHECKSUM
    assert sync.needs_snapshot and sync.counts[Verdict.CHECKSUM] == 1


@pytest.mark.parametrize("price,size", [("abc", "1"), ("100", ""), ("-1", "1"), ("1", "-2")])
def test_a_malformed_level_is_dropped_and_leaves_the_book_as_it_was(price, size) -> None:
    sync = BookSync(T)
    sync.on_snapshot(snap(1))
    bad = delta(2, bids=[("98", "1"), (price, size)])
    assert sync.on_delta(bad) is Verdict.MALFORMED
    assert sync.book is not None and sync.book.seq == 1
    assert Decimal(98) not in dict(sync.book.bids())
    with pytest.raises(BookError):
        Book.from_snapshot(snap(1, bids=[(price, size)]))


def test_okx_checksum_interleaves_bids_and_asks_as_sent() -> None:
    book = Book.from_snapshot(snap(1, bids=[("100.0", "1"), ("99.5", "2"), ("99", "3")]))
    text = "100.0:1:101:1:99.5:2:102:3:99:3"
    assert okx_checksum(book) == zlib.crc32(text.encode())


def test_kraken_checksum_strips_points_and_leading_zeros_asks_first() -> None:
    # Kraken's documented formatting: "0.05000" x "0.00000304" reads "5000" + "304".
    book = Book.from_snapshot(
        snap(1, bids=[("0.04765", "0.00000500")], asks=[("0.05000", "0.00000304")])
    )
    assert kraken_checksum(book) == zlib.crc32(b"5000304" + b"4765500")


def test_replay_rebuilds_and_refuses_a_gap() -> None:
    book, verdicts = replay(snap(1), [delta(2, asks=[("101", "0")]), delta(3, bids=[("1", "1")])])
    assert verdicts == [Verdict.APPLIED, Verdict.APPLIED]
    assert book.asks() == [(Decimal(102), Decimal(3))] and book.seq == 3
    with pytest.raises(BookError, match="gap"):
        replay(snap(1), [delta(3)])


def test_an_older_snapshot_never_takes_a_trusted_book_back() -> None:
    """A snapshot published again after a stream-job restart, or a peer's older one."""
    sync = BookSync(T)
    sync.on_snapshot(snap(10))
    assert sync.on_delta(delta(11, bids=[("100", "5")])) is Verdict.APPLIED
    assert sync.on_snapshot(snap(10)) == [] and sync.counts[Verdict.STALE] == 1
    assert sync.book is not None and sync.book.seq == 11
    assert sync.book.bids(1) == [(Decimal(100), Decimal(5))]
    sync.on_snapshot(snap(12, bids=[("100", "6")]))  # a newer one is taken
    assert sync.book.seq == 12 and sync.book.bids(1) == [(Decimal(100), Decimal(6))]


def test_a_venue_number_beyond_64_bits_is_malformed() -> None:
    sync = BookSync(T)
    sync.on_snapshot(snap(1))
    assert sync.on_delta(delta(1 << 63, prev=1)) is Verdict.MALFORMED
    with pytest.raises(BookError):
        Book.from_snapshot(snap(1 << 63))


# Runs of deltas read at once (#38): the same books and verdicts as one by one.

TOPIC = b"OKX:BTC/USDT|book"
ZEROS = ("0", "0.0", "0.000", "-0", "0e3")
BAD_SIZES = (
    "x",
    "-1",
    "nan",
    "inf",
    " 1",
    "1_0",
    "",
    "1,5",
    "0x10",
    "\u0661",  # an Arabic-Indic one
    # Decimals the tables cannot hold (DECIMAL(38,18)), which Iceberg rounded or dropped:
    "1e-400",  # a float of 0, not a removal
    "1e-19",
    "0.0000000000000000001",
    "1" * 21,
)
BAD_PRICES = ("abc", "-1", "0", "inf", "", "1.0000000000000000001", "1" * 21)


def frames_of(deltas: list[book_pb2.BookDelta], epoch: int = 7, seq: int = 1) -> list[list[bytes]]:
    """Each delta as the stream job publishes it on its topic, positioned one after another."""
    out = []
    for i, d in enumerate(deltas):
        d.stream.CopyFrom(
            StreamPosition(epoch=epoch, seq=seq + i, publish_time_ms=5, source_offset=-1)
        )
        out.append(encode_topic(TOPIC.decode(), d))
    return out


def random_deltas(
    rng: random.Random, first: int, n: int, faults: float, respell: bool = True
) -> list[book_pb2.BookDelta]:
    """Deltas from venue number ``first`` on; with probability ``faults`` each is wrong in
    some way one by one would judge: a repeat, a gap, a chained prev_seq (right or wrong), a
    malformed level, a level without price or size, a checksum. ``respell``: a price may be
    spelled two ways ("95.5", "95.50"), which a run reads level by level, not off the wire."""
    out, seq = [], first
    for _ in range(n):
        sides = []
        for _side in range(2):
            levels = []
            for _ in range(rng.randint(0, 6)):
                cents = rng.choice(["5", "50", "0"]) if respell else str(rng.randint(0, 9))
                price = f"{rng.randint(90, 110)}.{cents}"
                size = rng.choice(ZEROS) if rng.random() < 0.35 else f"{rng.random() * 3:.4f}"
                levels.append(book_pb2.BookLevel(price=price, size=size))
            sides.append(levels)
        d = book_pb2.BookDelta(ticker=T, venue_seq=seq, exchange_time_ns=seq * 1000)
        d.bids.extend(sides[0])
        d.asks.extend(sides[1])
        if rng.random() < faults:
            fault = rng.randrange(8)
            if fault == 0:
                d.venue_seq = max(seq - rng.randint(1, 3), 0)  # a repeat or older
            elif fault == 1:
                d.venue_seq = seq = seq + rng.randint(1, 3)  # a gap
            elif fault == 2:
                d.prev_seq = seq - 1  # chained as ccxt's venues are
            elif fault == 3:
                d.prev_seq = seq  # chained to an update not yet seen: a gap
            elif fault == 4:
                d.bids.add(price="101", size=rng.choice(BAD_SIZES))
            elif fault == 5:
                d.asks.add(price=rng.choice(BAD_PRICES), size="1")
            elif fault == 6:
                d.asks.add()  # neither price nor size
            else:
                d.checksum = rng.randrange(1 << 32)
        out.append(d)
        seq += 1
    return out


def same(a: BookSync, b: BookSync) -> bool:
    if (a.book is None) != (b.book is None) or a.counts != b.counts:
        return False
    if a.book is None or b.book is None:
        return True
    return (
        (a.book.seq, a.book.time_ns) == (b.book.seq, b.book.time_ns)
        and a.book.texts(True) == b.book.texts(True)
        and a.book.texts(False) == b.book.texts(False)
    )


@pytest.mark.parametrize("respell", [True, False], ids=["respelled", "off the wire"])
@pytest.mark.parametrize("faults", [0.0, 0.02, 0.3])
@pytest.mark.parametrize("seed", range(3))
def test_a_run_leaves_the_book_and_counts_as_one_by_one_does(
    seed: int, faults: float, respell: bool
) -> None:
    rng = random.Random(seed)
    deltas = random_deltas(rng, 2, 3_000, faults, respell)
    frames = frames_of(deltas)
    one, runs = BookFeed(T), BookFeed(T)
    for feed in (one, runs):
        feed.offer(snap(1))
    whole = 0
    i = 0
    while i < len(frames):
        chunk = frames[i : i + rng.choice([1, RUN_MIN - 1, RUN_MIN, 50, 300, RUN_MAX])]
        i += len(chunk)
        books = [one.offer(decode_sub(f)[1]) for f in chunk]
        run = DeltaRun.read(chunk, TOPIC)
        if run is None:  # short, or a malformed level in it: one by one, as a subscription
            assert len(chunk) < RUN_MIN or faults
            got = [runs.offer(decode_sub(f)[1]) for f in chunk][-1]
        else:
            applied = runs.sync.counts[Verdict.APPLIED]
            got = runs.offer_run(run)
            whole += runs.sync.counts[Verdict.APPLIED] - applied == len(run) and not any(
                v for k, v in runs.sync.counts.items() if k is not Verdict.APPLIED
            )
            # handed out when one by one would have handed out the book after some delta
            assert (got is not None) == (
                any(b is not None for b in books) and one.sync.book is not None
            )
        assert same(one.sync, runs.sync), i
        if got is not None:
            assert got.position == one.sync.book.position
    if faults == 0.0:
        assert whole, "no run was applied whole"


@pytest.mark.parametrize(
    "price,size", [("abc", "1"), ("101", "nan"), ("101", "-1"), ("101", "x"), ("", "1")]
)
def test_a_run_with_one_bad_level_is_not_read_at_once(price: str, size: str) -> None:
    """It is taken one by one, as it came: the bad delta is dropped, so the one after it
    finds an update missing and the book waits for a snapshot."""
    deltas = [delta(s, bids=[("100", str(s))]) for s in range(2, 2 + RUN_MIN * 2)]
    deltas[RUN_MIN].asks.add(price=price, size=size)
    frames = frames_of(deltas)
    assert DeltaRun.read(frames[:RUN_MIN], TOPIC) is not None
    assert DeltaRun.read(frames, TOPIC) is None
    feed = BookFeed(T)
    feed.offer(snap(1))
    for f in frames:
        feed.offer(decode_sub(f)[1])
    counts = feed.sync.counts
    assert (counts[Verdict.APPLIED], counts[Verdict.MALFORMED], counts[Verdict.GAP]) == (
        RUN_MIN,
        1,
        1,
    )


@pytest.mark.parametrize("prev", [False, True], ids=["numbered", "chained"])
def test_a_run_after_a_missing_update_finds_the_gap(prev: bool) -> None:
    deltas = [delta(s, bids=[("100", str(s))]) for s in range(3, 3 + RUN_MIN)]
    for d in deltas if prev else ():
        d.prev_seq = d.venue_seq - 1  # the first chains to update 2, which the book lacks
    feed = BookFeed(T)
    feed.offer(snap(1))
    run = DeltaRun.read(frames_of(deltas), TOPIC)
    assert run is not None and not feed.sync.on_run(run)
    assert feed.offer_run(run) is None and feed.sync.needs_snapshot
    assert feed.sync.counts[Verdict.GAP] == 1


def test_a_run_that_is_not_one_after_another_or_not_all_deltas_is_not_read() -> None:
    deltas = [delta(s, bids=[("100", "1")]) for s in range(2, 2 + RUN_MIN)]
    frames = frames_of(deltas)
    assert DeltaRun.read(frames, TOPIC) is not None
    assert DeltaRun.read(frames[:-1], TOPIC) is None  # too short to be worth it
    assert DeltaRun.read(frames, b"OKX:BTC/USDT|tick") is None
    skipped = frames_of(deltas[:8], seq=1) + frames_of(deltas[8:], seq=10)
    assert DeltaRun.read(skipped, TOPIC) is None  # a position missing between them
    epochs = frames_of(deltas[:8], epoch=7) + frames_of(deltas[8:], epoch=8, seq=9)
    assert DeltaRun.read(epochs, TOPIC) is None
    mixed = [*frames[:-1], encode_topic(TOPIC.decode(), snap(20))]
    assert DeltaRun.read(mixed, TOPIC) is None
    torn = [list(f) for f in frames]
    torn[3][2] = torn[3][2][:-2]  # a payload cut short, whole again only with the next
    torn[4][2] = torn[4][2][:1] + frames[3][2][-2:] + torn[4][2][1:]
    assert DeltaRun.read(torn, TOPIC) is None


@pytest.mark.parametrize("respell", [True, False], ids=["respelled", "off the wire"])
@pytest.mark.parametrize("seed", range(6))
def test_any_byte_changed_in_a_run_gives_the_book_one_by_one_gives(
    seed: int, respell: bool
) -> None:
    """Frames as a hostile or broken relay might pass them on: one by one drops what does
    not decode (as a subscription's filter does) and judges the rest; a run may only ever
    reach the same book."""
    rng = random.Random(seed)
    for _ in range(40):
        deltas = random_deltas(rng, 2, RUN_MIN * 2, 0.05, respell)
        frames = [list(f) for f in frames_of(deltas)]
        for _ in range(rng.randint(1, 3)):
            f = frames[rng.randrange(len(frames))]
            body = bytearray(f[2])
            body[rng.randrange(1, len(body))] = rng.randrange(256)
            f[2] = bytes(body)
        one, runs = BookFeed(T), BookFeed(T)
        for feed in (one, runs):
            feed.offer(snap(1))
        for f in frames:
            with contextlib.suppress(EnvelopeError):
                one.offer(decode_sub(f)[1])
        run = DeltaRun.read(frames, TOPIC)
        if run is None:
            continue
        runs.offer_run(run)
        assert same(one.sync, runs.sync)


def test_a_received_run_is_cut_into_stretches_of_deltas_and_the_rest_in_order() -> None:
    deltas = frames_of([delta(s, bids=[("100", "1")]) for s in range(2, 2 + 3 * RUN_MIN)])
    head = encode_topic(TOPIC.decode(), StreamHead(topic=TOPIC.decode()))
    snapshot = encode_topic(TOPIC.decode(), snap(5))
    short = deltas[RUN_MIN : RUN_MIN + 3]
    received = [head, *deltas[:RUN_MIN], snapshot, *short, head, *deltas[2 * RUN_MIN :]]
    pieces = delta_pieces(received, TOPIC)
    assert [p if isinstance(p, list) else len(p) for p in pieces] == [
        [head],
        RUN_MIN,
        [snapshot, *short, head],
        RUN_MIN,
    ]
    assert [m for p in pieces for m in (p.frames if isinstance(p, DeltaRun) else p)] == received
    assert delta_pieces(received[:RUN_MIN], TOPIC) == [received[:RUN_MIN]]


@pytest.mark.parametrize("order", [("100.5", "100.50"), ("100.50", "100.5")])
def test_a_price_spelled_two_ways_in_a_run_ends_as_its_last_level_left_it(order) -> None:
    first, second = order
    deltas = [delta(s, bids=[("99", str(s))]) for s in range(2, 2 + RUN_MIN)]
    deltas[3].bids.add(price=first, size="1")
    deltas[5].bids.add(price=second, size="0")  # removed, in the other spelling
    deltas[7].bids.add(price=first, size="2")
    deltas[9].bids.add(price=second, size="3")  # and set again: this spelling stays
    one, runs = BookFeed(T), BookFeed(T)
    for feed in (one, runs):
        feed.offer(snap(1))
    frames = frames_of(deltas)
    for f in frames:
        one.offer(decode_sub(f)[1])
    run = DeltaRun.read(frames, TOPIC)
    assert run is not None and runs.sync.on_run(run)
    assert same(one.sync, runs.sync)
    assert runs.sync.book is not None and (second, "3") in runs.sync.book.texts(True)


@pytest.mark.parametrize("seed", range(4))
def test_a_run_s_levels_off_the_wire_equal_those_read_level_by_level(seed: int) -> None:
    """Read off the merged levels' bytes where the texts allow it, else None, which sends
    them level by level: never a different answer."""
    rng = random.Random(seed)
    odd = ["0x1", " 1", "1\t", "1" * 43, "\u0661", "", "1e3", "+2", "-0", ".5", "5."]
    wired = 0
    for _ in range(200):
        deltas = random_deltas(rng, 2, RUN_MIN, 0.0, respell=rng.random() < 0.2)
        if rng.random() < 0.3:
            d = rng.choice(deltas)
            d.bids.add(price=rng.choice(["101.5", *odd]), size=rng.choice(["1", *odd]))
        run = DeltaRun.read(frames_of(deltas), TOPIC)
        columns = _RUN_COLUMNS.FromString(
            b"".join(RUN_HEADS[len(p)] + p for p in (d.SerializeToString() for d in deltas))
        ).deltas
        counts = [sum(len(d.bids) for d in deltas), sum(len(d.asks) for d in deltas)]
        for levels, count in zip((columns.bids, columns.asks), counts, strict=True):
            off_wire = _wire_levels(levels, count)
            by_level = _text_levels(levels, count)
            if off_wire is not None:
                wired += 1
                assert off_wire == by_level
        sides = zip((columns.bids, columns.asks), counts, strict=True)
        assert (run is None) == any(_run_levels(lv, n) is None for lv, n in sides)
    assert wired > 100


@pytest.mark.parametrize(
    ("price", "size"),
    [("100", "1e-400"), ("100", "1e-19"), ("100", "1" * 21), ("1.0000000000000000001", "1")],
)
def test_a_level_the_tables_cannot_hold_is_malformed_everywhere(price: str, size: str) -> None:
    """Live, the book took any decimal; Iceberg rounded a 19th decimal away (a level of 0,
    two prices made one) or dropped the delta (a later ``history(at=)`` saw a gap). Now the
    one rule refuses it, on its own and in a run; "1e-400" was a removal (its float is 0)."""
    feed = BookFeed(T)
    feed.offer(snap(1, bids=(("100", "1"),)))
    assert feed.offer(delta(2, bids=((price, size),))) is None
    assert feed.sync.counts[Verdict.MALFORMED] == 1 and feed.sync.book is not None
    assert feed.sync.book.bids() == [(Decimal(100), Decimal(1))]
    deltas = [delta(s, bids=(("99", str(s)),)) for s in range(2, 2 + RUN_MIN)]
    deltas[3].bids.add(price=price, size=size)
    columns = _RUN_COLUMNS.FromString(
        b"".join(RUN_HEADS[len(p)] + p for p in (d.SerializeToString() for d in deltas))
    ).deltas
    assert _run_levels(columns.bids, RUN_MIN + 1) is None


def test_a_snapshot_of_a_venue_that_numbered_afresh_starts_the_book_over() -> None:
    """A venue may number its updates from 0 again on a reconnect; the ingestor starts over
    from the snapshot it takes then. A reader dropped it as older than its book, then every
    delta of the new numbers, and would have applied the later ones onto the old book."""

    def at(msg, seconds: int):
        msg.exchange_time_ns = seconds * 1_000_000_000
        return msg

    feed = BookFeed(T)
    feed.offer(at(snap(5_000), 10))
    assert feed.offer(at(delta(5_001, bids=(("100", "5"),)), 11)) is not None
    # Another ingestor's snapshot, older: nothing goes backwards. A periodic one never
    # starts a numbering.
    older = at(snap(4_000, bids=(("100", "9"),)), 9)
    older.reason = book_pb2.SNAPSHOT_START
    periodic = at(snap(40, bids=(("100", "9"),)), 12)
    periodic.reason = book_pb2.SNAPSHOT_PERIODIC
    for stale in (older, periodic):
        feed.offer(stale)
    assert feed.sync.counts[Verdict.STALE] == 2 and feed.sync.book is not None
    assert feed.sync.book.seq == 5_001 and feed.sync.book.bids(1) == [(Decimal(100), Decimal(5))]
    renumbered = at(snap(50, bids=(("100", "7"),)), 12)
    renumbered.reason = book_pb2.SNAPSHOT_SEQUENCE
    book = feed.offer(renumbered)
    assert book is not None and book.seq == 50
    book = feed.offer(at(delta(51, bids=(("100", "8"),)), 13))
    assert book is not None and book.bids(1) == [(Decimal(100), Decimal(8))]


def test_a_depth_of_zero_is_no_levels() -> None:
    book = Book.from_snapshot(snap(1))
    assert book.bids(0) == [] == book.asks(0) == book.texts(True, 0)
    assert len(book.bids()) == 2


def test_a_book_unchanged_since_since_is_handed_out_when_the_replay_ends() -> None:
    """A ``since=`` subscriber of a quiet book got nothing until the book next changed,
    though the replay had built it: it is handed out when the replay ends, as it stood at
    ``since``, once. A book that changed after ``since`` is handed out from there, as
    before, and not again at the replay's end."""
    s = 1_000_000_000

    def at(msg, seconds: int, seq: int = 0):
        msg.exchange_time_ns = seconds * s
        msg.stream.CopyFrom(StreamPosition(epoch=1, seq=seq or msg.venue_seq))
        return msg

    quiet = BookFeed(T, depth=1, from_ns=100 * s)
    assert quiet.offer(REPLAYED) is None  # nothing replayed: no book to hand out
    for msg in (at(snap(1), 10), at(delta(2, bids=(("100", "4"),)), 20)):
        assert quiet.offer(msg) is None  # before since
    book = quiet.offer(REPLAYED)
    assert book is not None and (book.seq, book.time_ns, book.position.seq) == (2, 20 * s, 2)
    assert book.bids() == [(Decimal(100), Decimal(4))]
    assert quiet.offer(REPLAYED) is None
    # Handed out, the book is handed at each change, whatever its time: a venue's clock
    # behind ours, or a feed replaying the past, stays before ``since`` for a while.
    assert quiet.offer(at(delta(3, bids=(("100", "5"),)), 30)) is book
    assert quiet.offer(at(delta(4, bids=(("100", "6"),)), 130)) is book

    ahead = BookFeed(T, from_ns=time.time_ns() + 3600 * s)  # ``since`` still to come
    ahead.offer(at(snap(1), 10))
    assert ahead.offer(REPLAYED) is None

    busy = BookFeed(T, from_ns=100 * s)
    busy.offer(at(snap(1), 10))
    assert busy.offer(at(delta(2, bids=(("100", "4"),)), 110)) is not None
    assert busy.offer(REPLAYED) is None

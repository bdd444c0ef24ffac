"""The book rule (candlewire.book): which delta applies, which waits, which untrusts a book."""

from __future__ import annotations

import zlib
from decimal import Decimal

import pytest

from candlewire.book import (
    Book,
    BookError,
    BookSync,
    Verdict,
    kraken_checksum,
    okx_checksum,
    replay,
)
from proto import book_pb2

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

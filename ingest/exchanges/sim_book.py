"""SIM's order book (#38): a pure function of the trades, so it is consistent with them and
any moment's book can be computed again (the tests' and ``bench.books``' oracle).

Update ``n`` follows trade ``n`` and sets the book the next trade hits: a buy at price ``p``
finds the best ask at ``p``, a sell finds the best bid there, and that touch level holds
more than the trade takes. The other levels sit on a grid of about 3 bp, ``DEPTH`` a side,
and each keeps its size for 16 updates at a time (staggered by price), so a delta carries
the levels the walk moved past and a few refreshed sizes, as a venue's would.
"""

from __future__ import annotations

from candlewire.book import okx_checksum_of
from ingest.exchanges.base import fmt_fixed
from proto import book_pb2

DEPTH = 20  # levels a side
REFRESH = 16  # updates a level keeps its size for
Side = dict[int, int]  # price ticks -> size lots


def grid_ticks(p0_ticks: int) -> int:
    """Level spacing in price ticks: about 3 bp of the symbol's starting price."""
    return 10 ** max(0, len(str(p0_ticks)) - 5)


def _size(key: int, price: int, bid: bool, n: int, grid: int) -> int:
    version = (n + price // grid) // REFRESH
    return 1 + hash((key, price, bid, version)) % 5000


def levels(key: int, grid: int, n: int, price: int, buy: bool, size: int) -> tuple[Side, Side]:
    """Bids and asks after update ``n``, whose next trade is ``buy`` of ``size`` at ``price``."""
    below = [((price - 1) // grid - k) * grid for k in range(DEPTH)]
    above = [(price // grid + 1 + k) * grid for k in range(DEPTH)]
    bid_prices, ask_prices = (below, [price, *above[:-1]]) if buy else ([price, *below[:-1]], above)
    bids = {q: _size(key, q, True, n, grid) for q in bid_prices}
    asks = {q: _size(key, q, False, n, grid) for q in ask_prices}
    (asks if buy else bids)[price] += size  # the touch holds more than the trade takes
    return bids, asks


def diff(old: Side, new: Side) -> list[tuple[int, int]]:
    """The levels that changed from ``old`` to ``new``; size 0 for one that went."""
    changed = [(q, s) for q, s in new.items() if old.get(q) != s]
    return changed + [(q, 0) for q in old if q not in new]


class BookText:
    """Integer levels as venue messages, in SIM's decimals."""

    def __init__(self, ticker: str, price_decimals: int, size_decimals: int) -> None:
        self.ticker, self.pd, self.sd = ticker, price_decimals, size_decimals

    def texts(self, price: int, size: int) -> tuple[str, str]:
        return fmt_fixed(price, self.pd), fmt_fixed(size, self.sd)

    def level(self, price: int, size: int) -> book_pb2.BookLevel:
        price_text, size_text = self.texts(price, size)
        return book_pb2.BookLevel(price=price_text, size=size_text)

    def snapshot(
        self, n: int, time_ns: int, bids: Side, asks: Side, reason: book_pb2.SnapshotReason
    ) -> book_pb2.BookSnapshot:
        return book_pb2.BookSnapshot(
            ticker=self.ticker,
            venue_seq=n,
            exchange_time_ns=time_ns,
            bids=[self.level(q, bids[q]) for q in sorted(bids, reverse=True)],
            asks=[self.level(q, asks[q]) for q in sorted(asks)],
            reason=reason,
        )

    def delta(
        self, n: int, time_ns: int, old: tuple[Side, Side], new: tuple[Side, Side]
    ) -> book_pb2.BookDelta:
        """The delta from ``old`` to ``new``, with the OKX-formula checksum of ``new``."""
        delta = book_pb2.BookDelta(
            ticker=self.ticker,
            venue_seq=n,
            exchange_time_ns=time_ns,
            bids=[self.level(q, s) for q, s in diff(old[0], new[0])],
            asks=[self.level(q, s) for q, s in diff(old[1], new[1])],
        )
        bids, asks = new
        delta.checksum = okx_checksum_of(
            [self.texts(q, bids[q]) for q in sorted(bids, reverse=True)[:25]],
            [self.texts(q, asks[q]) for q in sorted(asks)[:25]],
        )
        return delta


def malformed(delta: book_pb2.BookDelta) -> book_pb2.BookDelta:
    """The delta with a level whose price is no number: what ``book:malformed`` sends."""
    bad = book_pb2.BookDelta()
    bad.CopyFrom(delta)
    bad.bids.add(price="not-a-price", size="1")
    return bad


def corrupt(delta: book_pb2.BookDelta) -> book_pb2.BookDelta:
    """The delta with one level change lost, its checksum still the venue's true one: what
    ``book:checksum`` sends."""
    bad = book_pb2.BookDelta()
    bad.CopyFrom(delta)
    side = bad.bids if len(bad.bids) else bad.asks
    if len(side):
        del side[0]
    else:  # nothing changed: claim a level that is not there
        bad.bids.add(price="1", size="1")
    return bad

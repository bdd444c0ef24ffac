"""A client's maintained L2 book (#38): how many deltas a second it takes, and whether it
stays SIM's book.

SIM's own updates for one ticker, as the stream job publishes them (the wire envelope, a
stream position each), go through what a ``subscribe(ticker, "book")`` runs on what it
received: runs of up to ``RUN_MAX`` messages cut into pieces (:func:`delta_pieces`), each
stretch of deltas read and applied at once (:class:`DeltaRun`, ``BookFeed.offer_run``) and
any other message decoded and offered alone. Sockets are left out: the relay and the
subscription core have benches of their own (``bench.relay``, ``bench.subscribe``).

- ``deltas_per_s``: as a subscriber that is behind takes them (runs of ``RUN_MAX``), the
  median of three passes over ``--deltas`` updates, after an untimed one (a client's first
  run imports pyarrow's compute functions, about 0.3 s, once); ``deltas_per_s_one_by_one``: each
  decoded and applied alone, as a subscriber that keeps up takes them, in the same run;
- ``mismatches``: of ``--samples`` moments spread over them, how many books differ from
  SIM's own book at that update (``SimExchange.book_at``), with the updates taken in runs
  of random lengths (a run of 16 or more deltas is read at once), so books come both ways;
- ``rebuild_s``: a whole day of updates at SIM's default rate (86,400) replayed onto the
  day's first snapshot, which is what ``history(ticker, "book", at=T)`` does after reading
  Iceberg when no later snapshot is held (it reads one at most 30 s old in practice).

The last line is JSON.

    python -m bench.books [--deltas 50000] [--samples 1000] [--rate 20]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from candlewire.book import RUN_MAX, Book, BookFeed, DeltaRun, delta_pieces, replay
from ingest.exchanges.sim import SimExchange
from proto import book_pb2
from proto.envelope import decode_sub, encode_topic
from proto.market_pb2 import StreamPosition

TICKER = "SIM:BTC/USDT"
TOPIC = f"{TICKER}|book"
DAY_UPDATES = 86_400


def sim_updates(sim: SimExchange, first: int, count: int) -> list[book_pb2.BookDelta]:
    """SIM's deltas for updates first+1 .. first+count, as its book stream sends them."""
    sym, text, per = sim.symbol(TICKER), sim._book_text(TICKER), sim.per_minute
    out: list[book_pb2.BookDelta] = []
    prev = sim._book_states(sym, first, first + 1)[0][2]
    n = first + 1
    while len(out) < count:
        end = min((n // per + 1) * per, first + 1 + count)
        for m, time_ns, book in sim._book_states(sym, n, end):
            out.append(text.delta(m, time_ns, prev, book))
            prev = book
        n = end
    return out


def wire(snapshot: book_pb2.BookSnapshot, deltas: list[book_pb2.BookDelta]) -> list[list[bytes]]:
    """Each message as the stream job publishes it: topic, version, type + body, positioned."""
    frames = []
    for seq, msg in enumerate([snapshot, *deltas], start=1):
        msg.stream.CopyFrom(StreamPosition(epoch=1, seq=seq, publish_time_ms=0, source_offset=-1))
        frames.append(encode_topic(TOPIC, msg))
    return frames


def take(feed: BookFeed, received: list[list[bytes]]) -> Book | None:
    """What a book subscription does with messages received one after another: the book as
    it hands it out after them (None: not changed, or not trusted)."""
    book = None
    for piece in delta_pieces(received, TOPIC.encode()):
        if isinstance(piece, DeltaRun):
            book = feed.offer_run(piece) or book
        else:
            for f in piece:
                book = feed.offer(decode_sub(f)[1]) or book
    return book if feed.sync.book is book else None


def apply_all(frames: list[list[bytes]], run: int) -> float:
    """Seconds to decode and apply every message, taken ``run`` at a time."""
    feed = BookFeed(TICKER)
    started = time.perf_counter()
    for i in range(0, len(frames), run):
        take(feed, frames[i : i + run])
    return time.perf_counter() - started


def mismatches(
    sim: SimExchange, frames: list[list[bytes]], first: int, samples: int
) -> tuple[int, int]:
    """(books that differ from SIM's, books compared) at about ``samples`` evenly spread
    moments, the updates taken in runs of random lengths up to 64."""
    feed, rng = BookFeed(TICKER), random.Random(1)
    every = max(1, (len(frames) - 1) // samples)
    wrong = compared = i = 0
    while i < len(frames):
        n = min(rng.choice([1, rng.randint(2, 64)]), len(frames) - i)
        book, i = take(feed, frames[i : i + n]), i + n
        if book is None or (i - 1) // every == (i - 1 - n) // every:
            continue  # no sampled moment in this run
        compared += 1
        truth = Book.from_snapshot(sim.book_at(TICKER, book.seq))
        wrong += not book.same_levels(truth) or book.seq != first + i - 1
    return wrong, compared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=50_000)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20.0, help="SIM trades (updates) a second")
    args = parser.parse_args()

    sim = SimExchange(rate=args.rate)
    first = sim.book_seq_at(TICKER, time.time_ns()) - args.deltas - 1
    t0 = time.perf_counter()
    snapshot, deltas = sim.book_at(TICKER, first), sim_updates(sim, first, args.deltas)
    frames = wire(snapshot, deltas)
    made_s = time.perf_counter() - t0
    apply_all(frames, RUN_MAX)  # untimed: the first imports pyarrow's compute functions
    passes = [apply_all(frames, RUN_MAX) for _ in range(3)]
    alone = [apply_all(frames, 1) for _ in range(3)]
    wrong, compared = mismatches(sim, frames, first, args.samples)

    day = SimExchange()  # the default rate: one update a second, 86,400 a day
    day_first = day.book_seq_at(TICKER, time.time_ns()) - DAY_UPDATES - 1
    day_snapshot, day_deltas = (
        day.book_at(TICKER, day_first),
        sim_updates(day, day_first, DAY_UPDATES),
    )
    t0 = time.perf_counter()
    rebuilt, _ = replay(day_snapshot, day_deltas)
    rebuild_s = time.perf_counter() - t0
    rebuilt_right = rebuilt.same_levels(Book.from_snapshot(day.book_at(TICKER, rebuilt.seq)))

    levels = sum(len(d.bids) + len(d.asks) for d in deltas) / len(deltas)
    print(
        json.dumps(
            {
                "deltas_per_s": round(len(frames) / statistics.median(passes)),
                "passes_s": [round(p, 3) for p in passes],
                "deltas_per_s_one_by_one": round(len(frames) / statistics.median(alone)),
                "levels_per_delta": round(levels, 1),
                "mismatches": wrong + (not rebuilt_right),
                "compared": compared + 1,
                "rebuild_s": round(rebuild_s, 3),
                "rebuild_deltas": DAY_UPDATES,
                "generate_s": round(made_s, 1),
                "deltas": args.deltas,
            }
        )
    )


if __name__ == "__main__":
    main()

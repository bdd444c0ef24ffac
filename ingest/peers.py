"""Which ingestor does a piece of work: heartbeats and rendezvous hashing, no coordinator.

The relay's work queue is PUB/SUB, so every ingestor of an exchange receives every request.
Each one also hears every peer's heartbeat (published through the relay's fanout), so all
hold the same view of who is alive, and each request has exactly one owner:

1. a live peer that lists the work in its heartbeat's ``working`` keeps it (sticky), else
2. the live, work-taking peer with the highest hash of (work key, peer id) takes it.

When an owner dies (3 missed heartbeats) or says DONE, the next-ranked peer takes its work
over, because every peer kept the request until it saw it listed as ``done``. Views can
briefly disagree (a stalled heartbeat looks like a death), so two peers may both start a
piece of work; for a live stream, which never ends by itself, the lower-ranked one yields
as soon as it hears the other working on it. A peer that
just started stays READY for a few heartbeats, learning the view before it takes work.

Heartbeats also carry each live stream's last trade (``tails``). A peer that takes over
the stream of one that died starts from that tail: the trades between it and its own first
one form a TAKEOVER gap (:mod:`ingest.gaps`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from proto import requests_pb2 as rq

MISSED_BEATS = 3
LONGEST_BEAT_S = 60.0  # a heartbeat claiming a longer interval is held to this
TAKING_WORK = (rq.AVAILABLE, rq.BUSY)


def rank(key: str, peer_id: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(f"{key}|{peer_id}".encode(), digest_size=8).digest(), "big"
    )


@dataclass
class Peer:
    state: int
    seen: float
    interval_s: float
    working: frozenset[str] = frozenset()


@dataclass
class PeerView:
    self_id: str
    peers: dict[str, Peer] = field(default_factory=dict)
    done: OrderedDict[str, float] = field(default_factory=OrderedDict)
    done_limit: int = 10_000
    # ticker → (peer, its stream's last trade) as last announced, while the peer streams it
    tails: OrderedDict[str, tuple[str, rq.StreamTail]] = field(default_factory=OrderedDict)
    tails_limit: int = 10_000

    def observe(self, hb: rq.IngestorControl, now: float) -> None:
        if hb.ingestor_id == self.self_id:
            return
        self._observe_tails(hb)
        if hb.state == rq.DONE:
            self.peers.pop(hb.ingestor_id, None)
        else:
            self.peers[hb.ingestor_id] = Peer(
                hb.state,
                now,
                min(max(hb.interval_ms / 1000, 0.1), LONGEST_BEAT_S),
                frozenset(hb.working),
            )
        for rid in hb.done:
            self.mark_done(rid, now)

    def _observe_tails(self, hb: rq.IngestorControl) -> None:
        """Remember the peer's tails; forget those of streams it ended while alive (a cancel
        or a yield loses nothing), keep them when it says DONE (it hands them over)."""
        announced = {t.ticker for t in hb.tails}
        if hb.state != rq.DONE:
            for ticker in [t for t, (pid, _) in self.tails.items() if pid == hb.ingestor_id]:
                if ticker not in announced:
                    del self.tails[ticker]
        for tail in hb.tails:
            self.tails[tail.ticker] = (hb.ingestor_id, tail)
            self.tails.move_to_end(tail.ticker)
        while len(self.tails) > self.tails_limit:
            self.tails.popitem(last=False)

    def takeover_tail(
        self, ticker: str, now: float, now_ns: int, horizon_s: float
    ) -> rq.StreamTail | None:
        """The last trade a peer that is gone announced for ``ticker``, once, where a stream
        we start now takes over from; None if a live peer announced it, or it is older
        than ``horizon_s`` (a stream stopped that long ago left no gap worth filling)."""
        entry = self.tails.get(ticker)
        if entry is None:
            return None
        pid, tail = entry
        if pid in self.alive(now):
            return None
        del self.tails[ticker]
        return tail if tail.time_ns >= now_ns - horizon_s * 1e9 else None

    def mark_done(self, key: str, now: float) -> None:
        self.done[key] = now
        self.done.move_to_end(key)
        while len(self.done) > self.done_limit:
            self.done.popitem(last=False)

    def alive(self, now: float) -> dict[str, Peer]:
        """Peers heard within their last beats; the others are forgotten (a crashed peer
        sends no DONE, and every restart is a new id), and come back with a heartbeat."""
        live = {
            pid: p for pid, p in self.peers.items() if now - p.seen <= MISSED_BEATS * p.interval_s
        }
        if len(live) < len(self.peers):
            self.peers = dict(live)
        return live

    def owner(self, key: str, now: float, self_taking: bool) -> str | None:
        live = self.alive(now)
        for pid, p in live.items():
            if key in p.working:
                return pid
        candidates = [pid for pid, p in live.items() if p.state in TAKING_WORK]
        if self_taking:
            candidates.append(self.self_id)
        return max(candidates, key=lambda pid: rank(key, pid), default=None)

    def outranked(self, key: str, now: float) -> bool:
        """Another live peer works on ``key`` too and outranks us: ours is the duplicate."""
        mine = rank(key, self.self_id)
        return any(key in p.working and rank(key, pid) > mine for pid, p in self.alive(now).items())

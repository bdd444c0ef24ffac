"""Ownership from heartbeats: one owner per piece of work, duplicates resolve by rank."""

from __future__ import annotations

from ingest.peers import PeerView, rank
from proto import requests_pb2 as rq


def beat(peer: str, working: list[str] | None = None, state: int = rq.AVAILABLE):
    return rq.IngestorControl(
        action=rq.HEARTBEAT,
        ingestor_id=peer,
        state=state,
        working=working or [],
        interval_ms=1000,
    )


def test_every_peer_agrees_on_one_owner() -> None:
    views = {p: PeerView(p) for p in ("a", "b", "c")}
    for v in views.values():
        for p in views:
            v.observe(beat(p), 0.0)
    owners = {v.owner("stream:X", 0.5, True) for v in views.values()}
    assert owners == {max("abc", key=lambda p: rank("stream:X", p))}


def test_a_peer_working_on_it_keeps_it_until_it_misses_three_beats() -> None:
    view = PeerView("a")
    loser = min("bc", key=lambda p: rank("k", p))
    view.observe(beat(loser, ["k"]), 0.0)
    assert view.owner("k", 2.9, True) == loser
    assert view.owner("k", 3.1, True) == "a", "dead after 3 missed heartbeats"


def test_the_lower_ranked_of_two_duplicates_yields() -> None:
    hi, lo = sorted(("a", "b"), key=lambda p: rank("stream:X", p), reverse=True)
    lo_view, hi_view = PeerView(lo), PeerView(hi)
    lo_view.observe(beat(hi, ["stream:X"]), 0.0)
    hi_view.observe(beat(lo, ["stream:X"]), 0.0)
    assert lo_view.outranked("stream:X", 0.5) and not hi_view.outranked("stream:X", 0.5)
    assert not lo_view.outranked("stream:X", 5.0), "a dead peer outranks nobody"


def test_peers_that_died_are_forgotten_and_one_beat_brings_them_back() -> None:
    # A crashed peer sends no DONE and every restart is a new id: kept, they piled up.
    view = PeerView("a")
    for i in range(1000):
        view.observe(beat(f"crashed-{i}"), 0.0)
    view.observe(beat("b"), 9.0)
    assert list(view.alive(10.0)) == ["b"] and list(view.peers) == ["b"]
    view.observe(beat("crashed-7"), 11.0)
    assert set(view.alive(11.5)) == {"b", "crashed-7"}


def test_a_heartbeat_claiming_a_day_long_interval_does_not_keep_a_dead_owner() -> None:
    view = PeerView("a")
    ghost = beat("ghost", ["stream:X"])
    ghost.interval_ms = 2**31 - 1
    view.observe(ghost, 0.0)
    assert view.owner("stream:X", 60.0, True) == "ghost"
    assert view.owner("stream:X", 181.0, True) == "a", "held to a beat of 60 s: dead at 180"

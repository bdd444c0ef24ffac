"""bench.quick's rules on made-up figures: what it flags decides whether a regression is
caught, and none of these tests runs a bench."""

from __future__ import annotations

import json

from bench.quick import BENCHES, Run, compare, last_json, updated_baseline

HERE = {"hostname": "box", "cpus": 2, "cpu_model": "Xeon"}
ELSEWHERE = {"hostname": "laptop", "cpus": 8, "cpu_model": "M3"}


def entry(figures: dict[str, float], machine: dict = HERE, bench: str = "relay") -> dict:
    return {"figures": figures, "machine": machine, "args": list(BENCHES[bench].args)}


def row(rows, key: str):
    (found,) = [r for r in rows if r.key == key]
    return found


RELAY = {"ratio": 0.9, "ratio_1_subscriber": 0.9, "relay_msgs_per_s": 400_000}


def test_a_rate_25_percent_worse_is_flagged_and_10_percent_is_not() -> None:
    rows = compare("relay", {**RELAY, "relay_msgs_per_s": 300_000}, entry(RELAY), HERE)
    assert row(rows, "relay_msgs_per_s").status == "worse"
    assert row(rows, "relay_msgs_per_s").flagged
    rows = compare("relay", {**RELAY, "relay_msgs_per_s": 360_000}, entry(RELAY), HERE)
    assert row(rows, "relay_msgs_per_s").status == "ok"


def test_better_figures_are_not_flagged() -> None:
    rows = compare("relay", {**RELAY, "ratio": 1.2}, entry(RELAY), HERE)
    assert row(rows, "ratio").status == "ok"
    assert abs(row(rows, "ratio").change - 1.2 / 0.9 + 1) < 1e-9


def test_a_latency_is_worse_when_it_grows() -> None:
    base = {"submit_to_ready_s": 20.0, "read_s": 0.5}
    history = entry(base, bench="history")
    slower = compare("history", {"submit_to_ready_s": 25.0, "read_s": 0.5}, history, HERE)
    assert row(slower, "submit_to_ready_s").status == "worse"
    faster = compare("history", {"submit_to_ready_s": 15.0, "read_s": 0.3}, history, HERE)
    assert {r.status for r in faster} == {"ok"}


def test_a_small_latency_change_within_the_slack_is_noise() -> None:
    base = {"submit_to_ready_s": 20.0, "read_s": 0.2}
    rows = compare(
        "history", {"submit_to_ready_s": 20.0, "read_s": 0.28}, entry(base, bench="history"), HERE
    )
    assert row(rows, "read_s").status == "ok"  # 40 % worse, but 80 ms


def test_a_ratio_is_compared_on_any_machine_an_absolute_rate_only_on_its_own() -> None:
    now = {"ratio": 0.6, "ratio_1_subscriber": 0.9, "relay_msgs_per_s": 100_000}
    rows = compare("relay", now, entry(RELAY, machine=ELSEWHERE), HERE)
    assert row(rows, "ratio").status == "worse"
    absolute = row(rows, "relay_msgs_per_s")
    assert absolute.status == "not compared"
    assert absolute.note == "not compared: other machine"
    assert not absolute.flagged


def test_lost_or_duplicated_above_zero_is_flagged_whatever_the_baseline() -> None:
    base = {"replay_msgs_per_s": 300_000, "lost": 0, "duplicated": 0, "live_p99_ms_sequenced": 10}
    now = {**base, "lost": 1}
    rows = compare("replay", now, entry(base, machine=ELSEWHERE, bench="replay"), HERE)
    assert row(rows, "lost").status == "nonzero"
    assert row(rows, "duplicated").status == "ok"
    assert row(compare("replay", now, None, HERE), "lost").flagged


def test_without_a_baseline_nothing_but_losses_is_flagged() -> None:
    rows = compare("relay", RELAY, None, HERE)
    assert {r.status for r in rows} == {"no baseline"}


def test_a_failed_bench_or_a_missing_figure_is_flagged() -> None:
    assert all(r.status == "failed" for r in compare("relay", None, entry(RELAY), HERE))
    rows = compare("relay", {"ratio": 0.9}, entry(RELAY), HERE)
    assert row(rows, "relay_msgs_per_s").status == "missing"
    assert row(rows, "relay_msgs_per_s").flagged


def test_figures_measured_with_other_settings_are_not_compared() -> None:
    old = {**entry(RELAY), "args": ["--messages", "1000"]}
    rows = compare("relay", {**RELAY, "ratio": 0.1}, old, HERE)
    assert row(rows, "ratio").status == "not compared"


def test_the_result_is_the_last_json_line_whatever_is_logged_after_it() -> None:
    out = 'published\n{"a": 1}\n{"a": 2, "b": 3}\n%3|rdkafka| Connect failed\n'
    assert last_json(out) == {"a": 2, "b": 3}
    assert last_json("no result\n") is None


def test_update_replaces_only_the_benches_that_ran_and_keeps_their_key_figures() -> None:
    old = {"benches": {"history": {"figures": {"read_s": 0.5}}, "relay": {"figures": {}}}}
    runs = [
        Run("relay", 25.0, 0, {**RELAY, "direct_msgs_per_s": 1, "cores": 2}),
        Run("ingest", 9.0, 1, None),
    ]
    new = updated_baseline(old, runs, HERE)
    json.dumps(new)  # it is written as JSON
    assert new["benches"]["history"] == old["benches"]["history"]
    assert "ingest" not in new["benches"]
    relay = new["benches"]["relay"]
    assert relay["figures"] == RELAY
    assert relay["machine"] == HERE
    assert {"date", "commit", "dirty", "args"} <= relay.keys()

"""The short benchmarks against bench/baseline.json, so a change to a hot path that costs
speed is caught before it is committed (#35).

Runs relay, replay, ingest, events, history, the committing plan, books and archive (about five
minutes on two cores), each as ``python -m bench.X`` with the settings below, reads each one's
JSON last line and prints its key figures beside the baseline. A figure more than 20 % worse
is flagged, as is any lost or duplicated tick. A ratio against a reference measured in the
same run (relay ÷ direct, ingest ÷ Kafka's perf tool, the committing plan ÷ Spark's read)
holds on any machine and is always compared; an absolute rate or latency is compared only
when the baseline was measured on this machine.

    python -m bench.quick [--only relay,replay] [--update] [--json]

``--update`` records this run's figures as the baseline, with the date, the commit and the
machine. The exit status is 1 when something is flagged or a bench failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "bench" / "baseline.json"
THRESHOLD = 0.20  # worse by more than this share is a regression
BENCH_TIMEOUT_S = 600.0  # one bench that runs this long has hung

Kind = Literal["ratio", "absolute", "zero"]


@dataclass(frozen=True)
class Figure:
    """One key figure of a bench's JSON.

    ``ratio``: against a reference measured in the same run, so comparable across machines;
    ``absolute``: a rate or a latency, comparable only on the machine that measured it;
    ``zero``: a count that must be 0 (lost, duplicated), whatever the baseline.
    ``slack``: a difference this small is never flagged (a 2 ms p99 that becomes 3 ms is
    noise, not a 50 % regression).
    """

    key: str
    kind: Kind
    better: Literal["higher", "lower"] = "higher"
    slack: float = 0.0


@dataclass(frozen=True)
class Bench:
    args: tuple[str, ...]
    figures: tuple[Figure, ...]


# Settings measured to keep them about five minutes together (history's private stack alone
# takes about 75 s to start; the committing plan's half-million ticks about 90 s).
BENCHES: dict[str, Bench] = {
    "relay": Bench(
        (),
        (
            Figure("ratio", "ratio"),
            Figure("ratio_1_subscriber", "ratio"),
            Figure("relay_msgs_per_s", "absolute"),
        ),
    ),
    "replay": Bench(
        (),
        (
            Figure("replay_msgs_per_s", "absolute"),
            Figure("replay_arrow_rows_per_s", "absolute"),
            Figure("replay_arrow_client_cpu_us_per_row", "absolute", "lower", slack=0.1),
            Figure("replay_arrow_journal_cpu_us_per_row", "absolute", "lower", slack=0.1),
            Figure("lost", "zero"),
            Figure("duplicated", "zero"),
            Figure("live_p99_ms_sequenced", "absolute", "lower", slack=5.0),
        ),
    ),
    "ingest": Bench(
        ("--seconds", "5"),
        (
            Figure("ratio", "ratio"),
            Figure("ingest_ticks_per_s", "absolute"),
        ),
    ),
    "events": Bench(
        (),
        (
            Figure("informational_vs_raw", "ratio"),
            Figure("critical_events_per_s", "absolute"),
            Figure("critical_p99_ms", "absolute", "lower", slack=5.0),
            Figure("informational_events_per_s", "absolute"),
            # The gateway's own cost, whatever else shares the cores with it.
            Figure("informational_gateway_cpu_us_per_event", "absolute", "lower", slack=3.0),
            Figure("critical_gateway_cpu_us_per_event", "absolute", "lower", slack=10.0),
            # Its Python for an event in this process alone: the least moved by the swings.
            Figure("informational_path_us_per_event", "absolute", "lower", slack=0.5),
        ),
    ),
    "history": Bench(
        (),
        (
            Figure("submit_to_ready_s", "absolute", "lower", slack=2.0),
            Figure("read_s", "absolute", "lower", slack=0.1),
        ),
    ),
    "archive": Bench(
        (),
        (
            Figure("archive_rows_per_s", "absolute"),
            Figure("first_vs_last_chunks", "ratio", "lower", slack=0.5),
            Figure("lost", "zero"),
            Figure("duplicated", "zero"),
        ),
    ),
    "commit": Bench(
        ("--ticks", "500000", "--rounds", "5"),
        (
            # The committing plan's rates over Spark's own read in the same session: the
            # stream queries' and jvm/'s cost, without the job's other parts sharing the cores.
            Figure("judge_ratio", "ratio"),
            Figure("commit_ratio", "ratio"),
            Figure("commit_per_s", "absolute"),
            Figure("lost", "zero"),
            Figure("duplicated", "zero"),
            Figure("tickers_differing", "zero"),
        ),
    ),
    "books": Bench(
        ("--deltas", "20000", "--samples", "200"),
        (
            Figure("deltas_per_s", "absolute"),
            Figure("deltas_per_s_one_by_one", "absolute"),
            Figure("rebuild_s", "absolute", "lower", slack=0.2),
            Figure("mismatches", "zero"),
        ),
    ),
}

Status = Literal["ok", "worse", "nonzero", "missing", "failed", "not compared", "no baseline"]
FLAGGED: frozenset[str] = frozenset({"worse", "nonzero", "missing", "failed"})


@dataclass
class Row:
    bench: str
    key: str
    now: float | None
    baseline: float | None
    change: float | None  # now / baseline - 1: the sign says higher, not better
    status: Status
    note: str = ""

    @property
    def flagged(self) -> bool:
        return self.status in FLAGGED


def machine() -> dict[str, object]:
    """What makes absolute figures comparable: the same host, cores and CPU model."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"hostname": platform.node(), "cpus": os.cpu_count(), "cpu_model": model}


def compare(
    bench: str,
    figures: dict[str, float] | None,
    entry: dict | None,
    here: dict[str, object],
    threshold: float = THRESHOLD,
) -> list[Row]:
    """One bench's figures against its baseline ``entry`` (``None``: none recorded), as rows.

    ``figures`` is ``None`` when the bench failed. Pure, so the rules are tested without
    running a bench.
    """
    spec = BENCHES[bench]
    base = (entry or {}).get("figures", {})
    other_machine = entry is not None and entry.get("machine") != here
    other_settings = entry is not None and list(entry.get("args", [])) != list(spec.args)
    rows = []
    for fig in spec.figures:
        was = base.get(fig.key)
        if figures is None:
            rows.append(Row(bench, fig.key, None, was, None, "failed", "bench failed"))
            continue
        now = figures.get(fig.key)
        if now is None:
            rows.append(Row(bench, fig.key, None, was, None, "missing", "missing from its JSON"))
            continue
        change = now / was - 1 if was else None
        if fig.kind == "zero":
            status: Status = "nonzero" if now != 0 else "ok"
            note = "must be 0" if now != 0 else ""
            rows.append(Row(bench, fig.key, now, was, change, status, note))
        elif was is None:
            rows.append(Row(bench, fig.key, now, None, None, "no baseline", "no baseline"))
        elif other_settings:
            note = "not compared: other settings"
            rows.append(Row(bench, fig.key, now, was, change, "not compared", note))
        elif fig.kind == "absolute" and other_machine:
            note = "not compared: other machine"
            rows.append(Row(bench, fig.key, now, was, change, "not compared", note))
        else:
            loss = now - was if fig.better == "lower" else was - now
            share = loss / abs(was) if was else (float("inf") if loss > 0 else 0.0)
            worse = share > threshold and loss > fig.slack
            note = f"{share:.1%} worse" if worse else ""
            rows.append(Row(bench, fig.key, now, was, change, "worse" if worse else "ok", note))
    return rows


def last_json(output: str) -> dict | None:
    """The last line that is a JSON object: a bench's result (libraries may log after it)."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


@dataclass
class Run:
    name: str
    seconds: float
    returncode: int
    result: dict | None
    tail: list[str] = field(default_factory=list)
    ended: datetime = field(default_factory=lambda: datetime.now(UTC))
    load_1m: float = field(default_factory=lambda: os.getloadavg()[0])  # as it ended


def run_bench(name: str, on_line: Callable[[str], None]) -> Run:
    """``python -m bench.<name>`` with its quick settings; every output line to ``on_line``.

    A hung bench gets SIGINT, so its ``finally`` blocks stop the brokers it started."""
    cmd = [sys.executable, "-m", f"bench.{name}", *BENCHES[name].args]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    watchdog = threading.Timer(BENCH_TIMEOUT_S, proc.send_signal, (signal.SIGINT,))
    watchdog.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            on_line(lines[-1])
        proc.wait()
    except KeyboardInterrupt:  # the bench got the Ctrl-C too: let it stop what it started
        proc.wait(60)
        raise
    finally:
        watchdog.cancel()
    result = last_json("\n".join(lines)) if proc.returncode == 0 else None
    return Run(name, time.monotonic() - started, proc.returncode, result, lines[-30:])


def git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def load_baseline(path: Path = BASELINE) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"benches": {}}


def updated_baseline(baseline: dict, runs: list[Run], here: dict[str, object]) -> dict:
    """``baseline`` with the entries of the benches that succeeded in this run replaced."""
    commit, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain") not in ("", "unknown")
    benches = dict(baseline.get("benches", {}))
    for run in runs:
        if run.result is None:
            continue
        benches[run.name] = {
            "date": run.ended.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": commit,
            "dirty": dirty,
            "machine": here,
            "load_1m": round(run.load_1m, 2),
            "args": list(BENCHES[run.name].args),
            "seconds": round(run.seconds, 1),
            "figures": {
                f.key: run.result[f.key] for f in BENCHES[run.name].figures if f.key in run.result
            },
        }
    return {
        "about": "Key figures of `make bench-quick` (python -m bench.quick); "
        "rewrite with `python -m bench.quick --update`.",
        "benches": dict(sorted(benches.items())),
    }


def number(value: float | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}"


STYLE = {"worse": "bold red", "nonzero": "bold red", "missing": "red", "failed": "bold red"}


def table(rows: list[Row]) -> Table:
    out = Table(title=f"bench-quick: flagged when more than {THRESHOLD:.0%} worse")
    for name in ("figure", "now", "baseline", "change", "flag"):
        right = name in ("now", "baseline", "change")
        out.add_column(name, justify="right" if right else "left", no_wrap=name != "flag")
    benches = list(dict.fromkeys(row.bench for row in rows))
    for bench in benches:
        mine = [row for row in rows if row.bench == bench]
        for i, row in enumerate(mine):
            change = "—" if row.change is None else f"{row.change:+.1%}"
            flag = f"✗ {row.note}" if row.flagged else row.note
            style = STYLE.get(row.status, "dim" if row.status == "not compared" else "")
            out.add_row(
                f"{bench} {row.key}",
                number(row.now),
                number(row.baseline),
                change,
                escape(flag),
                style=style,
                end_section=i == len(mine) - 1,
            )
    return out


def provenance(benches: list[str], baseline: dict, here: dict[str, object]) -> list[str]:
    """Where the baselines come from: one line per commit, day and machine."""
    measured: dict[str, list[str]] = {}
    for bench in benches:
        entry = baseline.get("benches", {}).get(bench)
        if entry:
            where = "this machine" if entry.get("machine") == here else "another machine"
            dirty = " + uncommitted changes" if entry.get("dirty") else ""
            at = f"{entry['commit'][:10]}{dirty}, {entry['date'][:10]}, {where}"
            measured.setdefault(at, []).append(bench)
    return [f"baseline of {', '.join(b)}: {at}" for at, b in measured.items()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description="The short benchmarks, their key figures beside bench/baseline.json."
    )
    parser.add_argument("--only", help="comma-separated benches, of: " + ",".join(BENCHES))
    parser.add_argument("--update", action="store_true", help="record this run as the baseline")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown bench(es): {', '.join(unknown)}; known: {', '.join(BENCHES)}")

    progress_console = Console(stderr=True)
    here, baseline = machine(), load_baseline()
    runs: list[Run] = []
    started, load_before = time.monotonic(), os.getloadavg()[0]
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[line]}", markup=False),
        console=progress_console,
        transient=True,
    ) as progress:
        for i, name in enumerate(names, 1):
            command = " ".join(["python -m", f"bench.{name}", *BENCHES[name].args])
            progress.console.print(escape(f"[{i}/{len(names)}] {command}"))
            task = progress.add_task(f"bench.{name}", total=None, line="")
            run = run_bench(name, lambda line, t=task: progress.update(t, line=line[:70]))
            progress.remove_task(task)
            runs.append(run)
            verdict = "done" if run.result is not None else f"[red]failed ({run.returncode})"
            progress.console.print(f"      {verdict} in {run.seconds:.0f} s")
            if run.result is None:
                progress.console.print(escape("\n".join(run.tail)), style="dim")
    total_s = time.monotonic() - started

    rows = [
        row
        for run in runs
        for row in compare(run.name, run.result, baseline["benches"].get(run.name), here)
    ]
    flagged = [row for row in rows if row.flagged]
    if args.json:
        print(
            json.dumps(
                {
                    "machine": here,
                    "commit": git("rev-parse", "HEAD"),
                    "seconds": round(total_s, 1),
                    "results": {run.name: run.result for run in runs},
                    "rows": [asdict(row) for row in rows],
                    "flagged": len(flagged),
                }
            )
        )
    else:
        console = Console()
        if not console.is_terminal:  # into a file or a closing note: no wrapped rows
            console = Console(width=120)
        console.print(table(rows))
        for line in provenance(names, baseline, here):
            console.print(line, highlight=False)
        # Two cores shared with a test run make every absolute figure worse: say so.
        load = f"load average {load_before:.1f} → {os.getloadavg()[0]:.1f} on {here['cpus']} cores"
        console.print(
            f"{len(names)} bench(es) in {total_s:.0f} s, {load}; "
            + (f"[bold red]{len(flagged)} flagged" if flagged else "nothing flagged")
        )
    if args.update:
        BASELINE.write_text(json.dumps(updated_baseline(baseline, runs, here), indent=2) + "\n")
        progress_console.print(f"baseline written: {BASELINE.relative_to(REPO)}")
    failed = any(run.result is None for run in runs)
    sys.exit(1 if failed or (flagged and not args.update) else 0)


if __name__ == "__main__":
    main()

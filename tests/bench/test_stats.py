"""bench.stats' readings of a process, on what the kernel and HotSpot print."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from bench.stats import hotspot_seconds, jvm_seconds, pct, process_cpu_s

# `jcmd <pid> PerfCounter.print` of a JVM on the parallel collector, cut to what matters and a
# neighbour of each counter read.
COUNTERS = textwrap.dedent(
    """\
    12345:
    java.ci.totalTime=2553798296
    sun.ci.threads=2
    sun.gc.collector.0.invocations=12
    sun.gc.collector.0.name="Parallel young collection pauses"
    sun.gc.collector.0.time=464639814
    sun.gc.collector.1.name="Parallel full collection pauses"
    sun.gc.collector.1.time=100783894
    sun.gc.collector.1.lastEntryTime=176782184
    sun.os.hrt.frequency=1000000000
    sun.property.java.vm.info="mixed mode, sharing, a=b"
    """
)


def test_the_jit_and_the_collectors_pauses_are_read_in_seconds() -> None:
    got = hotspot_seconds(COUNTERS)
    assert got["jit"] == pytest.approx(2.553798296)
    assert got["gc"] == pytest.approx(0.464639814 + 0.100783894)  # every collector's pauses


def test_the_counters_tick_at_the_frequency_hotspot_gives() -> None:
    slow = COUNTERS.replace("frequency=1000000000", "frequency=1000000")
    assert hotspot_seconds(slow)["jit"] == pytest.approx(2553.798296)


def test_a_running_jvm_is_read_through_jcmd(tmp_path: Path) -> None:
    source = tmp_path / "Idle.java"
    source.write_text(
        "public class Idle { public static void main(String[] a) throws Exception {"
        " System.gc(); System.out.println(1); Thread.sleep(60000); } }"
    )
    with subprocess.Popen(
        ["java", "-XX:+UsePerfData", str(source)], stdout=subprocess.PIPE, text=True
    ) as java:
        try:
            assert java.stdout is not None and java.stdout.readline().strip() == "1"
            got = jvm_seconds(java.pid)
            assert got["jit"] > 0  # compiling methods of javac and the source launcher
            assert got["gc"] > 0  # the System.gc() it ran
        finally:
            java.kill()


def test_a_process_cpu_is_read_from_proc() -> None:
    before = process_cpu_s(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert process_cpu_s(os.getpid()) > before


def test_percentiles_are_the_sample_at_rank_q_n_in_milliseconds() -> None:
    values = [i / 1000 for i in range(1, 101)]
    assert pct(values, 0.5) == 51 and pct(values, 0.99) == 100

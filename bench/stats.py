"""What every bench measures the same way: percentiles (the sample at rank q·n, in
milliseconds), another process's CPU time, the whole machine's, and a JVM's time compiling and
collecting."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def pct(values: list[float], q: float) -> float:
    """The q-quantile of latencies given in seconds, as milliseconds."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of one process so far, its threads included (``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (``/proc/stat``): user,
    nice, system, irq and softirq (guest time is counted in user and nice; steal is the
    hypervisor's, not ours)."""
    ticks = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def hotspot_seconds(counters: str) -> dict[str, float]:
    """From HotSpot's performance counters (``jcmd <pid> PerfCounter.print``), in seconds so
    far: ``jit``, the clock time of its JIT's successful compilations summed over its compiler
    threads (``java.ci.totalTime``, what ``CompilationMXBean`` reports), and ``gc``, its
    collections' pauses (every collector's, without the wait to reach a safepoint). They
    say how busy a JVM still was compiling while a bench timed it (#34)."""
    values = dict(line.split("=", 1) for line in counters.splitlines() if "=" in line)
    hz = int(values["sun.os.hrt.frequency"])
    pauses = (
        v for k, v in values.items() if k.startswith("sun.gc.collector.") and k.endswith(".time")
    )
    return {"jit": int(values["java.ci.totalTime"]) / hz, "gc": sum(map(int, pauses)) / hz}


def jvm_seconds(pid: int) -> dict[str, float]:
    """:func:`hotspot_seconds` of a running JVM."""
    out = subprocess.run(
        ["jcmd", str(pid), "PerfCounter.print"], capture_output=True, text=True, check=True
    )
    return hotspot_seconds(out.stdout)

"""What every bench measures the same way: percentiles (the sample at rank q·n, in
milliseconds) and another process's CPU time."""

from __future__ import annotations

import os
from pathlib import Path


def pct(values: list[float], q: float) -> float:
    """The q-quantile of latencies given in seconds, as milliseconds."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of one process so far, its threads included (``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

"""Percentiles, one definition for every bench: the sample at rank q·n, in milliseconds."""

from __future__ import annotations


def pct(values: list[float], q: float) -> float:
    """The q-quantile of latencies given in seconds, as milliseconds."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

"""History reads come back in open_time order, whatever order the files were read in."""

from __future__ import annotations

import pyarrow as pa

from candlewire.history import _by_open_time


def batch(times: list[int], tag: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"open_time": pa.array(times, pa.timestamp("us", "UTC")), "tag": [tag] * len(times)}
    )


def test_files_read_out_of_order_come_back_sorted() -> None:
    got = _by_open_time(pa.Table.from_batches([batch([5, 6], "b"), batch([1, 2], "a")]))
    assert got.column("tag").to_pylist() == ["a", "a", "b", "b"]


def test_overlapping_files_are_sorted_row_by_row() -> None:
    # A month with a history file and a later live file that overlap in time.
    got = _by_open_time(pa.Table.from_batches([batch([1, 4], "x"), batch([2, 3, 9], "y")]))
    assert got.column("open_time").cast(pa.int64()).to_pylist() == [1, 2, 3, 4, 9]


def test_empty_and_single_row_reads() -> None:
    empty = pa.Table.from_batches([], batch([], "").schema)
    assert _by_open_time(empty).num_rows == 0
    assert _by_open_time(pa.Table.from_batches([batch([7], "z")])).num_rows == 1

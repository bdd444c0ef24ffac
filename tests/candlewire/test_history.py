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


def prices(values: list[str]) -> pa.Table:
    from decimal import Decimal

    dec = pa.array([Decimal(v) for v in values], pa.decimal128(38, 18))
    return pa.table({"close": dec, "trade_count": pa.array([1] * len(values), pa.int64())})


def test_decimals_come_back_exact_at_the_smallest_scale_that_holds_them() -> None:
    from decimal import Decimal

    from candlewire.history import with_decimals

    got = with_decimals(prices(["12972.75", "0.000123", "5"]), "decimal")
    assert got.schema.field("close").type == pa.decimal128(26, 6)
    assert got["close"].to_pylist() == [Decimal("12972.75"), Decimal("0.000123"), Decimal(5)]
    assert str(got.to_pandas()["close"][0]) == "12972.750000"  # not 18 digits
    full = with_decimals(prices(["1.000000000000000001"]), "decimal")
    assert full["close"].to_pylist() == [Decimal("1.000000000000000001")]  # never rounded
    floats = with_decimals(prices(["12972.75", "5"]), "float")
    assert floats["close"].to_pylist() == [12972.75, 5.0]
    assert floats.schema.field("trade_count").type == pa.int64()  # other columns as they were


def test_an_unknown_decimals_choice_is_refused() -> None:
    import pytest

    from candlewire.history import with_decimals

    with pytest.raises(ValueError, match="decimals must be"):
        with_decimals(prices(["1"]), "str")  # type: ignore[arg-type]

"""What the real-time live query asks of Spark: a local master with a thread for each task."""

from __future__ import annotations

import pytest

from candlewire.kafka import TICKS
from streaming.queries.live import SPARE_TASK_SLOTS, local_master

NEEDED = TICKS.partitions + SPARE_TASK_SLOTS


def test_a_local_master_gets_a_thread_for_every_real_time_task() -> None:
    assert local_master("local[*]", cores=2) == f"local[{NEEDED}]"
    assert local_master("local", cores=2) == f"local[{NEEDED}]"
    assert local_master("local[2]") == f"local[{NEEDED}]"
    assert local_master(f"local[{NEEDED + 6}]") == f"local[{NEEDED + 6}]"
    assert local_master("local[*]", cores=64) == "local[64]"


@pytest.mark.parametrize("master", ["spark://host:7077", "k8s://https://host:443", "yarn"])
def test_a_cluster_master_is_refused_with_the_setting_to_change(master: str) -> None:
    with pytest.raises(ValueError, match="stream_live_engine = 'microbatch'"):
        local_master(master)

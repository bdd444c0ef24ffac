"""``make test``'s two workers: the Spark modules are one unit of work, every other module
a unit of its own (tests/scheduling.py), the whole-stack module first beside the unit."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import ONE_AFTER_ANOTHER, pytest_collection_modifyitems
from tests.scheduling import ModuleScheduling


def test_the_jvm_modules_are_one_unit_and_every_other_module_its_own() -> None:
    sched = SimpleNamespace(together=ONE_AFTER_ANOTHER)
    scope = ModuleScheduling._split_scope.__get__(sched)
    units = {
        scope(n)
        for n in (
            "tests/streaming/test_job.py::test_exactly_once_under_kill_9",
            "tests/orchestration/test_assets.py::test_a",
            "tests/launcher/test_spark_cluster.py::test_b[x::y]",
            "tests/candlewire/test_spark.py::test_c",
        )
    }
    assert units == {"together"}
    healing = "tests/orchestration/test_healing.py"  # no Spark: beside the unit
    assert scope(f"{healing}::test_h") == healing
    kafka = "tests/launcher/test_kafka_cluster.py"
    assert scope(f"{kafka}::test_g") == kafka
    stack = "tests/launcher/test_stack.py"  # its own stack: beside the unit
    assert scope(f"{stack}::test_s") == stack
    assert scope("tests/relay/test_server.py::test_d") == "tests/relay/test_server.py"
    assert scope("tests/relay/test_server.py::Cls::test_e") == "tests/relay/test_server.py"
    assert scope("tests/candlewire/test_client.py::test_f") == "tests/candlewire/test_client.py"


def test_the_unit_leads_its_live_tests_last_and_the_whole_stack_module_leads_the_rest() -> None:
    """The scheduler hands units out in this order: the unit to one worker, the first module
    after it to the other, so the stack's long module starts with the run."""

    class Item:  # what the hook reads of a pytest.Item, hashable as items are
        def __init__(self, nodeid: str, live: bool) -> None:
            self.nodeid = nodeid
            self.path = SimpleNamespace(name=nodeid.split("::")[0].rsplit("/", 1)[-1])
            self.fixturenames = ["live_pipeline"] if live else []

    ids = [
        ("tests/candlewire/test_book.py::test_a", False),
        ("tests/streaming/test_job.py::test_live", True),
        ("tests/launcher/test_kafka.py::test_k", False),
        ("tests/launcher/test_stack.py::test_s", False),
        ("tests/streaming/test_job.py::test_unit", False),
        ("tests/relay/test_server.py::test_r", False),
    ]
    items = [Item(n, live) for n, live in ids]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.nodeid.rsplit("::", 1)[1] for i in items] == [
        "test_unit",
        "test_live",
        "test_s",
        "test_a",
        "test_k",
        "test_r",
    ]


def test_each_worker_picks_its_free_ports_from_its_own_share(monkeypatch) -> None:
    """Two workers never pick the same port between one's pick and its bind."""
    from candlewire import testing

    ranges = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
        ranges.append(testing._port_range())
        low, high = ranges[-1]
        assert low <= testing.free_port() <= high
    (low0, high0), (low1, high1) = ranges
    assert low0 < high0 < low1 < high1
    monkeypatch.delenv("PYTEST_XDIST_WORKER")  # one process: the whole range
    whole_low, whole_high = testing._port_range()
    assert whole_low == low0 and high1 <= whole_high


def test_a_free_port_is_found_while_one_is_left(monkeypatch) -> None:
    """Picks at random missed the last few ports: a worker that had handed out most of its
    share failed the suite's last tests with "no free port". This worker's own share: another
    worker's servers hold ports of theirs (posing as gw1 from gw0 once found one taken)."""
    from candlewire import testing

    low, high = testing._port_range()
    free = [p for p in range(high, low, -1) if p not in testing._handed_out][:20]
    for left in free:  # random picks find one port left now and then, never twenty times
        taken = set(range(low, high + 1)) - {left}
        monkeypatch.setattr(testing, "_handed_out", taken | testing._handed_out - {left})
        assert testing.free_port() == left

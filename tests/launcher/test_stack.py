"""``candlewire up | status | down`` with the services that exist, on free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from candlewire.config import port_setting
from launcher.stack import Memory, Service, Stack, StackError, default_services
from tests.support import free_settings, wait_for


@pytest.fixture
def stack(tmp_path):
    settings = free_settings(tmp_path / "state")
    st = Stack(settings, default_services(settings, platform=False))
    yield st
    st.down(lambda _: None)


def test_up_status_down_and_second_up_is_harmless(stack) -> None:
    said: list[str] = []
    stack.up(said.append)
    assert said == [f"relay: up on port {stack.settings.port('client_requests')}"]
    rows = stack.status()
    assert [(r[0], r[3]) for r in rows] == [("relay", "healthy")]
    pid = rows[0][2]
    said.clear()
    stack.up(said.append)
    assert said == [f"relay: already running (pid {pid})"]
    stack.down(said.append)
    assert stack.status()[0][2:] == (None, "stopped")
    assert not stack.services[0].pidfile.exists()


def test_port_taken_is_a_one_line_error(stack) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", stack.settings.port("client_requests")))
        s.listen()
        with pytest.raises(StackError, match=r"port \d+ is taken by another process") as info:
            stack.up(lambda _: None)
    assert f"{port_setting('client_requests')}=<port>" in str(info.value)


def test_the_stack_sets_its_services_metrics_ports(stack) -> None:
    """Its health checks read them, so they must not float to a free port."""
    relay = stack.services[0]
    port = stack.settings.port("relay_metrics")
    assert relay.env[port_setting("relay_metrics")] == str(port)


def test_platform_data_survives_down_then_up(tmp_path, monkeypatch, capsys) -> None:
    """The whole local platform: PostgreSQL, catalog, Kafka, relay; data kept across down/up.

    With CURVE on, as ``candlewire up`` runs it: every ZeroMQ channel below is keyed."""
    import json
    import math
    import re
    import shutil
    import tempfile
    import urllib.request
    from decimal import Decimal
    from pathlib import Path

    from confluent_kafka import Producer

    from candlewire import Client
    from candlewire.kafka import TICKS, producer_config
    from candlewire.lake import catalog
    from launcher.cli import main
    from launcher.stack import gauge
    from proto import market_pb2
    from proto.envelope import to_record
    from streaming.metrics import ICEBERG_BEHIND
    from tests.support import read_topic, secured_settings, wait_for

    base = Path(tempfile.mkdtemp(prefix="candlewire-stack-"))
    base.chmod(0o755)
    settings = secured_settings(base)
    stack = Stack(settings, default_services(settings))
    try:
        stack.up(lambda _: None)
        assert {name: health for name, _, _, health in stack.status()} == {
            "postgres": "healthy",
            "iceberg-catalog": "healthy",
            "kafka": "healthy",
            "relay": "healthy",
            "ingest": "healthy",
            "stream": "healthy",
            "journal": "healthy",
            "gateway": "healthy",
            "dagster": "healthy",
        }
        # Dagster's code server, webserver and daemon are one process, which starts no code
        # server process of its own (#36).
        assert code_servers(stack) == []
        page = f"http://127.0.0.1:{settings.port('gateway_http')}/"
        with urllib.request.urlopen(page, timeout=10) as resp:
            assert b"<title>candlewire</title>" in resp.read()
        assert (
            settings.state_dir / "secrets" / "candlewire_gateway_secret"
        ).stat().st_mode & 0o077 == 0
        # Live data out of the box: SIM streams BINANCE:BTC/USDT through Kafka, Spark and the relay.
        with Client(settings) as client:
            tick = next(client.subscribe("BINANCE:BTC/USDT", "tick", idle_timeout=90))
        assert tick.ticker == "BINANCE:BTC/USDT" and Decimal(tick.price) > 0
        kept = market_pb2.Tick(ticker="KEEP:X/USDT", trade_id="kept", price="1", size="1")
        producer = Producer(producer_config(settings))
        producer.produce(TICKS.name, key=b"KEEP:X/USDT", value=to_record(kept))
        assert producer.flush(30) == 0
        # `candlewire up` on a fresh stack (its parts already running here) fetches the
        # exchanges' markets once, so triggers work at once.
        for name, value in settings.to_env().items():  # the CLI reads its settings there
            monkeypatch.setenv(name, value)
        capsys.readouterr()
        assert main(["up"]) == 0
        said = capsys.readouterr().out
        assert "relay: already running" in said
        for exchange in ("SIM", "BINANCE"):
            assert re.search(rf"symbol metadata: {exchange} lists [1-9]\d* symbols", said), said
        listed = catalog(settings).load_table("market.symbol_metadata").scan().to_arrow()
        tickers = sorted(listed["ticker"].to_pylist())
        assert "BINANCE:BTC/USDT" in tickers and "SIM:BTC/USDT" in tickers
        # And the CLI's default owner is one the relay lets this CURVE key use.
        far = ["BINANCE:BTC/USDT", "price_cross", "--level", "1000000000", "--direction", "up"]
        assert main(["trigger", "add", *far, "--id", "far"]) == 0, capsys.readouterr()
        assert main(["trigger", "ls"]) == 0
        assert re.search(r"far .+ crosses 1000000000 upward .+ once", capsys.readouterr().out)
        assert main(["trigger", "ls", "--format", "json"]) == 0
        listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()[-1:]]
        assert listed[0]["triggerId"] == "far"
        assert listed[0]["clientId"].startswith(f"{settings.security.key}.cli-")
        assert main(["trigger", "rm", "far"]) == 0

        # How far Iceberg is behind Kafka: the job's gauge, once its first commit completed,
        # and `status` says it.
        def behind() -> float:
            value = gauge(settings, "stream_metrics", ICEBERG_BEHIND)
            return math.nan if value is None else value

        wait_for(lambda: not math.isnan(behind()), timeout=120)
        assert 0 <= behind() < 600  # the job has run for minutes at most
        capsys.readouterr()
        main(["status"])
        assert re.search(
            r"^Iceberg's ticks and candles hold every tick Kafka held \d+ s ago$",
            capsys.readouterr().out,
            re.M,
        )
        stack.down(lambda _: None)
        assert all(
            health == "stopped"
            for name, _, _, health in stack.status()
            if name != "iceberg-catalog"
        )
        capsys.readouterr()
        assert main(["up"]) == 0
        assert "symbol metadata" not in capsys.readouterr().out, "fetched only once"
        rows = catalog(settings).load_table("market.symbol_metadata").scan().to_arrow()
        assert sorted(rows["ticker"].to_pylist()) == tickers
        survived = read_topic(settings, TICKS.name, lambda rs: kept in rs, timeout=60)
        assert kept in survived
    finally:
        stack.down(lambda _: None)
        shutil.rmtree(base, ignore_errors=True)


def code_servers(stack: Stack) -> list[str]:
    """The parts whose process tree runs a Dagster code server (``dagster api grpc``)."""
    from launcher.stack import child_map, process_tree

    children = child_map()

    def serves_code(pid: int) -> bool:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return b"api" in argv and b"grpc" in argv

    return [
        name
        for name, _, pid, _ in stack.status()
        if isinstance(pid, int) and any(serves_code(p) for p in process_tree(pid, children))
    ]


def test_a_part_s_memory_is_its_whole_process_tree() -> None:
    import subprocess
    import sys

    from launcher.stack import memory_mib, tree_memory_mib

    hog = "x = b'x' * (200 * 2**20); print('ready', flush=True); input()"  # pages touched
    child = subprocess.Popen(
        [sys.executable, "-c", hog], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        me = os.getpid()
        assert memory_mib(child.pid).rss >= 200
        assert memory_mib(child.pid).pss >= 200  # private pages: all of them its own
        tree, mine = tree_memory_mib(me), memory_mib(me)
        assert tree.rss - mine.rss >= 200  # the child counts with its parent
        assert tree.pss - mine.pss >= 200
    finally:
        child.kill()
        child.wait()
    assert memory_mib(child.pid) == Memory()  # gone (reaped)


def test_pss_counts_a_shared_page_once_where_rss_counts_it_in_each_process() -> None:
    """Two processes sharing 200 MiB: summed RSS says 400, summed PSS about 200 (why
    ``status`` totals PSS)."""
    import mmap
    import time

    from launcher.stack import memory_mib

    shared = mmap.mmap(-1, 200 * 2**20, flags=mmap.MAP_SHARED)
    shared.write(b"x" * len(shared))  # resident in this process
    ready, tell = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child maps the same pages: reading one byte of each makes them resident
        os.write(tell, bytes([len(shared[::4096]) > 0]))
        time.sleep(60)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"\x01"
        me, child = memory_mib(os.getpid()), memory_mib(pid)
        assert me.rss >= 200 and child.rss >= 200  # each counts the 200 MiB
        # Summed RSS counts the 200 shared MiB twice, summed PSS once (each gets half).
        assert (me.rss + child.rss) - (me.pss + child.pss) >= 195
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        shared.close()


def test_status_prints_each_part_s_rss(stack, monkeypatch, capsys) -> None:
    from launcher.cli import main

    stack.up(lambda _: None)
    for name, value in stack.settings.to_env().items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    main(["status"])
    out = capsys.readouterr().out
    assert "RSS MiB" in out and "PSS MiB" in out
    (relay,) = [line for line in out.splitlines() if " relay " in line]
    assert "healthy" in relay
    rss, pss = (int(cell.strip().replace(",", "")) for cell in relay.split("│")[-3:-1])
    assert 20 <= pss <= rss <= 2000  # a Python process with pyzmq and protobuf loaded
    (total,) = [line for line in out.splitlines() if line.startswith("the stack holds")]
    assert int(total.split()[3].replace(",", "")) >= pss


class _Part(Service):
    """A part that records when it starts and can be held or made to fail."""

    def __init__(self, name: str, log: list[str], needs: tuple[str, ...] = (), **kw) -> None:
        self.name, self.port, self.needs, self.log = name, None, needs, log
        self.running_pid: int | None = kw.get("pid")
        self.fails: bool = kw.get("fails", False)
        self.release = threading.Event()
        self.entered = threading.Event()
        self.stopped = threading.Event()
        self.stop_release = threading.Event()
        self.stop_fails: bool = kw.get("stop_fails", False)
        if not kw.get("hold", False):
            self.release.set()
        if not kw.get("hold_stop", False):
            self.stop_release.set()

    def pid(self) -> int | None:
        return self.running_pid

    def start(self, give_up: threading.Event | None = None) -> None:
        self.log.append(f"start {self.name}")
        self.entered.set()
        assert self.release.wait(10)
        if self.fails:
            raise StackError(f"{self.name} would not start")
        self.log.append(f"healthy {self.name}")

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        assert self.stop_release.wait(10)
        if self.stop_fails:
            raise StackError(f"{self.name} would not stop")
        self.running_pid = None
        self.stopped.set()

    def health(self) -> str | None:
        return None


def test_parts_stop_together_once_nothing_that_needs_them_runs(tmp_path) -> None:
    """`down` stops the parts nothing needs side by side, and a part only once every part
    that needs it has stopped: ingest and the stream job flush into Kafka before it goes.
    One after another, `down` of the whole stack took 49 s."""
    log: list[str] = []
    db = _Part("db", log, pid=1)
    broker = _Part("broker", log, pid=2)
    app = _Part("app", log, needs=("db", "broker"), pid=3, hold_stop=True)
    ui = _Part("ui", log, needs=("db",), pid=4, hold_stop=True)
    idle = _Part("idle", log, needs=("broker",))  # not running: frees the broker at once
    stack = Stack(free_settings(tmp_path / "state"), [db, broker, app, ui, idle])
    said: list[str] = []
    down = threading.Thread(target=stack.down, args=(said.append,))
    down.start()
    # Both dependents stop together; what they need waits for them.
    wait_for(lambda: {"stop app", "stop ui"} <= set(log))
    time.sleep(0.2)
    assert set(log) == {"stop app", "stop ui"}
    app.stop_release.set()
    assert broker.stopped.wait(10)  # the app was all that held it
    assert "stop db" not in log  # the ui still runs
    ui.stop_release.set()
    down.join(10)
    assert not down.is_alive()
    assert log.index("stop db") > log.index("stop ui")
    assert sorted(said) == sorted(f"{n}: stopped" for n in ("db", "broker", "app", "ui"))


def test_down_stops_a_part_this_version_no_longer_runs(tmp_path) -> None:
    """A stack started before an upgrade runs parts the new one does not list (Dagster's code
    server had a part of its own); `down` stops them, and leaves a reused pid alone."""
    settings = free_settings(tmp_path / "state")
    run = settings.state_dir / "run"
    run.mkdir(parents=True)
    retired = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "dagster", "api", "grpc"],
        start_new_session=True,
    )
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Popen returns once the child has begun its exec, a moment before the kernel gives it
        # a command line: on a busy machine `down` could read it empty, as no part's.
        for p in (retired, other):
            wait_for(lambda p=p: Path(f"/proc/{p.pid}/cmdline").read_bytes())
        (run / "dagster-code.pid").write_text(str(retired.pid))
        said: list[str] = []
        Stack(settings, []).down(said.append)
        retired.wait(10)  # ended, 50 s before its sleep would have (down reaps it: no status)
        assert said == ["dagster-code: stopped (this version no longer runs it)"]
        assert not (run / "dagster-code.pid").exists()
        (run / "dagster-code.pid").write_text(str(other.pid))  # the pid is someone else's now
        Stack(settings, []).down(said.append)
        assert other.poll() is None and len(said) == 1
    finally:
        for p in (retired, other):
            p.kill()
            p.wait()


def test_a_part_that_will_not_stop_stops_nothing_less(tmp_path) -> None:
    log: list[str] = []
    db = _Part("db", log, pid=1)
    app = _Part("app", log, needs=("db",), pid=2, stop_fails=True)
    ui = _Part("ui", log, pid=3)
    stack = Stack(free_settings(tmp_path / "state"), [db, app, ui])
    with pytest.raises(StackError, match="app would not stop"):
        stack.down(lambda _: None)
    assert db.stopped.is_set() and ui.stopped.is_set()


def test_parts_start_together_once_what_they_need_is_healthy(tmp_path) -> None:
    """`up` starts independent parts side by side (PostgreSQL beside Kafka, the platform
    beside Dagster) and a part only after its needs; without it `make up` took 76 s."""
    log: list[str] = []
    db = _Part("db", log, hold=True)
    broker = _Part("broker", log, hold=True)
    app = _Part("app", log, needs=("db", "broker", "absent"))  # "absent": not in this stack
    ui = _Part("ui", log, needs=("db",))
    stack = Stack(free_settings(tmp_path / "state"), [db, broker, app, ui])
    said: list[str] = []
    up = threading.Thread(target=stack.up, args=(said.append,))
    up.start()
    # Both start before either is healthy: neither waits for the other.
    assert db.entered.wait(10) and broker.entered.wait(10)
    assert log == ["start db", "start broker"]
    db.release.set()
    assert ui.entered.wait(10)  # needs db only
    assert "start app" not in log  # still needs the broker
    broker.release.set()
    up.join(10)
    assert log.index("start app") > log.index("healthy broker")
    assert sorted(said) == ["app: up", "broker: up", "db: up", "ui: up"]


def test_a_running_part_frees_its_dependents_and_a_failure_starts_nothing_more(
    tmp_path,
) -> None:
    log: list[str] = []
    parts = [
        _Part("db", log, pid=4242),
        _Part("app", log, needs=("db",), fails=True),
        _Part("ui", log, needs=("app",)),
    ]
    stack = Stack(free_settings(tmp_path / "state"), parts)
    said: list[str] = []
    with pytest.raises(StackError, match="app would not start"):
        stack.up(said.append)
    assert said == ["db: already running (pid 4242)"]
    assert log == ["start app"]  # ui, which needs app, never started


def test_a_part_stops_waiting_for_its_health_once_up_gives_up(tmp_path) -> None:
    """Ctrl-C in `up`: its starting threads must not hold the command for their timeouts."""
    import sys

    from launcher.stack import ProcessService

    part = ProcessService(
        name="never-healthy",
        argv=lambda: [sys.executable, "-c", "import time; time.sleep(60)"],
        port=None,
        check=lambda: "not yet",
        run_dir=tmp_path / "run",
        log=tmp_path / "never-healthy.log",
        start_timeout=60.0,
    )
    give_up, failed = threading.Event(), []

    def start() -> None:
        try:
            part.start(give_up)
        except StackError as exc:
            failed.append(str(exc))

    waiting = threading.Thread(target=start)
    waiting.start()
    try:
        time.sleep(0.5)
        give_up.set()
        waiting.join(5)
        assert not waiting.is_alive()
        assert failed == ["never-healthy: start abandoned; it may still come up"]
    finally:
        part.stop()


LEADER = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
def stop(*_):
    time.sleep(0.3)  # as the stream job stops its queries, with its JVM needed
    open(sys.argv[1], "w").write("alive" if child.poll() is None else "gone")
    child.terminate()
    child.wait()
    sys.exit(0)  # ``left`` is left to the group's signal
signal.signal(signal.SIGTERM, stop)
print(left.pid, flush=True)
time.sleep(60)
"""


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie (its parent, init here, reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("leader_first", [True, False])
def test_a_leader_first_stops_with_its_children_still_there(tmp_path, leader_first) -> None:
    """candlewire's own processes get SIGTERM before their group: signalled together, the
    stream job's JVM stopped Spark under the queries the job was stopping. Either way what
    the leader leaves of its group is stopped too."""
    from launcher.stack import stop_process_group

    said = tmp_path / "said"
    with subprocess.Popen(
        [sys.executable, "-c", LEADER, str(said)], stdout=subprocess.PIPE, start_new_session=True
    ) as proc:
        assert proc.stdout is not None
        left = int(proc.stdout.readline())
        stop_process_group(proc.pid, 10.0, leader_first)
    assert said.read_text() == ("alive" if leader_first else "gone")
    wait_for(lambda: gone(left), timeout=5)

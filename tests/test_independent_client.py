"""A client written only from the .proto files and the spec, importing no candlewire code."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from grpc_tools import protoc

from proto import market_pb2
from tests.support import FakeIngestor

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import sys, time, uuid
    import zmq
    import requests_pb2, market_pb2  # compiled from the .proto files alone

    requests_port, market_port = int(sys.argv[1]), int(sys.argv[2])
    VERSION = b"\\x01"                   # spec: frame 1 is the protocol version
    SUBMIT, ACK, TICK = 0x10, 0x11, 0x04  # spec: message type IDs

    ctx = zmq.Context()
    req = ctx.socket(zmq.REQ)
    req.connect(f"tcp://127.0.0.1:{requests_port}")
    msg = requests_pb2.SubmitHistoricalRequest(
        request_id=uuid.uuid4().hex, client_id="raw-client", ticker="BINANCE:BTC/USDT",
        period_s=60, start_ms=1_700_000_000_000, end_ms=1_700_086_400_000,
    )
    req.send_multipart([VERSION, bytes([SUBMIT]) + msg.SerializeToString()])
    assert req.poll(10_000), "no ack"
    version, body = req.recv_multipart()
    assert version == VERSION and body[0] == ACK
    ack = requests_pb2.SubmitResponse.FromString(body[1:])
    assert ack.status == requests_pb2.SUBMIT_OK, ack
    assert ack.notification_topic == "RESPONSE:raw-client", ack
    print("ACK", ack.request_id == msg.request_id, flush=True)

    sub = ctx.socket(zmq.SUB)
    sub.subscribe(b"BINANCE:BTC/USDT|tick")
    sub.connect(f"tcp://127.0.0.1:{market_port}")
    assert sub.poll(20_000), "no tick"
    topic, version, body = sub.recv_multipart()
    assert version == VERSION and body[0] == TICK
    tick = market_pb2.Tick.FromString(body[1:])
    print("TICK", topic.decode(), tick.price, flush=True)

    project = [m for m, mod in sys.modules.items()
               if m.split(".")[0] in ("candlewire", "proto", "relay", "ingest", "streaming", "gateway")]
    assert not project, project
    """
)


def test_client_from_proto_files_only(ctx, settings, relay, publisher, tmp_path: Path) -> None:
    for name in ("requests.proto", "market.proto"):
        (tmp_path / name).write_bytes((REPO / "proto" / name).read_bytes())
    assert (
        protoc.main(
            [
                "protoc",
                f"-I{tmp_path}",
                f"--python_out={tmp_path}",
                "requests.proto",
                "market.proto",
            ]
        )
        == 0
    )
    (tmp_path / "raw_client.py").write_text(SCRIPT)
    ingestor = FakeIngestor(ctx, settings, ["BINANCE:"])
    time.sleep(0.2)
    stop = threading.Event()

    def ticks() -> None:
        while not stop.is_set():
            publisher.publish("BINANCE:BTC/USDT|tick", market_pb2.Tick(price="65000.10"))
            time.sleep(0.05)

    feeder = threading.Thread(target=ticks)
    feeder.start()
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-s",
                "raw_client.py",
                str(settings.port("client_requests")),
                str(settings.port("market_data")),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
        )
    finally:
        stop.set()
        feeder.join()
        ingestor.close()
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["ACK True", "TICK BINANCE:BTC/USDT|tick 65000.10"]

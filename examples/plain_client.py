"""A client written only from ``proto/``: pyzmq and the generated messages, no candlewire.

It asks for a day of history and waits for the notification that it is in Iceberg, then
prints live ticks: the rules of docs/how-to/other-language.md, line by line. The messages
are compiled from ``proto/requests.proto`` and ``proto/market.proto`` (with grpcio-tools'
protoc, into a temporary folder) unless ``--generated DIR`` holds them already.

    python examples/plain_client.py [--host 127.0.0.1] [--requests-port 5559]
                                    [--market-port 5558] [--ticker BINANCE:BTC/USDT] [--ticks 5]
                                    [--key alice.json]

``make up``'s stack runs with CURVE on: make a key and pass the file ``candlewire keys export``
writes (``candlewire keys add-client alice --role client``, then ``candlewire keys export
alice --output alice.json``). The addresses and server keys then come from that file.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import zmq

VERSION = b"\x01"  # frame 1: the protocol version
SUBMIT, SUBMIT_RESPONSE, HISTORY_READY, TICK = 0x10, 0x11, 0x12, 0x04  # enum MessageType
PROTO = Path(__file__).resolve().parents[1] / "proto"


def generated(folder: str | None) -> tuple:
    """``requests_pb2`` and ``market_pb2``, compiled from the .proto files if need be."""
    if folder is None:
        from grpc_tools import protoc  # the dev extra's; any protoc does the same

        folder = tempfile.mkdtemp(prefix="plain-client-")
        args = ["protoc", f"-I{PROTO}", f"--python_out={folder}", "requests.proto"]
        if protoc.main([*args, "market.proto"]) != 0:
            raise SystemExit("protoc failed")
    sys.path.insert(0, folder)
    return importlib.import_module("requests_pb2"), importlib.import_module("market_pb2")


def secured(sock: zmq.Socket, key: dict | None, endpoint: str) -> zmq.Socket:
    """``sock`` with CURVE set from a ``keys export`` file (none without one): this client's
    pair, and the server key the file gives for ``endpoint``."""
    if key is not None:
        sock.curve_publickey = key["public_key"].encode()
        sock.curve_secretkey = key["secret_key"].encode()
        sock.curve_serverkey = key["endpoints"][endpoint]["server_key"].encode()
    return sock


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--requests-port", type=int, default=5559)
    parser.add_argument("--market-port", type=int, default=5558)
    parser.add_argument("--ticker", default="BINANCE:BTC/USDT")
    parser.add_argument("--start-ms", type=int, default=1_704_067_200_000, help="2024-01-01")
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--generated", help="a folder with requests_pb2.py and market_pb2.py")
    parser.add_argument("--key", help="a `candlewire keys export` file: CURVE, and where to dial")
    args = parser.parse_args(argv)
    requests_pb2, market_pb2 = generated(args.generated)
    ctx = zmq.Context()
    key = json.loads(Path(args.key).read_text()) if args.key else None
    requests_at = f"tcp://{args.host}:{args.requests_port}"
    market_at = f"tcp://{args.host}:{args.market_port}"
    prefix = ""
    if key is not None:  # the relay takes ids under the key's name only
        requests_at = key["endpoints"]["client_requests"]["connect"][0]
        market_at = key["endpoints"]["market_data"]["connect"][0]
        prefix = key["client_id_prefix"]
    client_id = f"{prefix}plain-{uuid.uuid4().hex[:8]}"

    # 1. Subscribe to the notification topic first, and wait until the connection is up:
    #    PUB/SUB drops what is published before the subscription has travelled.
    notes = secured(ctx.socket(zmq.SUB), key, "market_data")
    topic = f"RESPONSE:{client_id}".encode()
    notes.subscribe(topic)
    notes.connect(market_at)
    time.sleep(0.5)

    # 2. Submit over REQ; with no answer, a fresh socket and the same request_id (Lazy Pirate).
    request = requests_pb2.SubmitHistoricalRequest(
        request_id=prefix + uuid.uuid4().hex,
        client_id=client_id,
        ticker=args.ticker,
        period_s=3600,
        start_ms=args.start_ms,
        end_ms=args.start_ms + 86_400_000,
    )
    for _attempt in range(3):
        req = secured(ctx.socket(zmq.REQ), key, "client_requests")
        req.connect(requests_at)
        req.send_multipart([VERSION, bytes([SUBMIT]) + request.SerializeToString()])
        if req.poll(5_000):
            version, body = req.recv_multipart()
            req.close()
            break
        req.close(linger=0)
    else:
        hint = "" if key else " (a stack with CURVE on answers only a known key: --key)"
        raise SystemExit(f"the relay at {requests_at} does not answer{hint}")
    assert version == VERSION and body[0] == SUBMIT_RESPONSE, (version, body[:1])
    ack = requests_pb2.SubmitResponse.FromString(body[1:])
    if ack.status != requests_pb2.SUBMIT_OK:
        raise SystemExit(f"rejected: {requests_pb2.RejectReason.Name(ack.reason)}")
    print(f"accepted; notification on {ack.notification_topic}")

    # 3. The notification, compared exactly (SUB filters by prefix) and kept once per request.
    while True:
        if not notes.poll(300_000):
            raise SystemExit("no notification")
        frame_topic, version, body = notes.recv_multipart()
        if frame_topic != topic or version != VERSION or body[0] != HISTORY_READY:
            continue
        note = requests_pb2.HistoryReadyNotification.FromString(body[1:])
        if note.request_id == request.request_id:
            break
    status = requests_pb2.HistoryStatus.Name(note.status)
    print(f"{status}: {note.row_count} candles in {note.iceberg_table}")

    # 4. Live ticks: subscribing is the request; prices are exact decimal strings. The topic
    #    also carries StreamHead beacons (0x16), the latest position, for a client that
    #    repairs gaps (docs/explanation/sequencing.md); this one skips them.
    live = secured(ctx.socket(zmq.SUB), key, "market_data")
    live.subscribe(f"{args.ticker}|tick".encode())
    live.connect(market_at)
    printed = 0
    while printed < args.ticks:
        if not live.poll(60_000):
            raise SystemExit("no tick")
        _topic, version, body = live.recv_multipart()
        if version != VERSION or body[0] != TICK:
            continue
        tick = market_pb2.Tick.FromString(body[1:])
        print(f"tick {tick.price} x {tick.size} (seq {tick.stream.seq})")
        printed += 1
    ctx.destroy(linger=0)


if __name__ == "__main__":
    main()

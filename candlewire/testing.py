"""Helpers for testing and benchmarking candlewire: free ports, waiting, processes, stand-ins.

The test suite and ``bench/`` both use them, and so can a user's own tests against a local
stack, as bytewax ships ``bytewax.testing``. Nothing here imports a service: processes are
started through the installed ``candlewire`` command, as a user would start them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from candlewire.config import REPO_ROOT, Settings
from candlewire.endpoints import ENDPOINTS
from candlewire.topics import market_data_topic, tick_type
from proto import events_pb2 as ev
from proto import market_pb2
from proto import requests_pb2 as rq
from proto.envelope import to_record

_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_range() -> tuple[int, int]:
    """The ports from 10,000 up to the ephemeral range, or this pytest-xdist worker's share
    of them (its processes inherit ``PYTEST_XDIST_WORKER``), so that two workers never pick
    the same port between one's pick and its bind. A test's settings take 24 ports, and a
    worker of the suite makes about 300: 12,000 ports ran out at 951 tests."""
    top = min(_ephemeral_low(), 32768) - 1
    low = max(1024, top - 22_767)
    worker, count = (
        os.environ.get("PYTEST_XDIST_WORKER", ""),
        os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"),
    )
    if not worker.startswith("gw") or not count.isdigit() or int(count) < 2:
        return low, top
    share = (top - low) // int(count)
    low += int(worker[2:]) * share
    return low, low + share - 1


def free_port() -> int:
    """A port that is free now and that the kernel will not hand out on its own.

    Port 0 picks from the ephemeral range, where every outgoing connection (Kafka
    clients, ZMQ connects) also takes its local port; between our pick and the
    service's bind one of those could take it. So pick below that range instead,
    never twice in one process.
    """
    low, high = _port_range()
    rng = random.Random()
    start = rng.randint(low, high)
    tries = itertools.chain(  # a few at random, then every port once (the range nearly used)
        (rng.randint(low, high) for _ in range(200)), range(start, high + 1), range(low, start)
    )
    for port in tries:
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {low}-{high}: {len(_handed_out)} handed out already")


def free_settings(state_dir: object, **overrides: object) -> Settings:
    """Settings with every endpoint on its own free port, state under ``state_dir``."""
    return Settings(
        ports={name: free_port() for name in ENDPOINTS},
        state_dir=state_dir,  # type: ignore[arg-type]
        **overrides,  # type: ignore[arg-type]
    )


def maps_file(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` mapped (a JVM its class archive, say)."""
    return f" {path}\n" in Path(f"/proc/{pid}/maps").read_text()


def wait_for(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02
) -> object:
    """Poll until ``predicate()`` is truthy and return it; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {predicate}")


async def await_for(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05
) -> object:
    """:func:`wait_for` inside an event loop: the loop runs while it waits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {predicate}")


def http_get(url: str) -> bytes:
    """The body at ``url``, or empty when nothing answers yet."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read()
    except OSError:
        return b""


def metric(settings: Settings, endpoint: str, series: str) -> float:
    """Sum of a service's Prometheus series whose line starts with ``series``."""
    body = http_get(settings.metrics_url(endpoint)).decode()
    return sum(float(x.split()[-1]) for x in body.splitlines() if x.startswith(series))


def stream_metric(settings: Settings, series: str) -> float:
    """The streaming job's series (see :func:`metric`)."""
    return metric(settings, "stream_metrics", series)


def candlewire_command(*args: str) -> list[str]:
    """The installed ``candlewire`` command beside this interpreter, as a user runs it."""
    return [str(Path(sys.executable).with_name("candlewire")), *args]


def this_tree() -> dict[str, str]:
    """``PYTHONPATH`` that makes a spawned ``candlewire`` run this tree's code. The command
    imports the tree the editable install points at, so a bench run from another worktree
    (comparing two commits) would otherwise measure that tree's service in both arms."""
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def spawn(
    settings: Settings,
    args: list[str],
    *,
    healthy: str,
    metrics_endpoint: str,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    timeout: float = 60.0,
) -> subprocess.Popen:
    """``candlewire ARGS`` as a process of its own, returned once its metrics show
    ``healthy``; fails with the log's tail if it exits first."""
    log = log or settings.state_dir / f"{args[0]}-{settings.port(metrics_endpoint)}.log"
    out = log.open("ab")
    proc = subprocess.Popen(
        candlewire_command(*args),
        env=os.environ | this_tree() | settings.to_env() | (env or {}),
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    url = settings.metrics_url(metrics_endpoint, "127.0.0.1")

    def up() -> bool:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        return healthy.encode() in http_get(url)

    wait_for(up, timeout=timeout, interval=0.3)
    return proc


def spawn_gateway(
    settings: Settings,
    secret: str,
    telegram_token: str,
    telegram_url: str,
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """``candlewire gateway`` with a session secret and a Telegram Bot API to call."""
    env = {
        "CANDLEWIRE_GATEWAY_SECRET": secret,
        "CANDLEWIRE_GATEWAY_TELEGRAM_TOKEN": telegram_token,
        "CANDLEWIRE_GATEWAY_TELEGRAM_API": telegram_url,
    } | (extra_env or {})
    log = settings.state_dir / f"gateway-{settings.port('critical_events')}.log"
    return spawn(
        settings,
        ["gateway"],
        healthy="candlewire_gateway_up 1.0",
        metrics_endpoint="gateway_metrics",
        env=env,
        log=log,
    )


# -- user events -------------------------------------------------------------------------


def new_user() -> str:
    return f"u{uuid.uuid4().hex[:10]}"


def user_event(
    user: str,
    priority: int,
    channels: list[tuple[int, bool]] | None = None,
    payload: dict | None = None,
    event_type: int = ev.ORDER_FILLED,
) -> ev.UserEvent:
    """A UserEvent as a container would send it; ``channels`` are (channel, only_if_active)."""
    prefs = [ev.ChannelPreference(channel=c, only_if_active=a) for c, a in (channels or [])]
    return ev.UserEvent(
        user_id=user,
        event_id=uuid.uuid4().hex,
        timestamp=int(time.time() * 1000),
        event_type=event_type,
        payload=json.dumps(payload or {"qty": 1}).encode(),
        delivery=ev.DeliverySpec(priority=priority, channels=prefs),
    )


def open_session(
    settings: Settings, user: str, token: str, batch: bool = False, **kw: object
) -> Any:
    """A gateway WebSocket session, authenticated as a browser does it; ``batch`` asks for
    what is queued together, a JSON array a frame (read them with :func:`session_messages`)."""
    from websockets.sync.client import connect

    ws = connect(f"ws://127.0.0.1:{settings.port('gateway_http')}/ws", legacy=True, **kw)  # type: ignore[arg-type]
    auth: dict[str, object] = {"op": "auth", "token": token}
    if batch:
        auth["batch"] = True
    ws.send(json.dumps(auth))
    welcome = session_messages(ws.recv(timeout=5))
    assert welcome == [{"type": "welcome", "user": user}], welcome
    return ws


def session_messages(
    frame: str | bytes, loads: Callable[[str | bytes], Any] = json.loads
) -> list[dict[str, Any]]:
    """The messages of one frame of a gateway session: an array in a batched session's frame
    of several, else the one object. ``loads``: another parser, such as orjson's."""
    data = loads(frame)
    return data if isinstance(data, list) else [data]


# -- stand-ins for services that cannot be reached from a test machine -------------------


class HttpStandIn:
    """A threaded HTTP server on 127.0.0.1 whose handler calls ``self.handle``."""

    def __init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the real services offer
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, headers, reply = owner.handle(self.path, self.headers, body)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hung up
                    super().handle_error(request, client_address)

        self.lock = threading.Lock()
        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def handle(self, path: str, headers: Message, body: bytes) -> tuple[int, dict, bytes]:
        raise NotImplementedError

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


TELEGRAM_MAX_TEXT = 4096  # sendMessage's limit


class TelegramStandIn(HttpStandIn):
    """The Bot API's ``sendMessage`` and ``getUpdates``: checks the token, records messages,
    serves what users write to the bot, can rate-limit.

    ``limit(n, retry_after)`` answers the next ``n`` sendMessage calls with 429 and
    ``retry_after``, as Telegram does when a bot sends too fast; ``limit_updates`` does the
    same to getUpdates; a chat in ``blocked`` gets 403 (its user blocked the bot); a text
    past 4096 characters (UTF-16 code units) gets 400 "message is too long", as Telegram.
    ``say(chat, text)`` is a user writing to the bot; ``inject`` queues any update as given
    (for malformed ones). getUpdates keeps Telegram's rules: it waits up to ``timeout``
    seconds for an update, ``offset`` confirms and drops every update before it,
    ``allowed_updates`` is remembered and filters updates made after it, and a second poller
    ends the one waiting with 409 Conflict.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self.messages: list[dict[str, Any]] = []
        self.refused = 0
        self._limited, self._retry_after = 0, 1
        self.pending: list[tuple[int, Any]] = []  # (update_id, update), not yet confirmed
        self.polls: deque[dict[str, Any]] = deque(maxlen=1000)  # getUpdates parameters
        self.conflicts = 0
        self.allowed: list[str] | None = None
        self._next_update_id = random.randint(10_000, 900_000_000)
        self._updates_limited, self._updates_retry_after = 0, 1
        self._poller = 0  # which getUpdates is the live one
        self._closed = False
        self.blocked: set[str] = set()  # chats whose user blocked the bot: 403
        super().__init__()
        self._changed = threading.Condition(self.lock)

    def limit(self, calls: int, retry_after: int) -> None:
        with self.lock:
            self._limited, self._retry_after = calls, retry_after

    def limit_updates(self, calls: int, retry_after: int) -> None:
        with self.lock:
            self._updates_limited, self._updates_retry_after = calls, retry_after

    def say(self, chat_id: int, text: str) -> int | None:
        """A user of a private chat sends ``text`` to the bot; the update's id, or None
        when ``allowed_updates`` leaves messages out (Telegram then makes none)."""
        with self.lock:
            if self.allowed and "message" not in self.allowed:
                return None
            message: dict[str, Any] = {
                "message_id": len(self.pending) + 1,
                "from": {"id": chat_id, "is_bot": False, "first_name": "Test"},
                "chat": {"id": chat_id, "type": "private", "first_name": "Test"},
                "date": int(time.time()),
                "text": text,
            }
            if text.startswith("/"):
                length = len(text.split(" ", 1)[0])
                message["entities"] = [{"type": "bot_command", "offset": 0, "length": length}]
            return self._add({"message": message})

    def inject(self, update: Any) -> int:
        """Queue an update as it is, given an update_id if it is an object without one."""
        with self.lock:
            return self._add(update)

    def _add(self, update: Any) -> int:
        update_id = self._next_update_id
        self._next_update_id += 1
        if isinstance(update, dict) and "update_id" not in update:
            update = {"update_id": update_id, **update}
        self.pending.append((update_id, update))
        self._changed.notify_all()
        return update_id

    def handle(self, path: str, headers: Message, body: bytes) -> tuple[int, dict, bytes]:
        ctype = {"Content-Type": "application/json"}
        prefix = f"/bot{self.token}/"
        if not path.startswith(prefix):
            return 401, ctype, b'{"ok":false,"error_code":401,"description":"Unauthorized"}'
        method = path[len(prefix) :]
        if method == "getUpdates":
            status, reply = self._get_updates(body)
            return status, ctype, json.dumps(reply).encode()
        if method != "sendMessage":
            return 404, ctype, b'{"ok":false,"error_code":404,"description":"Not Found"}'
        with self.lock:
            if self._limited > 0:
                self._limited -= 1
                self.refused += 1
                return 429, ctype, json.dumps(_too_many(self._retry_after)).encode()
            try:
                msg = json.loads(body)
            except ValueError:
                msg = {}
            if not msg.get("chat_id") or not msg.get("text"):
                return 400, ctype, b'{"ok":false,"error_code":400,"description":"Bad Request"}'
            text = str(msg["text"]).encode("utf-16-le", "surrogatepass")
            if len(text) > 2 * TELEGRAM_MAX_TEXT:
                reply = {
                    "ok": False,
                    "error_code": 400,
                    "description": "Bad Request: message is too long",
                }
                return 400, ctype, json.dumps(reply).encode()
            if str(msg["chat_id"]) in self.blocked:
                reply = {
                    "ok": False,
                    "error_code": 403,
                    "description": "Forbidden: bot was blocked by the user",
                }
                return 403, ctype, json.dumps(reply).encode()
            self.messages.append(msg)
            result = {"message_id": len(self.messages), "chat": {"id": msg["chat_id"]}}
        return 200, ctype, json.dumps({"ok": True, "result": result}).encode()

    def _get_updates(self, body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            params = json.loads(body) if body else {}
            assert isinstance(params, dict)
            offset, timeout = int(params.get("offset", 0)), float(params.get("timeout", 0))
            limit = max(1, min(100, int(params.get("limit", 100))))
        except (ValueError, TypeError, AssertionError):
            return 400, {"ok": False, "error_code": 400, "description": "Bad Request"}
        with self._changed:
            self.polls.append(params)
            if self._updates_limited > 0:
                self._updates_limited -= 1
                return 429, _too_many(self._updates_retry_after)
            if isinstance(params.get("allowed_updates"), list):
                self.allowed = list(params["allowed_updates"])
            self._poller += 1
            me = self._poller
            self._changed.notify_all()  # an older poller still waiting: it is terminated
            if offset > 0:
                self.pending = [(i, u) for i, u in self.pending if i >= offset]
            elif offset < 0:
                self.pending = self.pending[offset:]
            deadline = time.monotonic() + min(timeout, 50)
            while True:
                if self._poller != me:
                    self.conflicts += 1
                    return 409, {
                        "ok": False,
                        "error_code": 409,
                        "description": "Conflict: terminated by other getUpdates request; "
                        "make sure that only one bot instance is running",
                    }
                left = deadline - time.monotonic()
                if self.pending or left <= 0 or self._closed:
                    return 200, {"ok": True, "result": [u for _, u in self.pending[:limit]]}
                self._changed.wait(left)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        super().close()

    def texts(self) -> list[str]:
        with self.lock:
            return [m["text"] for m in self.messages]

    def texts_to(self, chat_id: int | str) -> list[str]:
        with self.lock:
            return [m["text"] for m in self.messages if str(m["chat_id"]) == str(chat_id)]


def _too_many(retry_after: int) -> dict[str, Any]:
    return {
        "ok": False,
        "error_code": 429,
        "description": f"Too Many Requests: retry after {retry_after}",
        "parameters": {"retry_after": retry_after},
    }


def history_ready(work: rq.DataRequest, status: int = rq.HISTORY_OK) -> rq.HistoryReadyNotification:
    """What the stream job publishes when a history request's candles are in Iceberg: the
    answer a stand-in for ingestor and job gives at once."""
    return rq.HistoryReadyNotification(
        request_id=work.request_id,
        status=status,  # type: ignore[arg-type]
        row_count=(work.end_ms - work.start_ms) // (work.period_s * 1000),
        iceberg_table="candlewire.ohlc",
        ticker=work.ticker,
        period_s=work.period_s,
        start_ms=work.start_ms,
        end_ms=work.end_ms,
        error_message="" if status == rq.HISTORY_OK else "unknown symbol",
    )


class TickFeed:
    """Ticks of one new ticker, handed to the stream job's publisher (anything with its
    ``publish_ticks``) as the live query hands them: consecutive Kafka offsets of one
    partition, each tick's trade id its offset, stamped with the time it is made."""

    def __init__(self, publisher: Any, prefix: str = "SIM:T", side: int = 0) -> None:
        self.publisher, self.side = publisher, side  # side: none (0) unless given
        self.ticker = f"{prefix}{uuid.uuid4().hex[:8].upper()}/USDT"
        self.topic = market_data_topic(self.ticker, tick_type())
        self.next_offset = 0

    def records(self, n: int) -> list[tuple[bytes, bytes, int, int]]:
        topic, now, out = self.topic.encode(), time.time_ns(), []
        for _ in range(n):
            tick = market_pb2.Tick(
                ticker=self.ticker,
                trade_id=str(self.next_offset),
                price="100.25",
                size="0.01",
                side=self.side,
                exchange_time_ns=now,
                ingest_time_ns=now,
            )
            out.append((topic, to_record(tick), 0, self.next_offset))
            self.next_offset += 1
        return out

    def publish(self, n: int) -> None:
        self.publisher.publish_ticks(self.records(n))

    def flow(self, per_s: int, seconds: float) -> threading.Thread:
        """Publish ``per_s`` ticks a second for ``seconds`` (exactly that many in all), in
        the background."""

        def run() -> None:
            start, total, sent = time.monotonic(), int(per_s * seconds), 0
            while sent < total:
                due = min(int((time.monotonic() - start) * per_s), total) - sent
                if due > 0:
                    self.publish(due)
                    sent += due
                time.sleep(0.005)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t


def list_symbols(settings: Settings, tickers: list[str]) -> None:
    """Symbol metadata for tickers nobody else streams (``EXCHANGE:BASE/QUOTE``), written
    into the Iceberg table directly: what a test or bench trades must be listed before the
    stream job accepts triggers on it."""
    from datetime import UTC, datetime

    import pyarrow as pa

    from candlewire.lake import load_table
    from candlewire.topics import parse_ticker

    table = load_table(settings, "symbol_metadata")
    now = datetime.now(UTC)
    rows = []
    for t in tickers:
        parsed = parse_ticker(t)
        rows.append(
            {
                "ticker": t,
                "exchange": parsed.exchange,
                "base": parsed.base,
                "quote": parsed.quote,
                "status": "TRADING",
                "update_time": now,
            }
        )
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))

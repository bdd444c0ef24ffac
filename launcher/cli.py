"""The ``candlewire`` command.

Client verbs (``watch``, ``history``, ``chart``, ``trigger``, ``endpoints``) need only the plain install; service
verbs import their service when run, and say which install they need when it is missing.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import math
import os
import re
import sys
import threading
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from candlewire.config import (
    PERIODS_TEXT,
    POSTGRES_PASSWORD,
    PortTaken,
    Settings,
    settings_problem,
)
from candlewire.curve import ROLES
from candlewire.times import to_ms
from candlewire.topics import book_type
from candlewire.triggers import KINDS
from launcher.formats import FORMATS, WATCH_FORMATS

if TYPE_CHECKING:
    from collections.abc import Iterator

    from google.protobuf.message import Message
    from rich.console import Console

    from candlewire.client import Item, Subscription
    from candlewire.market import Candle, Tick

# Third-party packages only the platform extra installs.
PLATFORM_MODULES = frozenset(
    {"pyspark", "dagster", "confluent_kafka", "prometheus_client", "ccxt", "websockets"}
    | {"itsdangerous", "httpx", "aiosmtplib", "pywebpush", "numpy"}
)


def _relay(args: argparse.Namespace, settings: Settings) -> int:
    from relay import Relay

    Relay(settings).run()
    return 0


def exchanges_of(args: argparse.Namespace, settings: Settings) -> list:
    """``--exchange``'s adapters; REPLAY's options over ``[ingest.replay]``."""
    from ingest.exchanges import make_exchange

    replay = settings.ingest.replay.model_copy(
        update={
            k: v
            for k, v in (("root", args.replay_root), ("speed", args.speed), ("clock", args.clock))
            if v is not None
        }
    )
    faults = settings.ingest.sim_faults if args.faults is None else args.faults
    return [make_exchange(spec, replay, faults) for spec in args.exchange.split(",") if spec]


def _ingest(args: argparse.Namespace, settings: Settings) -> int:
    from ingest.service import Ingestor

    exchanges = exchanges_of(args, settings)
    always_on = [t for t in args.stream.split(",") if t]
    Ingestor(
        settings, exchanges, ingestor_id=args.id, always_on=always_on, on_demand=args.on_demand
    ).run()
    return 0


def _stream(args: argparse.Namespace, settings: Settings) -> int:
    from streaming.job import main as stream_main

    stream_main(settings)
    return 0


def _journal(args: argparse.Namespace, settings: Settings) -> int:
    from journal.service import main as journal_main

    journal_main(settings)
    return 0


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``10m``, ``90s``, ``2h``, ``1d`` before now, or an ISO time (UTC if naive)."""
    m = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if m:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
        return (now or datetime.now(UTC)) - timedelta(**{unit: int(m.group(1))})
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since {text!r}: give a duration (10m, 90s, 2h, 1d) or an ISO time"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def speed_arg(text: str) -> float:
    from ingest.exchanges.replay import parse_speed

    try:
        return parse_speed(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def faults_arg(text: str) -> str:
    from ingest.exchanges.sim import parse_faults

    try:
        parse_faults(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


# How long ``watch`` waits for its first message before it says where it listens.
WATCH_SILENCE_S = 15.0
# What history and chart say when Iceberg holds no candles of the range.
NOTHING_STORED = "Iceberg holds no candles of that ticker, period and range"


def time_arg(text: str) -> int:
    """``--start``/``--end``: epoch milliseconds or ISO 8601 (UTC if no zone)."""
    from candlewire.errors import BadTime

    try:
        return int(text) if text.strip().isdigit() else to_ms(text, "time")
    except BadTime as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("time=")) from None


def _history(args: argparse.Namespace, settings: Settings) -> int:
    """A table on a terminal; piped with no ``--format``, CSV with every column (a table
    would drop columns to fit 80 characters)."""
    from candlewire.client import Client
    from launcher.render import print_table, to_file

    with Client(settings) as client:
        if args.fetch:
            table = client.request_history(
                args.ticker, args.period, args.start, args.end, read=True, timeout=args.timeout
            )
        else:
            table = client.history(args.ticker, args.period, args.start, args.end)
    if not table.num_rows and not args.fetch:
        print(f"{NOTHING_STORED}; --fetch asks an ingestor for them", file=sys.stderr)
    piped = args.format is None and not sys.stdout.isatty()
    if args.output or args.format not in (None, "table") or piped:
        fmt = to_file(table, args.output, args.format)
        if args.output not in (None, "-"):
            print(f"{table.num_rows} rows written to {args.output} ({fmt})", file=sys.stderr)
    else:
        print_table(table)
    return 0


def _chart(args: argparse.Namespace, settings: Settings) -> int:
    from candlewire.client import Client
    from launcher.chart import html_chart

    with Client(settings) as client:
        table = client.history(args.ticker, args.period, args.start, args.end)
    if not table.num_rows:
        print(
            f"{NOTHING_STORED}: `candlewire history {args.ticker} --period {args.period} "
            "--start … --end … --fetch` asks an ingestor for them first",
            file=sys.stderr,
        )
        return 1
    output = args.output or f"{args.ticker.replace(':', '_').replace('/', '')}-{args.period}.html"
    with open(output, "w", encoding="utf-8") as f:
        f.write(html_chart(table, args.ticker, args.period))
    print(f"{table.num_rows} candles charted in {output}", file=sys.stderr)
    return 0


def _trigger(args: argparse.Namespace, settings: Settings) -> int:
    """``trigger add|rm|ls``: one client id per user of the CLI, so ``ls`` and ``rm`` find
    what ``add`` registered."""
    from google.protobuf import json_format

    from candlewire.client import Client
    from candlewire.curve import owned_id
    from candlewire.triggers import condition

    client_id = args.client_id or owned_id(settings, f"cli-{getpass.getuser()}")
    with Client(settings, client_id=client_id) as client:
        if args.action == "add":
            cond = condition(
                args.kind,
                level=args.level,
                percent=args.percent,
                volume=args.volume,
                window_s=args.window,
                period_s=args.period,
                candles=args.candles,
                direction=args.direction if args.kind != "window_volume" else None,
            )
            ack = client.add_trigger(
                args.ticker,
                cond,
                trigger_id=args.id,
                user_id=args.user or "",
                once=args.rearm is None,
                cooldown_s=args.rearm or 0,
                critical=args.critical,
            )
            print(f"trigger {ack.trigger_id} registered")
        elif args.action == "rm":
            client.remove_trigger(args.id)
            print(f"trigger {args.id} removed")
        else:
            triggers = client.list_triggers()
            if args.format == "json":
                for t in triggers:
                    print(json_format.MessageToJson(t, indent=None))
            elif not triggers:
                print(f"{client_id} has no triggers", file=sys.stderr)
            else:
                from rich.console import Console

                from launcher.render import trigger_table

                # Piped, a row a line at its natural width, for grep; a terminal wraps.
                Console(width=None if sys.stdout.isatty() else 240).print(trigger_table(triggers))
    return 0


def _watch(args: argparse.Namespace, settings: Settings) -> int:
    """One line per message, a message fetched from the journal after a gap marked
    ``repaired``; what was repaired or left out, summed up on standard error at the end."""
    from candlewire.client import Client
    from launcher.render import LiveLines, live_record

    lines = LiveLines()
    console = None
    if args.format == "text" and sys.stdout.isatty():  # piped, the same characters unstyled
        from rich.console import Console

        console = Console(soft_wrap=True, highlight=False)

    def emit(item: Tick | Candle | Message, repaired: bool) -> None:
        if args.format == "json":
            print(json.dumps(live_record(item, repaired)), flush=True)
        elif console is not None:
            console.print(lines.line(item, repaired))
        else:
            print(lines.line(item, repaired).plain, flush=True)

    if args.type == book_type():
        return _watch_book(args, settings)
    with Client(settings) as client:
        sub = client.subscribe(args.ticker, args.type, since=args.since)
        silence = _silence_notice(settings)  # after: a refused ticker has nothing to wait on
        try:
            for i, (item, repaired) in enumerate(marked(sub), start=1):
                silence.cancel()
                emit(item, repaired)
                if args.count and i >= args.count:
                    break
        finally:
            silence.cancel()
            if sub.stats.gaps:
                print(
                    f"{sub.stats.gaps} sequence gaps repaired: {sub.stats.filled} messages "
                    "fetched from the journal",
                    file=sys.stderr,
                )
            if sub.stats.malformed:
                print(
                    f"{sub.stats.malformed} messages left out: a price or size not a decimal",
                    file=sys.stderr,
                )
    return 0


def _watch_book(args: argparse.Namespace, settings: Settings) -> int:
    """A live ladder of the book on a terminal, redrawn as it changes (at most 10 times a
    second); else one JSON object per update (``--format json``, or piped)."""
    from candlewire.client import Client
    from launcher.render import book_ladder, book_record

    live = None
    if args.format == "text" and sys.stdout.isatty():
        from rich.live import Live

        live = Live(refresh_per_second=10, auto_refresh=True)
    with Client(settings) as client:
        sub = client.subscribe(args.ticker, "book", since=args.since, depth=args.depth)
        silence = _silence_notice(settings)
        try:
            if live is not None:
                live.start()
            for i, book in enumerate(sub, start=1):
                silence.cancel()
                if live is not None:
                    live.update(book_ladder(book))
                else:
                    print(json.dumps(book_record(book)), flush=True)
                if args.count and i >= args.count:
                    break
        finally:
            silence.cancel()
            if live is not None:
                live.stop()
            if sub.stats.gaps:
                print(f"{sub.stats.gaps} sequence gaps repaired from the journal", file=sys.stderr)
    return 0


def _silence_notice(settings: Settings, after_s: float | None = None) -> threading.Timer:
    """A timer that says once, on standard error, where ``watch`` listens and what to check
    when nothing has come after ``after_s`` (a ZeroMQ subscriber to nowhere waits silently);
    the caller cancels it at the first message. Watching goes on either way."""
    after_s = WATCH_SILENCE_S if after_s is None else after_s
    relays = ", ".join(settings.relays("market_data"))
    if settings.security.curve:
        keys = f"CURVE on, keys from {settings.keys_dir().resolve()}"
    else:
        keys = (
            f"CURVE off: no keys in {settings.keys_dir().resolve()}; a stack with CURVE refuses it"
        )
    text = (
        f"nothing in {after_s:.0f} s from {relays} ({keys}). A quiet ticker may have had no "
        "trade; else, is the stack up (`candlewire status`), and does this run inside its "
        "checkout (or with CANDLEWIRE_STATE_DIR set)? Waiting on."
    )
    timer = threading.Timer(after_s, lambda: print(text, file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    return timer


def marked(sub: Subscription) -> Iterator[tuple[Item, bool]]:
    """Each message of ``sub`` with whether it was fetched from the journal after a gap:
    ``stats`` counts a fill's messages before its first is handed out, so the next that many
    are the fill's."""
    seen = owed = 0
    for item in sub:
        owed += sub.stats.filled - seen
        seen = sub.stats.filled
        yield item, owed > 0
        owed = max(owed - 1, 0)


def _gateway(args: argparse.Namespace, settings: Settings) -> int:
    from gateway.config import GatewaySettings

    gw = GatewaySettings.load(settings)
    if args.action == "token":
        from gateway.auth import issue_token

        print(issue_token(gw.secret.get_secret_value(), args.user))
        return 0
    if args.action == "user":
        import json
        from pathlib import Path

        from gateway.directory import Directory

        push = (
            json.loads(Path(args.push_subscription).read_text()) if args.push_subscription else None
        )
        directory = Directory(gw.directory_url or settings.sql_url()).create()
        directory.set_user(
            args.user, telegram_chat_id=args.telegram_chat, email=args.email, push_subscription=push
        )
        print(directory.user(args.user))
        directory.close()
        return 0
    from gateway.service import Gateway

    Gateway(settings, gw).run()
    return 0


def _local(settings: Settings) -> bool:
    """Whether the stack's parts run on this host, so its state dir says what runs."""
    return settings.host in ("127.0.0.1", "localhost")


def _stack(args: argparse.Namespace, settings: Settings) -> int:
    from rich.console import Console
    from rich.table import Table

    from candlewire.curve import Keyring
    from candlewire.errors import CandlewireError
    from launcher.stack import (
        CatalogService,
        Memory,
        Stack,
        default_services,
        live_ingestors,
        seed_symbol_metadata,
        stack_memory,
    )

    console = Console()
    try:
        if args.command == "up" and not settings.curve_chosen():
            # The local stack runs with CURVE on unless told otherwise.
            made = Keyring(settings).init()
            settings.security.curve = True
            if made:
                console.print(f"keys: made {', '.join(made)} in {settings.keys_dir()}")
        if args.command != "up" and _local(settings) and not settings.state_dir.exists():
            # Nothing can run from a state dir that is not there; building the services
            # would make its secrets, in whatever directory this was run from.
            console.print(
                f"nothing of the stack runs from {settings.state_dir.resolve()}: there is no "
                "state there (`make up` starts it)"
            )
            return 1 if args.command == "status" else 0
        stack = Stack(settings, default_services(settings))
        if args.command == "up":
            stack.up(console.print)
            seed_symbol_metadata(settings, console.print)
        elif args.command == "down":
            stack.down(console.print)
        else:
            table = Table(
                "service", "port", "pid", "health", "RSS MiB", "PSS MiB", show_footer=True
            )
            rows, mem = stack.status(), stack_memory(stack.services)
            for name, port, pid, health in rows:
                rss, pss = (
                    (f"{m.rss:,.0f}", f"{m.pss:,.0f}") if (m := mem.get(name)) else ("-", "-")
                )
                table.add_row(name, str(port or "-"), str(pid or "-"), health, rss, pss)
            total = sum(mem.values(), Memory())
            table.columns[0].footer = "all"
            table.columns[4].footer = f"{total.rss:,.0f}"
            table.columns[5].footer = f"{total.pss:,.0f}"
            console.print(table)
            # What runs here: with the stack's parts on another host (``host``), nothing
            # here says whether they run, so they are asked as before.
            here = _local(settings)
            stopped = {n for n, _, _, health in rows if health == "stopped"} if here else set()
            parts = {s.name for s in stack.services if not isinstance(s, CatalogService)}
            if here and stopped >= parts:
                console.print(
                    f"nothing of the stack runs from {settings.state_dir.resolve()}: `make up` "
                    "starts it"
                )
                return 1
            console.print(f"the stack holds {total.pss:,.0f} MiB (PSS: a shared page counts once)")
            # What only a running relay or broker can tell: not waited for when it is stopped.
            if "relay" not in stopped:
                ingestors = live_ingestors(settings)
                live = Table("exchange", "live ingestors (heartbeats via the relay)")
                for exchange, peers in sorted(ingestors.items()):
                    live.add_row(exchange, ", ".join(f"{i} {s}" for i, s in sorted(peers.items())))
                console.print(live if ingestors else "no live ingestor heard")
            _print_iceberg_behind(settings, console)
            if any(n.startswith("kafka") and n not in stopped for n in parts):  # any broker
                _print_gaps(settings, console)
            # Whether auth is on, never the secret itself.
            login = "password (scram-sha-256)" if settings.secret(POSTGRES_PASSWORD) else "none"
            console.print(f"PostgreSQL login: {login}")
            kafka = f"SASL/{settings.kafka.mechanism}" if settings.kafka.sasl else "none"
            console.print(f"Kafka login: {kafka}")
            curve = "on" if settings.security.curve else "off"
            console.print(f"ZeroMQ CURVE: {curve}, {len(Keyring(settings).allowed())} keys allowed")
            return 0 if all(h == "healthy" for *_, h in rows) else 1
    except (OSError, CandlewireError) as exc:  # a StackError is a CandlewireError
        console.print(f"[red]error:[/red] {exc}")
        return 1
    return 0


def _print_iceberg_behind(settings: Settings, console: Console) -> None:
    """How far behind Kafka Iceberg's ticks and candles are, from the stream job's own gauge;
    nothing when the job is down (its row above says so)."""
    from launcher.stack import gauge
    from streaming.metrics import ICEBERG_BEHIND

    behind = gauge(settings, "stream_metrics", ICEBERG_BEHIND)
    if behind is None:
        return
    if math.isnan(behind):
        console.print("Iceberg: the stream job's first commit since it started is running")
    else:
        console.print(f"Iceberg's ticks and candles hold every tick Kafka held {behind:,.0f} s ago")


STATUS_GAPS_READ = 10_000  # records of the gaps topic `status` reads at most, the newest


def _print_gaps(settings: Settings, console: Console) -> None:
    """The gaps ingestors found in their streams, if any; never fails the status."""
    from candlewire.gaps import read_gaps
    from launcher.render import gap_table

    try:
        gaps = read_gaps(settings, timeout_s=2.0, limit=STATUS_GAPS_READ).listed()
    except Exception as exc:  # Kafka down is reported above; say why here too
        console.print(f"gaps: not read ({exc})")
        return
    console.print(gap_table(gaps) if gaps else "no gaps recorded in live streams")


def _keys(args: argparse.Namespace, settings: Settings) -> int:
    from candlewire.curve import SERVERS, Keyring, MissingKey

    ring = Keyring(settings)
    if args.keys_command == "init":
        made = ring.init()
        print(
            f"{len(made)} key pairs made in {ring.dir}" + (f": {', '.join(made)}" if made else "")
        )
    elif args.keys_command == "add-client":
        try:
            path = ring.add_client(args.name, args.role, args.user or "")
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{args.name} ({args.role}{', user ' + args.user if args.user else ''}): {path}")
    elif args.keys_command == "export":
        try:
            export = ring.export(settings, args.name, args.bind_host)
        except (ValueError, MissingKey) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        write_secret(
            args.output or f"candlewire-{args.name}.json",
            json.dumps(export, indent=1, ensure_ascii=False),
        )
        if args.output != "-":
            print(
                f"{args.output or f'candlewire-{args.name}.json'} (0600, it holds a secret "
                f"key): {args.name}'s key pair ({export['role']}), the relay's public key "
                f"and {len(export['endpoints'])} endpoints",
                file=sys.stderr,
            )
    else:
        servers = [(n, ring.public(n).decode()) for n in SERVERS if ring.has(n)]
        for name, key in servers:  # the keys clients check their servers by
            print(f"{name:<16} {'server':<10} {'-':<12} {key}")
        for key, peer in sorted(ring.allowed().items(), key=lambda kv: kv[1].name):
            print(f"{peer.name:<16} {peer.role:<10} {peer.user or '-':<12} {key}")
    return 0


def write_secret(path: str, text: str) -> None:
    """``text`` to ``path`` (``-``: standard output), readable by its owner only, also when
    the file was there before with other modes."""
    if path == "-":
        print(text)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text + "\n")


def _endpoints(args: argparse.Namespace, settings: Settings) -> int:
    from candlewire.endpoints import markdown_table

    print(markdown_table())
    return 0


# What ``candlewire --help`` ends with: the tutorial's first steps (docs/tutorial.md).
FIRST_STEPS = """first steps (docs/tutorial.md walks through them):
  candlewire up                             start the stack here (about 30 s)
  candlewire watch BINANCE:BTC/USDT         live trades, one line each
  candlewire watch BINANCE:BTC/USDT --type ohlc:60
                                            1-minute candles, forming and closed
  candlewire history BINANCE:BTC/USDT --period 3600 --start 2024-01-01 \\
      --end 2024-01-02 --fetch              a day of hourly candles
  candlewire status                         what runs, where, its memory
  candlewire down                           stop it; the data stays

'candlewire COMMAND --help' says more about each command."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="candlewire",
        description="Live and historical market data: trades and candles as they\n"
        "happen, history from Iceberg, and alerts on the conditions you set.",
        epilog=FIRST_STEPS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (
        ("up", "start the local stack: Kafka, PostgreSQL, Spark, the services, Dagster"),
        ("status", "each part of the local stack: running or not, its port, its memory"),
        ("down", "stop the local stack (its data stays)"),
    ):
        sub.add_parser(name, help=text).set_defaults(fn=_stack)
    watch = sub.add_parser("watch", help="print live messages of a ticker")
    watch.add_argument("ticker", help="EXCHANGE:BASE/QUOTE, e.g. BINANCE:BTC/USDT")
    watch.add_argument("--type", default="tick", help="tick, ohlc:<period_s> or book")
    watch.add_argument(
        "--depth", type=int, default=10, help="book: levels a side shown (default 10)"
    )
    watch.add_argument("--count", type=int, default=0, help="stop after N messages")
    watch.add_argument(
        "--format",
        choices=WATCH_FORMATS,
        default="text",
        help="text: one aligned line per message (time, ticker, side size @ price or "
        "O H L C V, forming or closed, 'repaired' if fetched after a gap); json: one object "
        "per line, snake_case, decimals as strings, ISO times",
    )
    watch.add_argument(
        "--since",
        type=parse_since,
        default=None,
        help="replay from the journal first: a duration (10m, 2h) or an ISO time",
    )
    watch.set_defaults(fn=_watch)
    hist = sub.add_parser("history", help="print or save candles from Iceberg")
    hist.add_argument("ticker")
    hist.add_argument(
        "--period", type=int, default=60, help=f"seconds, one of {PERIODS_TEXT} (default 60)"
    )
    hist.add_argument(
        "--start", required=True, type=time_arg, help="ISO time or epoch ms, UTC if no zone"
    )
    hist.add_argument("--end", required=True, type=time_arg, help="ISO time or epoch ms, exclusive")
    hist.add_argument("--fetch", action="store_true", help="request it through the relay first")
    hist.add_argument(
        "--timeout", type=float, default=300.0, help="--fetch: seconds to wait (default 300)"
    )
    hist.add_argument(
        "--format",
        choices=FORMATS,
        help="table (the default on a terminal), or csv, json, parquet: every column",
    )
    hist.add_argument(
        "--output", help="write to this file (format from --format or its extension; - stdout)"
    )
    hist.set_defaults(fn=_history)
    chart = sub.add_parser("chart", help="write an HTML chart of candles from Iceberg")
    chart.add_argument("ticker")
    chart.add_argument(
        "--period", type=int, default=3600, help=f"seconds, one of {PERIODS_TEXT} (default 3600)"
    )
    chart.add_argument("--start", required=True, type=time_arg, help="ISO time or epoch ms")
    chart.add_argument("--end", required=True, type=time_arg, help="ISO time or epoch ms")
    chart.add_argument("--output", help="the .html file (default: TICKER-PERIOD.html)")
    chart.set_defaults(fn=_chart)
    trig = sub.add_parser("trigger", help="register, remove or list CEP triggers")
    trig.add_argument(
        "--client-id",
        default=None,
        help="the owner whose triggers these are (default: cli-<login>, under the CURVE key's "
        "name when CURVE is on)",
    )
    trig_sub = trig.add_subparsers(dest="action", required=True)
    add = trig_sub.add_parser("add", help="register a trigger")
    add.add_argument("ticker", help="EXCHANGE:BASE/QUOTE, listed in symbol metadata")
    add.add_argument("kind", choices=KINDS)
    add.add_argument(
        "--direction",
        default="up",
        choices=("up", "down", "either"),
        help="up (the default): at or above a level, a rise; down; either (percent_move)",
    )
    add.add_argument("--level", help="price_cross, candle_close: the price level")
    add.add_argument("--percent", help="percent_move: e.g. 3 for 3 %%")
    add.add_argument("--volume", help="window_volume: the volume to reach")
    add.add_argument("--window", type=int, help="percent_move, window_volume: seconds")
    add.add_argument("--period", type=int, help="candle_close, range_breakout: seconds")
    add.add_argument("--candles", type=int, help="range_breakout: how many candles back")
    add.add_argument("--rearm", type=int, metavar="COOLDOWN_S", help="re-arm after this cooldown")
    add.add_argument("--critical", action="store_true", help="alert through the acked path")
    add.add_argument("--user", help="the user who gets the alert")
    add.add_argument("--id", help="trigger id (default: random)")
    rm = trig_sub.add_parser("rm", help="remove a trigger")
    rm.add_argument("id")
    ls = trig_sub.add_parser("ls", help="list the triggers")
    ls.add_argument(
        "--format",
        default="table",
        choices=("table", "json"),
        help="a table, or one JSON object a trigger as the wire has it (camelCase names)",
    )
    trig.set_defaults(fn=_trigger)
    sub.add_parser("endpoints", help="print the endpoint table").set_defaults(fn=_endpoints)
    gw = sub.add_parser("gateway", help="run the user-event gateway, or manage its users")
    gw.set_defaults(fn=_gateway, action="run")
    gw_sub = gw.add_subparsers(dest="action")
    gw_sub.add_parser("run", help="run the gateway in the foreground (the default)")
    token = gw_sub.add_parser("token", help="print a signed session token for a user")
    token.add_argument("user")
    user = gw_sub.add_parser("user", help="set where a user is reached (the user directory)")
    user.add_argument("user")
    user.add_argument("--telegram-chat", help="Telegram chat id")
    user.add_argument("--email")
    user.add_argument("--push-subscription", help="a file with the browser's PushSubscription JSON")
    keys = sub.add_parser("keys", help="CURVE keys: make them, allow clients, list, export")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    keys_sub.add_parser("init", help="make the server and service key pairs (0600)")
    client = keys_sub.add_parser("add-client", help="make a client key pair and allow it")
    client.add_argument("name")
    client.add_argument("--role", required=True, choices=ROLES)
    client.add_argument(
        "--user",
        help="the one user the key speaks for: a container's events, a client's triggers "
        "(a client key without one is the operator's: its triggers may alert anyone)",
    )
    keys_sub.add_parser("ls", help="list the server keys and the allowed keys (public halves)")
    export = keys_sub.add_parser(
        "export",
        help="write one file for a client in another language",
        description="Write one JSON file (mode 0600: it holds a secret key) with everything a "
        "client in another language needs to act as NAME: format (candlewire-key/1), name, "
        "role, user, curve (whether CURVE is on here), public_key and secret_key (NAME's pair, "
        "z85), relay_public_key (z85), client_id_prefix (its client and request ids must start "
        "with it when CURVE is on), and endpoints: for each endpoint NAME's role may use, "
        "connect (addresses to dial: every relay) or bind (a port the gateway dials), "
        "server and server_key (z85: set it as the socket's CURVE server key), and pattern.",
    )
    export.add_argument("name", help="a key made by `keys add-client` (or `keys init`)")
    export.add_argument(
        "--bind-host",
        help="a container's: the interface its events socket listens on for gateways, "
        "e.g. its own address (default: bind_host, 127.0.0.1)",
    )
    export.add_argument(
        "--output", help="the file (default: candlewire-NAME.json; - for standard output)"
    )
    keys.set_defaults(fn=_keys)
    sub.add_parser("relay", help="run the relay in the foreground").set_defaults(fn=_relay)
    ingest = sub.add_parser("ingest", help="run an ingestor in the foreground")
    ingest.add_argument(
        "--exchange",
        default="SIM",
        help="comma-separated: SIM, REPLAY, a ccxt id, or NAME=adapter (BINANCE=sim)",
    )
    ingest.add_argument("--id", default=None, help="ingestor id (default: random)")
    ingest.add_argument(
        "--replay-root",
        type=Path,
        help="REPLAY: a Binance Vision download directory (spot/daily, spot/monthly)",
    )
    ingest.add_argument(
        "--speed", type=speed_arg, help="REPLAY: trades at this pace, e.g. 10x, or max"
    )
    ingest.add_argument(
        "--clock",
        choices=("original", "live"),
        help="REPLAY: trade times as recorded (default) or shifted to now",
    )
    ingest.add_argument(
        "--faults",
        type=faults_arg,
        help="SIM: faults on purpose, e.g. drop:20s@60s,disconnect:5s@120s,rest:off,ids:opaque "
        "(default: [ingest] sim_faults)",
    )
    ingest.add_argument("--stream", default="", help="comma-separated tickers to stream always")
    ingest.add_argument(
        "--on-demand",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stream any listed ticker while someone subscribes to it (grace period: "
        "CANDLEWIRE_DEMAND_GRACE_S, default 60 s)",
    )
    ingest.set_defaults(fn=_ingest)
    sub.add_parser("stream", help="run the Spark streaming job in the foreground").set_defaults(
        fn=_stream
    )
    sub.add_parser(
        "journal", help="run the journal service (FETCH of live topics) in the foreground"
    ).set_defaults(fn=_journal)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    from candlewire.errors import CandlewireError

    try:
        settings = Settings()
    except (ValidationError, tomllib.TOMLDecodeError) as exc:  # one line, never a traceback
        print(f"error: the settings: {settings_problem(exc)}", file=sys.stderr)
        return 2
    try:
        return args.fn(args, settings)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in PLATFORM_MODULES:
            raise
        print(
            f"error: candlewire {args.command} needs the platform install ({exc.name} is "
            "missing): `make install` in the checkout, or pip install '.[platform]' there",
            file=sys.stderr,
        )
        return 1
    except PortTaken as exc:  # one line naming the port's setting, never a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except CandlewireError as exc:  # rejected, timed out, failed: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""Every topic string on the wire, each built by exactly one function.

ZeroMQ SUB filtering is by prefix, so receivers that need an exact topic (for example
``RESPONSE:client1`` must not match ``RESPONSE:client10``) compare the topic frame exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from candlewire.config import PERIODS_S, PERIODS_TEXT
from candlewire.errors import CandlewireError

METADATA_UPDATE = "METADATA_UPDATE"

# PUB/SUB drops what is published before a subscription has travelled upstream (a relay that
# just restarted, a client that just reconnected). Publishers of notifications therefore send
# each one again after these delays; receivers dedupe by request_id.
NOTIFY_REPEAT_DELAYS_S: tuple[float, ...] = (0.0, 0.5, 2.0, 5.0)

_TICKER = re.compile(
    r"^([A-Z][A-Z0-9_]{0,31}):([A-Z0-9][A-Z0-9.\-_]{0,31})/([A-Z0-9][A-Z0-9.\-_]{0,31})\Z"
)
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}\Z")


class TopicError(CandlewireError, ValueError):
    """A ticker, data type or id that cannot form a topic."""


@dataclass(frozen=True)
class Ticker:
    """A parsed ``EXCHANGE:BASE/QUOTE``; ``str()`` gives it back."""

    exchange: str
    base: str
    quote: str

    def __str__(self) -> str:
        return f"{self.exchange}:{self.base}/{self.quote}"


def parse_ticker(ticker: str) -> Ticker:
    """Split ``EXCHANGE:BASE/QUOTE``; the exchange is upper case, the pair too."""
    m = _TICKER.match(ticker)
    if m is None:
        raise TopicError(f"ticker {ticker!r} is not EXCHANGE:BASE/QUOTE (e.g. BINANCE:BTC/USDT)")
    return Ticker(*m.groups())


def check_id(value: str, what: str) -> str:
    """Ids become topic suffixes, so keep them short and free of separators."""
    if not _ID.match(value):
        raise TopicError(f"{what} {value!r} must be 1-128 of [A-Za-z0-9_.:-]")
    return value


def stream_key(ticker: str) -> str:
    """An ingestor's key for a ticker's live trade stream: a job, a peer's ``working`` entry."""
    return f"stream:{ticker}"


def book_key(ticker: str) -> str:
    """A ticker's L2 book stream (#38): a job of its own, started by ``T|book`` demand."""
    return f"book:{ticker}"


LIVE_KEYS = ("stream:", "book:")  # live jobs' keys; a fetch's key is its request_id


def check_request_id(value: str) -> str:
    """A history or metadata request's id: also its job's key among ingestors, so it must
    not look like a live job's (one named ``book:…`` started a book stream)."""
    check_id(value, "request_id")
    if value.startswith(LIVE_KEYS):
        raise TopicError(f"request_id {value!r} must not start with {' or '.join(LIVE_KEYS)}")
    return value


def tick_type() -> str:
    """The data type of trades: ``tick``."""
    return "tick"


def ohlc_type(period_s: int) -> str:
    """The data type of candles of ``period_s`` seconds: ``ohlc:60``."""
    return f"ohlc:{period_s}"


def book_type() -> str:
    """The data type of L2 order books (#38): ``book``."""
    return "book"


def market_data_topic(ticker: str, data_type: str) -> str:
    """``{ticker}|{data_type}``, e.g. ``BINANCE:BTC/USDT|tick`` or ``…|ohlc:60``."""
    return f"{ticker}|{data_type}"


# Every live data type: ``tick``, ``book`` and ``ohlc:{period}`` of each period. Made once:
# the journal checks every FETCH's topic against it, the client every subscription.
DATA_TYPES = frozenset({tick_type(), book_type(), *(ohlc_type(p) for p in PERIODS_S)})


def check_period(period_s: int) -> int:
    """A candle period, in seconds; a TopicError names the periods there are."""
    if period_s not in PERIODS_S:
        raise TopicError(f"period {period_s} is not one of {PERIODS_TEXT} (seconds)")
    return period_s


def check_market_data(ticker: str, data_type: str) -> str:
    """The topic of a ticker's live data of one type; a TopicError says why there is none
    (a subscription to it would wait for ever)."""
    if data_type not in DATA_TYPES:
        raise TopicError(
            f"data type {data_type!r} is not tick, book or ohlc:PERIOD (PERIOD one of "
            f"{PERIODS_TEXT})"
        )
    parse_ticker(ticker)
    return market_data_topic(ticker, data_type)


def subscription_error_topic(ticker: str) -> str:
    """Where a ticker's unservable subscriptions are answered (SubscriptionError)."""
    return market_data_topic(ticker, "error")


def demanded_ticker(subscription: str) -> str | None:
    """The ticker whose live data a SUB subscription asks for, else None.

    ``T|tick``, ``T|ohlc:60``, ``T|ohlc`` and ``T|`` all demand T; its error topic, other
    channels and malformed tickers do not.
    """
    ticker, sep, rest = subscription.partition("|")
    if not sep:
        return None
    data = rest == "" or tick_type().startswith(rest) or ohlc_type(0).startswith(rest[:5])
    return _valid(ticker) if data else None


def demanded_book(subscription: str) -> str | None:
    """The ticker whose order book a SUB subscription asks for (exactly ``T|book``), else
    None: books are streamed only for those who ask, not for every ``T|`` watcher."""
    ticker, sep, rest = subscription.partition("|")
    return _valid(ticker) if sep and rest == book_type() else None


def valid(ticker: str) -> bool:
    """Whether ``ticker`` is one (``EXCHANGE:BASE/QUOTE``)."""
    return _TICKER.match(ticker) is not None


def _valid(ticker: str) -> str | None:
    """``ticker`` when it is one, else None: a subscription to a malformed one demands nothing."""
    return ticker if valid(ticker) else None


def demanded_data(subscription: str) -> str | None:
    """The ticker whose live data of any kind (trades, candles, book) a subscription asks
    for: what a relay checks an ingestor serves."""
    return demanded_ticker(subscription) or demanded_book(subscription)


def response_topic(client_id: str) -> str:
    """A client's notifications (``notify="client"``), trigger acks and firings."""
    return f"RESPONSE:{client_id}"


def history_ready_topic(request_id: str) -> str:
    """One history request's notification (``notify="request"``)."""
    return f"HISTORY_READY:{request_id}"


def notification_prefixes() -> tuple[str, ...]:
    """What every per-client and per-request notification topic starts with."""
    return response_topic(""), history_ready_topic("")


def metadata_update_topic() -> str:
    """Where ``SymbolMetadataUpdated`` is published after a refresh is in Iceberg."""
    return METADATA_UPDATE


def work_prefix(exchange: str) -> str:
    """Work-queue topic; the colon keeps ``BINANCE:`` from matching ``BINANCEUS:``."""
    return f"{exchange}:"


def user_topic(user_id: str) -> str:
    """A user's informational events on a container's XPUB."""
    return f"USER:{user_id}"


def trigger_work_topic() -> str:
    """Where the relay hands CEP trigger requests to the stream processor, on the work queue:
    lower case, so no exchange's ``{EXCHANGE}:`` prefix can match it."""
    return "cep"


def ingestor_topic(exchange: str) -> str:
    """Ingestor heartbeats of one exchange, fanned out by the relay like market data."""
    return f"INGESTOR:{exchange}"

"""Who watches which ticker, read from an XPUB's subscription messages.

A relay's market-data XPUB passes each topic's first subscription and last unsubscription
upstream through its XSUB, which forwards them to every publisher connected to it. A
publisher that is itself an XPUB therefore learns, without one Python step per data
message, which topics someone somewhere watches. libzmq rebuilds that state on its own:
SUB sockets resend their subscriptions when they reconnect to a restarted relay, and an
XPUB drops a dead connection's subscriptions (ZMTP heartbeats time it out) as if they had
been unsubscribed: a bound XPUB always, a dialling one when its pipes end with their
connections (:func:`candlewire.zmqutil.publish_to_relays`). That makes a subscription a lease
nobody has to renew by hand.

An XPUB reports the first subscribe and last unsubscribe of each topic across all its
connections, so several relays and several subscribers per topic count correctly; a ticker
is watched while at least one of its data topics is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from candlewire.topics import demanded_ticker, subscription_error_topic
from proto import requests_pb2 as rq
from proto.envelope import encode_topic

# A SubscriptionError is repeated this often while the ticker stays watched: PUB/SUB gives
# no delivery guarantee, and a later subscriber of the same topic sends no new subscription.
ERROR_REPEAT_S = 3.0


def subscription_error(ticker: str, reason: int, message: str, source: str) -> list[bytes]:
    """The frames that tell a ticker's subscribers why nothing will flow."""
    err = rq.SubscriptionError(
        ticker=ticker,
        reason=reason,
        error_message=message,
        source=source,
        time_ms=int(time.time() * 1000),
    )
    return encode_topic(subscription_error_topic(ticker), err)


@dataclass
class Demand:
    """Watched tickers, and since when the unwatched ones have been idle.

    ``grace_s=None`` keeps no idle times: for a watcher that only asks what is watched now.
    ``accepts`` says which ticker a subscription watches (trades and candles by default;
    :func:`candlewire.topics.demanded_book` for books).
    """

    grace_s: float | None
    topics: dict[str, set[str]] = field(default_factory=dict)
    idle_since: dict[str, float] = field(default_factory=dict)
    accepts: Callable[[str], str | None] = demanded_ticker

    def apply(self, subscribed: bool, topic: str, now: float) -> tuple[str, bool] | None:
        """Feed one subscription change; return (ticker, watched) when the ticker flips."""
        ticker = self.accepts(topic)
        if ticker is None:
            return None
        held = self.topics.setdefault(ticker, set())
        was_watched = bool(held)
        if subscribed:
            held.add(topic)
        else:
            held.discard(topic)
        if held and not was_watched:
            self.idle_since.pop(ticker, None)
            return ticker, True
        if not held and was_watched:
            del self.topics[ticker]
            if self.grace_s is not None:
                self.idle_since[ticker] = now
            return ticker, False
        if not held:
            del self.topics[ticker]
        return None

    def watched(self, ticker: str) -> bool:
        return bool(self.topics.get(ticker))

    def tickers(self) -> list[str]:
        return [t for t, held in self.topics.items() if held]

    def expired(self, now: float) -> list[str]:
        """Tickers unwatched for the whole grace period; each is reported once."""
        if self.grace_s is None:
            return []
        out = [t for t, since in self.idle_since.items() if now - since >= self.grace_s]
        for t in out:
            del self.idle_since[t]
        return out

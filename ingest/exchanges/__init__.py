"""Exchange adapters, one file each, behind :class:`ingest.exchanges.base.Exchange`."""

from __future__ import annotations

from ingest.exchanges.base import Exchange


def make_exchange(spec: str) -> Exchange:
    """``SIM``, ``REPLAY``, a ccxt id (``BINANCE`` → ccxt.binance), or ``NAME=adapter``.

    ``BINANCE=sim`` runs the simulator under the BINANCE label (tickers BINANCE:BTC/USDT).
    """
    name, _, adapter = spec.partition("=")
    name, adapter = name.upper(), (adapter or name).lower()
    if adapter == "sim":
        from ingest.exchanges.sim import SimExchange

        return SimExchange(name=name)
    if adapter == "replay":
        from ingest.exchanges.replay import ReplayExchange

        return ReplayExchange(name=name)
    from ingest.exchanges.ccxt_exchange import CcxtExchange

    return CcxtExchange(adapter, name=name)

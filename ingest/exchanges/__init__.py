"""Exchange adapters, one file each, behind :class:`ingest.exchanges.base.Exchange`."""

from __future__ import annotations

from candlewire.config import ReplaySettings
from ingest.exchanges.base import Exchange


def make_exchange(
    spec: str, replay: ReplaySettings | None = None, sim_faults: str = ""
) -> Exchange:
    """``SIM``, ``REPLAY``, a ccxt id (``BINANCE`` → ccxt.binance), or ``NAME=adapter``.

    ``BINANCE=sim`` runs the simulator under the BINANCE label (tickers BINANCE:BTC/USDT);
    ``replay`` says where REPLAY reads (``[ingest.replay]``); ``sim_faults`` is what every
    SIM adapter gets wrong on purpose (:func:`ingest.exchanges.sim.parse_faults`).
    """
    name, _, adapter = spec.partition("=")
    name, adapter = name.upper(), (adapter or name).lower()
    if adapter == "sim":
        from ingest.exchanges.sim import SimExchange

        return SimExchange(name=name, faults=sim_faults)
    if adapter == "replay":
        from ingest.exchanges.replay import ReplayExchange

        replay = replay or ReplaySettings()
        if replay.root is None:
            return ReplayExchange(name=name, speed=replay.speed, clock=replay.clock)
        return ReplayExchange(name, replay.root, replay.speed, replay.clock)
    from ingest.exchanges.ccxt_exchange import CcxtExchange

    return CcxtExchange(adapter, name=name)

"""Client and AsyncClient are two shells over one core: their public APIs must not drift."""

from __future__ import annotations

import inspect

from candlewire import AsyncClient, Client

# Blocking on both: closing frees sockets, subscribe returns an (async) iterator.
NOT_AWAITED = {"close", "subscribe"}


def public(cls: type) -> dict[str, object]:
    return {n: v for n, v in vars(cls).items() if not n.startswith("_")}


def shape(fn: object) -> list[tuple[str, object, object]]:
    """Parameters by name, kind and default; annotations differ (sync vs asyncio types)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_both_clients_offer_the_same_public_names() -> None:
    assert sorted(public(Client)) == sorted(public(AsyncClient))


def test_every_method_takes_the_same_parameters() -> None:
    for name, sync in public(Client).items():
        if callable(sync):
            assert shape(sync) == shape(getattr(AsyncClient, name)), name
    assert shape(Client.__init__) == shape(AsyncClient.__init__)


def test_async_methods_are_awaitable_and_sync_ones_are_not() -> None:
    for name, sync in public(Client).items():
        if not callable(sync):
            continue
        awaited = inspect.iscoroutinefunction(getattr(AsyncClient, name))
        assert awaited == (name not in NOT_AWAITED), name
        assert not inspect.iscoroutinefunction(sync), name

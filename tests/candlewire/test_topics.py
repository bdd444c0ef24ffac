"""Tickers and ids, which become topic suffixes and job keys: what passes and what not."""

from __future__ import annotations

import pytest

from candlewire.topics import TopicError, check_id, check_request_id, parse_ticker


@pytest.mark.parametrize("ticker", ["BINANCE:BTC/USDT", "SIM:ETH-PERP/USD_T", "A:1/2"])
def test_a_ticker_parses_back_to_itself(ticker: str) -> None:
    assert str(parse_ticker(ticker)) == ticker


@pytest.mark.parametrize(
    "ticker",
    # A trailing newline passed ``$``; the ticker then reached topics with it.
    ["BINANCE:BTC/USDT\n", "binance:BTC/USDT", "BINANCE:BTC-USDT", "BINANCE:BTC/USDT ", ""],
)
def test_a_ticker_not_of_the_form_is_refused(ticker: str) -> None:
    with pytest.raises(TopicError, match="is not EXCHANGE:BASE/QUOTE"):
        parse_ticker(ticker)


@pytest.mark.parametrize("value", ["alice\n", "", "-x", "a b", "a/b", "a" * 129, "é"])
def test_an_id_not_of_the_form_is_refused(value: str) -> None:
    with pytest.raises(TopicError, match="must be 1-128 of"):
        check_id(value, "user_id")


@pytest.mark.parametrize("value", ["alice", "req-1.2:3", "a" * 128, "streaming:x", "books"])
def test_ids_of_the_form_pass(value: str) -> None:
    assert check_request_id(check_id(value, "id")) == value


@pytest.mark.parametrize("value", ["stream:x", "book:x"])
def test_a_request_id_shaped_like_a_live_jobs_key_is_refused(value: str) -> None:
    with pytest.raises(TopicError, match="must not start with"):
        check_request_id(value)

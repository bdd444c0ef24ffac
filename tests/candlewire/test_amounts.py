"""Which prices and sizes the platform keeps (:mod:`candlewire.amounts`): the rule the stream
job's ``DecodeTick.held`` judges by, in Python for the ingestors and the client."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

import pytest

from candlewire.amounts import amount, held

HELD = [
    "1", "0", "-0.000", "0E-30", "1.5", ".5", "5.", "+1.5", "1E+2", "2e19",
    "99999999999999999999.999999999999999999", "1.50000000000000000000",
    "0.000000000000000001", "0E2147483647", "0E-2147483647",
]  # fmt: skip
NOT_HELD = [
    "100000000000000000000", "1.0000000000000000025", "0.0000000000000000005", "1e-19",
    "1e+20000000", "1E2147483647", "12E2147483646", "1E-2147483600",
    # Java's BigDecimal reads none of these (an exponent or a scale past an int), not even 0
    "0E2147483648", ".0E-2147483649", "0E-2147483648", "1E99999999999999999999",
    # not the wire's spelling, though Python's Decimal reads them
    "NaN", "Infinity", "1_000", " 1", "\u0661", "", ".", "1.2.3", "0x10",
]  # fmt: skip


@pytest.mark.parametrize("text", HELD)
def test_what_decimal_38_18_holds_is_held(text: str) -> None:
    assert held(text)
    assert amount(text) == Decimal(text)


@pytest.mark.parametrize("text", NOT_HELD)
def test_what_it_does_not_is_refused(text: str) -> None:
    assert not held(text)
    with pytest.raises(InvalidOperation):
        amount(text)

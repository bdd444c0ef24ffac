"""Prices and sizes as the wire spells them, and which of them the platform keeps.

A price or size travels as decimal text. The tables hold it as DECIMAL(38,18): at most 20
digits before the point and 18 after. The stream job judges every trade by that
(``DecodeTick.held`` in ``jvm/``): a trade whose price or size the tables cannot hold is
bad, and no candle folds it. Here is the same rule for the Python side: the ingestors refuse
such a trade before it reaches Kafka, and the client's typed values refuse what its Arrow
batches refuse.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# ASCII digits, an optional point and exponent, as ``DecodeTick.isDecimal`` scans them: not
# Python's Decimal grammar, which also takes "1_000", " 1", "NaN" and non-ASCII digits.
DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# Texts held for certain: no sign, no exponent, 19 digits at most before the point and 18
# after. A venue's prices and sizes are these, and take one match.
PLAIN = re.compile(r"[0-9]{1,19}(?:\.[0-9]{0,18})?")
INTEGER_DIGITS, SCALE = 20, 18  # DECIMAL(38,18)
INT_MIN, INT_MAX = -(2**31), 2**31 - 1  # Java's int
PLAIN_CHARS = "0123456789."  # a text of these alone, under 20 of them, that parses: held


def held(text: str) -> bool:
    """Whether ``text`` is a decimal as the wire spells one, and DECIMAL(38,18) holds its
    value exactly (trailing zeros aside)."""
    if PLAIN.fullmatch(text):
        return True
    if not DECIMAL_TEXT.fullmatch(text):
        return False
    return _java_reads(text) and fits(Decimal(text))


def _java_reads(text: str) -> bool:
    """Whether Java's BigDecimal reads ``text`` (of :data:`DECIMAL_TEXT`): its exponent as
    written, and its scale (the digits after the point less the exponent), each an int.
    One it does not read is bad in the stream, even a zero, so it is not held here."""
    mantissa, _e, exponent = text.lower().partition("e")
    written = int(exponent) if exponent else 0
    scale = len(mantissa.partition(".")[2]) - written
    return INT_MIN <= written <= INT_MAX and INT_MIN <= scale <= INT_MAX


def fits(value: Decimal) -> bool:
    """Whether DECIMAL(38,18) holds a finite ``value`` exactly."""
    if not value:
        return True
    _sign, digits, exponent = value.as_tuple()
    exponent = int(exponent)
    while digits[-1] == 0:  # trailing zeros aside (``normalize`` rounds to 28 digits)
        digits, exponent = digits[:-1], exponent + 1
    return exponent >= -SCALE and len(digits) + exponent <= INTEGER_DIGITS


def amount(text: str) -> Decimal:
    """A price or size as a Decimal, or InvalidOperation for one the platform does not
    keep (:func:`held`)."""
    if held(text):
        return Decimal(text)
    raise InvalidOperation(f"{text[:40]!r} is no decimal DECIMAL(38,18) holds")


def plain(value: Decimal) -> str:
    """A decimal as people write it: no exponent, no trailing zeros, zero as ``0``. Exact at
    any length: ``normalize()`` rounds to the context's 28 digits, and the tables hold 38."""
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "0") else text

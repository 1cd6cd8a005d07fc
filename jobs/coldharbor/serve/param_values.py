"""A report parameter's value, from the text an analyst typed to the Python value of its declared
type (`PARSERS`): each type accepts exactly the spellings its pattern allows, within bounds that
keep a value from costing the job memory or time (a decimal's precision and digits, a
timestamp's range), and refuses anything else in one line."""

from __future__ import annotations

import math
import re
from datetime import date, datetime, timezone
from decimal import ROUND_HALF_UP, Context, Decimal

DECIMAL = re.compile(r"^decimal\(\s*([0-9]+)\s*,\s*([0-9]+)\s*\)$")


MAX_DECIMAL_PRECISION = 38  # Spark's DecimalType.MAX_PRECISION


MAX_DIGITS_CHECKED = 100  # digits a decimal parameter may carry before its precision is checked


# The forms a value may take, ASCII only (Python's own parsers also take 1_000, other scripts'
# digits, ISO week dates and more): what is not one of them is refused, not guessed at.
_INTEGER = re.compile(r"[+-]?[0-9]+")


_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


_NOT_A_NUMBER = re.compile(r"[+-]?(?:inf|infinity|nan)", re.IGNORECASE)


_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,6})?)?)?"
                        r"(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)?")


_BLANKS = " \t\r\n"  # ASCII blanks only: no-break and other Unicode spaces are not stripped


def _matching(pattern: re.Pattern, raw: str) -> str:
    text = raw.strip(_BLANKS)
    if not pattern.fullmatch(text):
        raise ValueError("not of the form")
    return text


def _parse_decimal(raw: str, type_: str) -> Decimal:
    value = Decimal(_matching(_NUMBER, raw))
    match = DECIMAL.match(type_)
    if not match:  # a bare decimal keeps its digits: they must fit a Spark decimal
        if value.is_zero():  # 0E-50 is zero: at most 38 places of it
            value = Decimal(0).scaleb(-min(max(-value.as_tuple().exponent, 0), MAX_DECIMAL_PRECISION))
        digits, exponent = len(value.as_tuple().digits), value.as_tuple().exponent
        if max(digits + max(exponent, 0), -exponent) > MAX_DECIMAL_PRECISION:
            raise ValueError("more digits than a Spark decimal holds")
    else:
        precision, scale = int(match[1]), int(match[2])
        # Half up, as PostgreSQL's numeric and Spark's CAST round; the default context keeps 28
        # digits, so a decimal(38,10) value of 30 digits needs a wider one.
        value = value.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP,
                               context=Context(prec=MAX_DIGITS_CHECKED))
        if len(value.as_tuple().digits) > precision:
            raise ValueError("too many digits")
    return value


def _parse_double(raw: str, _type: str) -> float:
    if _NOT_A_NUMBER.fullmatch(raw.strip(_BLANKS)):
        return float(raw.strip(_BLANKS))
    text = _matching(_NUMBER, raw)
    value = float(text)
    mantissa = text.lower().partition("e")[0]
    if math.isinf(value) or (value == 0 and any(d in mantissa for d in "123456789")):
        raise ValueError("out of the range of a double")
    return value


def _parse_bool(raw: str, _type: str) -> bool:
    lowered = raw.strip(_BLANKS).lower()
    if lowered in ("true", "t", "yes", "1"):
        return True
    if lowered in ("false", "f", "no", "0"):
        return False
    raise ValueError("not a boolean")


def _parse_int(raw: str, type_: str) -> int:
    value = int(_matching(_INTEGER, raw), 10)
    bound = 2**31 if type_ == "int" else 2**63
    if not -bound <= value < bound:
        raise ValueError("out of range")
    return value


def _parse_timestamp(raw: str, _type: str) -> datetime:
    value = datetime.fromisoformat(_matching(_TIMESTAMP, raw))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


PARSERS = {
    "string": lambda raw, _t: raw,
    "int": _parse_int,
    "bigint": _parse_int,
    "double": _parse_double,
    "decimal": _parse_decimal,
    "boolean": _parse_bool,
    "date": lambda raw, _t: date.fromisoformat(_matching(_DATE, raw)),
    "timestamp": _parse_timestamp,
}

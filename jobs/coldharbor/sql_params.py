"""Report parameters bound into the checked query as typed literals, before Spark sees it.

Spark Connect (pyspark 4.2) does not bind `spark.sql(..., args=...)` on the server: every `:name`
stays unbound (UNBOUND_SQL_PARAMETER), named or positional. So the serve job binds parameters
itself, the same way on every engine: each `:name` marker of the checked tree becomes a literal
of the type Spark's own binding gives the value (`lit(value)`), built from characters that cannot
end a literal: strings travel as hex (`CAST(X'78' AS STRING)`), numbers as their digits, dates
as days and timestamps as microseconds since the epoch. A bare `:name` in the select list keeps its
parameter's name as the column's name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

from sqlglot import exp

from coldharbor.errors import ReportError
from coldharbor.sql_check import DIALECT

# What a literal's text may hold: digits, letters of hex, exponents, inf, nan and BD, . + -
_SAFE_TEXT = re.compile(r"[0-9a-zBD.+\-]*")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
_INT32 = 2**31
MAX_DECIMAL_DIGITS = 38  # Spark's DecimalType.MAX_PRECISION


def bind(sql: str, params: Mapping[str, object]) -> str:
    """`sql` (a checked query, in Spark's dialect) with every `:name` replaced by its value."""
    import sqlglot

    if ":" not in sql:
        return sql
    tree = sqlglot.parse_one(sql, read=DIALECT)
    for marker in list(tree.find_all(exp.Placeholder)):
        name = marker.this
        if name not in params:
            raise ReportError(f"the report uses parameter :{name}, which has no value")
        value = literal(params[name], name)
        if isinstance(marker.parent, exp.Select) and marker.arg_key == "expressions":
            value = exp.alias_(value, name, quoted=True)
        marker.replace(value)
    return tree.sql(dialect=DIALECT, identify=True, comments=False)


def literal(value: object, name: str) -> exp.Expression:
    """A Spark expression for `value`, of the type and nullability `pyspark.sql.functions.lit(value)`
    has (no cast from text, which Spark counts as nullable)."""
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return _cast(_number(str(value)), "INT" if -_INT32 <= value < _INT32 else "BIGINT")
    if isinstance(value, float):
        if math.isfinite(value):  # repr has a point or an exponent: a decimal or double literal
            return _cast(_number(repr(value)), "DOUBLE")
        return _cast(_string(repr(value)), "DOUBLE")  # inf, -inf, nan: no literal spells them
    if isinstance(value, Decimal):
        return _decimal(value, name)
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return _call("timestamp_micros", _number(str((moment - _EPOCH) // _MICROSECOND)))
    if isinstance(value, date):
        return _call("date_from_unix_date", _number(str((value - _EPOCH.date()).days)))
    if isinstance(value, str):
        try:
            encoded = value.encode("utf-8")
        except UnicodeEncodeError:
            raise ReportError(f"parameter {name}: the value is not valid text (it holds a lone surrogate)") from None
        _check(encoded.hex())
        return _cast(exp.HexString(this=encoded.hex()), "STRING")  # X'..': binary, cast to UTF-8 text
    raise ReportError(f"parameter {name}: a value of type {type(value).__name__} cannot be bound")


def _decimal(value: Decimal, name: str) -> exp.Expression:
    """`<digits>BD`, Spark's decimal literal: the precision and scale of the digits, as lit gives."""
    if not value.is_finite():
        raise ReportError(f"parameter {name}: {value} is not a finite decimal")
    digits, exponent = len(value.as_tuple().digits), value.as_tuple().exponent
    if max(digits + max(exponent, 0), -exponent) > MAX_DECIMAL_DIGITS:
        raise ReportError(f"parameter {name}: {value} has more than {MAX_DECIMAL_DIGITS} digits, "
                          "more than a Spark decimal holds")
    # 1E+3: Spark keeps no negative scale, it writes 1000
    return _number(f"{value:f}BD")


def _call(function: str, argument: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=function, expressions=[argument])


def _cast(node: exp.Expression, to: str) -> exp.Expression:
    return exp.Cast(this=node, to=exp.DataType.build(to, dialect=DIALECT))


def _number(text: str) -> exp.Expression:
    _check(text)
    return exp.Literal.number(text)  # written as it is: Spark reads a leading minus as part of the literal


def _string(text: str) -> exp.Literal:
    _check(text)
    return exp.Literal.string(text)


def _check(text: str) -> None:
    if not _SAFE_TEXT.fullmatch(text):  # the builders above never make such text; refuse rather than quote it
        raise ReportError(f"a parameter's value cannot be written as a literal: {text[:40]!r}")

"""Report parameters bound into the checked query as typed literals, before Spark sees it.

Spark Connect (pyspark 4.2) does not bind `spark.sql(..., args=...)` on the server: every `:name`
stays unbound (UNBOUND_SQL_PARAMETER), named or positional. So the serve job binds parameters
itself, the same way on every engine: each `:name` marker of the checked tree becomes a literal
of the type the parameter was declared with (`-- param: n bigint` binds a BIGINT whatever its
value), built from characters that cannot end a literal: strings travel as hex
(`CAST(X'78' AS STRING)`), numbers as their digits, dates as days and timestamps as microseconds
since the epoch. (sql_guard has every select-list item that uses a parameter named with AS.)
"""

from __future__ import annotations

import math
import re
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

from sqlglot import exp

from coldharbor.runtime.errors import ReportError
from coldharbor.serve.report_spec import ParamValues
from coldharbor.serve.sql_check import DIALECT

# What a literal's text may hold: digits, letters of hex, exponents, inf, nan and BD, . + -
_SAFE_TEXT = re.compile(r"[0-9a-zBD.+\-]*")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
_INT32 = 2**31
MAX_DECIMAL_DIGITS = 38  # Spark's DecimalType.MAX_PRECISION


def bind(sql: str, params: ParamValues) -> str:
    """`sql` (a checked query, in Spark's dialect) with every `:name` replaced by its value, a
    literal of the type the parameter was declared with."""
    import sqlglot

    if ":" not in sql:
        return sql
    tree = sqlglot.parse_one(sql, read=DIALECT)
    for marker in list(tree.find_all(exp.Placeholder)):
        name = marker.this
        if name not in params or name not in params.types:
            raise ReportError(f"the report uses parameter :{name}, which has no value")
        marker.replace(literal(params[name], params.types[name], name))
    return tree.sql(dialect=DIALECT, identify=True, comments=False)


def literal(value: object, type_: str, name: str) -> exp.Expression:
    """A Spark expression for `value` of the declared `type_` (report_spec.PARAM_TYPES), not
    nullable (no cast from text, which Spark counts as nullable, except for inf and nan)."""
    if type_ == "boolean" and isinstance(value, bool):
        return exp.Boolean(this=value)
    if type_ in ("int", "bigint") and isinstance(value, int) and not isinstance(value, bool):
        return _cast(_number(str(value)), type_.upper())
    if type_ == "double" and isinstance(value, float):
        if math.isfinite(value):  # Spark's double literal: 1.5D, -0.0D (its sign kept)
            return _number(f"{value!r}D")
        return _cast(_string(repr(value)), "DOUBLE")  # inf, -inf, nan: no literal spells them
    if type_.startswith("decimal") and isinstance(value, Decimal):
        return _decimal(value, type_, name)
    if type_ == "timestamp" and isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return _call("timestamp_micros", _number(str((moment - _EPOCH) // _MICROSECOND)))
    if type_ == "date" and isinstance(value, date) and not isinstance(value, datetime):
        return _call("date_from_unix_date", _number(str((value - _EPOCH.date()).days)))
    if type_ == "string" and isinstance(value, str):
        try:
            encoded = value.encode("utf-8")
        except UnicodeEncodeError:
            raise ReportError(f"parameter {name}: the value is not valid text (it holds a lone surrogate)") from None
        _check(encoded.hex())
        return _cast(exp.HexString(this=encoded.hex()), "STRING")  # X'..': binary, cast to UTF-8 text
    raise ReportError(f"parameter {name}: a value of type {type(value).__name__} cannot be bound as {type_}")


def _decimal(value: Decimal, type_: str, name: str) -> exp.Expression:
    """`<digits>BD`, Spark's decimal literal, cast to the declared decimal(p,s); a bare `decimal`
    keeps the precision and scale of its digits."""
    if not value.is_finite():
        raise ReportError(f"parameter {name}: {value} is not a finite decimal")
    digits, exponent = len(value.as_tuple().digits), value.as_tuple().exponent
    if max(digits + max(exponent, 0), -exponent) > MAX_DECIMAL_DIGITS:
        raise ReportError(f"parameter {name}: {value} has more than {MAX_DECIMAL_DIGITS} digits, "
                          "more than a Spark decimal holds")
    # 1E+3: Spark keeps no negative scale, it writes 1000
    number = _number(f"{value:f}BD")
    return number if type_ == "decimal" else _cast(number, type_.upper())


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

"""Where verify's two sides differ: the chunks whose row count or digest differ (with the key
range each covers), then up to SAMPLE_KEYS keys of those chunks, each with what is wrong with it
(missing from the lake view, missing from PostgreSQL, different values, twice in one lake batch),
the key written as SQL would write it (`shown`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame

from coldharbor.capture import table_names
from coldharbor.capture.registry import LakeColumn
from coldharbor.lake.lake_rows import column
from coldharbor.maintenance.verify_digests import HASH
from coldharbor.runtime.errors import one_line
from coldharbor.runtime.spark_python import collectable, collected

if TYPE_CHECKING:
    from coldharbor.maintenance.verify import Chunk


SAMPLE_KEYS = 10


def differing_chunks(view: dict[int, Chunk], postgres: dict[int, Chunk]) -> list[dict]:
    differing = []
    for i in sorted(set(view) | set(postgres)):
        mine, theirs = view.get(i), postgres.get(i)
        if mine is None or theirs is None or (mine.rows, mine.hash) != (theirs.rows, theirs.hash):
            firsts = [c.first_key for c in (mine, theirs) if c is not None and c.first_key is not None]
            lasts = [c.last_key for c in (mine, theirs) if c is not None and c.last_key is not None]
            differing.append({"chunk": i, "view_rows": mine.rows if mine else 0, "pg_rows": theirs.rows if theirs else 0,
                              "first_key": min(firsts) if firsts else None, "last_key": max(lasts) if lasts else None})
    return differing


def sample_differences(view: DataFrame, postgres: DataFrame, twice: DataFrame,
                       key_columns: Sequence[LakeColumn]) -> list[dict]:
    """Up to SAMPLE_KEYS keys of the differing chunks, each with what is wrong with it. `view` and
    `postgres` hold the rows (keys, HASH) of those chunks, `twice` keys a lake batch holds twice."""
    keys = [k.name for k in key_columns]
    diff = collected_keys(view.select(*map(column, keys), column(HASH).alias("_ch_view"))
                          .join(postgres.select(*map(column, keys), column(HASH).alias("_ch_pg")), on=keys,
                                how="full_outer")
                          .filter(~column("_ch_view").eqNullSafe(column("_ch_pg"))), key_columns, "_ch_view", "_ch_pg")
    samples = [(row, "is more than once in one lake batch (a hand edit?)") for row in collected_keys(twice, key_columns)]
    for row in diff:
        if row["_ch_view"] is None:
            problem = "is in PostgreSQL but missing from the lake view"
        elif row["_ch_pg"] is None:
            problem = "is in the lake view but not in PostgreSQL"
        else:
            problem = "has different values in the lake view and in PostgreSQL"
        samples.append((row, problem))
    return [{"key": "(" + ", ".join(f"{table_names.quote_ident(k)}={shown(row[k])}" for k in keys) + ")",
             "problem": problem} for row, problem in samples[:SAMPLE_KEYS]]


def collected_keys(rows: DataFrame, key_columns: Sequence[LakeColumn], *others: str) -> list[dict]:
    """Up to SAMPLE_KEYS of `rows` as dicts of their keys (`collectable`, then `collected`) and `others`."""
    found = rows.select(*[collectable(column(k.name), k.lake_type).alias(k.name) for k in key_columns],
                        *map(column, others)).limit(SAMPLE_KEYS).collect()
    return [{**{k.name: collected(row[k.name], k.lake_type) for k in key_columns}, **{o: row[o] for o in others}}
            for row in found]


def shown(value: object) -> str:
    """A key value as a data engineer reads it, as SQL would write it: texts quoted ('o''k'), numbers,
    dates and timestamps plain (ISO), bytes as \\x hex, NULL; control characters escaped (one line)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "'\\x" + bytes(value).hex() + "'"
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, (datetime, date)):
        return value.isoformat(sep=" ") if isinstance(value, datetime) else value.isoformat()
    if isinstance(value, str):
        return one_line("'" + value.replace("'", "''") + "'")
    return str(value)

"""Where report results go, each written so that readers only ever see a complete table.

PostgreSQL: the result is written to a staging table in the `reports` schema, then moved into the
report table in one transaction (report_tables.swap_in): the table keeps its identity, so its
grants, owner and the views over it stay, and a reader sees the previous complete contents or the
new complete contents, never a mix or an empty table.
Delta: the result overwrites the report table in one commit.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping

import psycopg
from psycopg import sql
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from coldharbor.lake import delta
from coldharbor.runtime import faults
from coldharbor.runtime.errors import LakeUnavailableError, ReportError, jvm_message, one_line
from coldharbor.runtime.pg import JdbcTarget
from coldharbor.runtime.spark_errors import data_error
from coldharbor.serve import report_tables
from coldharbor.serve.report_spec import REPORTS_SCHEMA

log = logging.getLogger(__name__)
STAGE_PREFIX = "_ch_stage_"
JDBC_WRITE_BATCH = 10_000


def stage_name(target: str) -> str:
    return f"{STAGE_PREFIX}{target}_{uuid.uuid4().hex[:8]}"


# What a PostgreSQL report table holds: the Spark types the JDBC writer maps to a PostgreSQL type,
# and arrays of them.
POSTGRES_SCALARS = (T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType,
                    T.DecimalType, T.StringType, T.BinaryType, T.DateType, T.TimestampType, T.TimestampNTZType)


def require_postgres_columns(schema: T.StructType) -> None:
    """ReportError naming the first column a PostgreSQL report table cannot hold (a struct, a map,
    an interval, a NULL of no type), before anything is written."""
    for field in schema.fields:
        kind = field.dataType.elementType if isinstance(field.dataType, T.ArrayType) else field.dataType
        if not isinstance(kind, POSTGRES_SCALARS):
            raise ReportError(
                f"column {one_line(repr(field.name))} of the report is {field.dataType.simpleString()}, which a "
                "PostgreSQL report table cannot hold (it holds booleans, numbers, text, bytes, dates, timestamps and "
                "arrays of them): cast it in the report's SELECT, e.g. to_json(...), or write the report to the "
                "lake (sink delta)")


_NUL_REFUSED = 'invalid byte sequence for encoding "UTF8": 0x00'


def write_postgres(result: DataFrame, conn: psycopg.Connection, jdbc: JdbcTarget, target: str) -> int:
    """Writes `result` to reports.<target>, atomically for readers; returns the row count."""
    require_postgres_columns(result.schema)
    stage = stage_name(target)
    try:
        (faults.inside_tasks(result, "report_during_write").write.format("jdbc").options(**jdbc.options())
         .option("dbtable", f'{REPORTS_SCHEMA}."{stage}"')
         .option("batchsize", JDBC_WRITE_BATCH)
         .mode("error").save())  # error if it exists; the Connect client knows only this spelling
        faults.from_environment("report_after_stage")
        rows = report_tables.swap_in(conn, stage, target)
    except BaseException as exc:
        _drop_quietly(conn, stage)
        if _NUL_REFUSED in str(exc):  # SQLSTATE 22021, as PostgreSQL's JDBC driver tells it
            raise ReportError("a text value of the report holds a NUL character, which a PostgreSQL report table "
                              "cannot hold: remove it in the SELECT (replace(x, char(0), '')) or write the report "
                              "to the lake (sink delta); nothing was written") from exc
        raise
    log.info("wrote %s rows to %s.%s", rows, REPORTS_SCHEMA, target)
    return rows


def _drop_quietly(conn: psycopg.Connection, stage: str) -> None:
    try:
        if not conn.closed:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(REPORTS_SCHEMA, stage)))
    except psycopg.Error as exc:
        log.warning("could not drop the staging table %s.%s: %s", REPORTS_SCHEMA, stage, exc)


def delta_path(lake_root: str, target: str) -> str:
    return f"{lake_root}/{REPORTS_SCHEMA}/{target}"


def write_delta(result: DataFrame, path: str, metadata: Mapping[str, object]) -> int:
    """Overwrites the Delta report table in one commit; returns the rows it wrote."""
    try:
        (result.write.format("delta").mode("overwrite")
         .option("overwriteSchema", "true")
         .option("userMetadata", json.dumps(dict(metadata), sort_keys=True, default=str))
         .save(path))
        metrics = delta.history_of(result.sparkSession, path, 1).first()["operationMetrics"]
    except Exception as exc:
        if delta.files_gone(exc) or data_error(exc) is not None:  # the report's own data: not the lake's fault
            raise
        raise LakeUnavailableError(f"the Delta report table at {path} could not be written: "
                                   f"{jvm_message(exc)}") from exc
    rows = int(metrics.get("numOutputRows", 0))
    log.info("wrote %s rows to the Delta report table %s", rows, path)
    return rows

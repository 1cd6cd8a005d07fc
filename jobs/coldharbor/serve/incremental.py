"""Incremental refresh of a report (`-- refresh: incremental`, issue 23 part 2).

A report of the shape `coldharbor.serve.incremental_shape` takes is a sum over rows: each group's row
count, and per aggregate its count of values, their sum, their extreme. So the report after some
changes is the report before them plus each change's own contribution, the row it removed counted
negative and the row it left positive. Those rows come from PostgreSQL's change log, not the lake:
a table with exact history logs the row each insert and update leaves (sql/021) and, once a report
refreshes incrementally over it, the row each update and delete removes (sql/028). A key's changes
since the last refresh contribute minus its first change's old row and plus its last change's new
row; that holds only when they chain (each one's row before is the row the one before it left,
`hot_reader._chained`, as the export checks), and a trail through the same changes that chains
starts and ends where the true order does (or, for a key that came back to where it was, adds
nothing either way).

State, per report target, in the lake (`<root>/_coldharbor/incremental/<target>`, a Delta table of
one row per group with its partial aggregates): the report over the lake's rows up to a lake
version V (the *cold* part), and V, the batch that wrote it, a fingerprint of the report and when
the state was built (the commit's user metadata). A refresh, one run per target at a time:

  1. pin the lake version P and read its newest committed batch id, then take one PostgreSQL
     snapshot, as a report does; every batch committed in lake@P must be marked there (else an
     export is between its commit and its mark: a full refresh this time);
  2. the window (V, P] must hold every change (no batch pruned), no base (initial load, resync, a
     rebase after DDL) and no purge; else, or with no state, or another fingerprint, the cold part
     is rebuilt from lake@P (a purge's commit included);
  3. the changes after V give signed rows: the ones in lake@P move the cold part to P, the later
     ones (dirty, or flushed after P) are applied on top for the report now;
  4. the report (one atomic write, as a full refresh's), then the new state, are written.

A MIN or MAX whose extreme a change removed cannot be updated from the changes: the cold part is
then rebuilt from the lake; if it is the changes not in lake@P that removed it, this run is a full
refresh. Exported changes that cannot be applied (a key whose changes do not chain, a row missing)
rebuild the cold part; dirty ones make the run a full refresh, saying why, as do an AVG of
integers past 2^53 (Spark adds them in doubles) and SUM/AVG of floating-point values.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, localcontext

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from coldharbor.capture import registry
from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export import base_load, hot_reader
from coldharbor.lake import commits, delta, lake_store, lake_values
from coldharbor.lake.lake_rows import column
from coldharbor.lake.unified import cold_live
from coldharbor.runtime import pg
from coldharbor.runtime.errors import jvm_message
from coldharbor.runtime.spark import local_checkpoint
from coldharbor.serve import sql_guard, sql_params
from coldharbor.serve.hot_snapshot import arrow_type
from coldharbor.serve.incremental_shape import IncrementalShape, NotIncremental, incremental_shape
from coldharbor.serve.report_spec import ParamValues
from coldharbor.serve.sql_check import DIALECT

log = logging.getLogger(__name__)

STATE_FOLDER = "incremental"
STATE_FORMAT = 1
SIGN, COLD, HOT, VALID = "_ch_sign", "_ch_cold", "_ch_hot", "_ch_valid"
ROWS = "_ch_rows"


@dataclass(frozen=True)
class Frontier:
    version: int            # the lake version of the newest batch the cold part holds
    batch_id: int
    fingerprint: str
    built_at: str           # PostgreSQL's now() when the state was written (ISO 8601)


@dataclass(frozen=True)
class Outcome:
    rows: int               # report rows written
    detail: str             # how it was refreshed, for the run's record
    version: int            # the lake version the cold part now holds
    hot_rows: int           # signed rows of changes not in it (still dirty)


@contextlib.contextmanager
def _stage(what: str):
    """Logs how long a stage of the refresh took (where an incremental refresh spends its time)."""
    start = time.perf_counter()
    yield
    log.info("incremental refresh: %s took %.2f s", what, time.perf_counter() - start)


def state_path(lake_root: str, target: str) -> str:
    return f"{lake_root}/{registry.OWN_FOLDER}/{STATE_FOLDER}/{target}"


def fingerprint(report_sql: str, params: ParamValues, table: RegisteredTable,
                columns: Sequence[LakeColumn]) -> str:
    """What the state answers: the report's SQL and parameter values over the table's columns."""
    text = json.dumps({"format": STATE_FORMAT, "sql": report_sql,
                       "params": {k: f"{params.types.get(k)} {v!r}" for k, v in sorted(params.items())},
                       "table": table.table_id, "columns": [(c.name, c.lake_type, c.key_position) for c in columns]},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def eligible_table(conn: psycopg.Connection, table: RegisteredTable, columns: Sequence[LakeColumn]) -> None:
    """NotIncremental unless the table's changes carry the rows they remove and leave, and
    PostgreSQL holds every row of it (a key the lake alone holds could be inserted again)."""
    if table.source_kind != "table":
        raise NotIncremental(f"{table.qualified_name} is an entity schema")
    if table.history != "exact":
        raise NotIncremental(f"{table.qualified_name} does not keep exact history, whose logged rows incremental "
                             f"refresh applies: register it with p_history => 'exact'")
    if table.mode != "mirror" or base_load.keeps_lake_only_rows(conn, table):
        raise NotIncremental(f"{table.qualified_name} has rows in the lake alone (lake-first, tiered or evicted), "
                             "which an insert of their key can replace without a logged row to subtract")
    json_columns = [c.name for c in columns if c.pg_type == "json"]
    if json_columns:
        raise NotIncremental(f"{table.qualified_name} has a json column ({json_columns[0]}), whose logged rows "
                             "cannot be read back exactly")


def keep_old_images(conn: psycopg.Connection, table: RegisteredTable) -> bool:
    """Turns on old images for the table (sql/028); whether they were on before this call."""
    with conn.transaction():
        return conn.execute("SELECT coldharbor.keep_old_images(%s)", (table.table_id,)).fetchone()[0]


# ----------------------------------------------------------------------------------------- state

def read_state(spark: SparkSession, path: str) -> tuple[DataFrame, Frontier] | None:
    """The state and its frontier, read once; None when there is none, or none that can be read
    (a file of it gone: it is rebuilt, as if there were none)."""
    if not lake_store.is_delta_table(path):
        return None
    try:
        entry = delta.history_of(spark, path, 1).first()
        meta = json.loads(entry["userMetadata"] or "{}")
        if meta.get("format") != STATE_FORMAT or meta.get("version") is None:
            return None
        state = local_checkpoint(spark.read.format("delta").load(path), eager=True)
        return state, Frontier(int(meta["version"]), int(meta["batch_id"]), meta["fingerprint"], meta["built_at"])
    except Exception as exc:  # noqa: BLE001 - a state that cannot be read is rebuilt
        log.warning("the incremental state at %s cannot be read (%s); it is rebuilt", path,
                    jvm_message(exc) if hasattr(exc, "java_exception") else str(exc).splitlines()[0])
        return None


def write_state(state: DataFrame, path: str, frontier: Frontier | None) -> None:
    """The new state in one commit; None: the state is invalid (the next run rebuilds it)."""
    meta = {"format": STATE_FORMAT, "invalid": True} if frontier is None else {
        "format": STATE_FORMAT, "version": frontier.version, "batch_id": frontier.batch_id,
        "fingerprint": frontier.fingerprint, "built_at": frontier.built_at}
    (state.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .option("userMetadata", json.dumps(meta, sort_keys=True)).save(path))


# -------------------------------------------------------------------------- the PostgreSQL side

@dataclass(frozen=True)
class Window:
    version: int                 # P: the lake version pinned before the snapshot (the cold part's)
    batch_id: int                # the newest batch it holds
    changes: pa.Table            # signed rows (the columns, SIGN, COLD, HOT, VALID)
    cold_valid: str | None       # why the window (V, V1] cannot be applied to the state, or None
    now: str                     # PostgreSQL's now() (ISO 8601)


def changes_query(table: RegisteredTable, columns: Sequence[LakeColumn], since: int, pinned: int) -> sql.Composed:
    """Signed rows of every change after lake version `since` (flushed since, or dirty). A key's
    flushed changes come before its dirty ones (a key's writers queue on its row lock), so its
    trail is a COLD part, from its row at `since` to its row at V1 (the newest flushed batch), then
    a HOT part, from there to its row now. COLD rows: minus the first change's old row, plus the
    last flushed change's row; HOT rows: minus the row at V1 (that same row, or the first change's
    old row when none was flushed), plus the last change's row. VALID false (one row, no values)
    for a key whose changes do not chain or miss a row they need."""
    def values(image: str):
        return hot_reader.checked_select(columns, lambda c: hot_reader.logged_image_value(c, image),
                                         through_jdbc=False)

    return sql.SQL("""
        WITH logged AS (
            SELECT c.key AS k, c.id, c.op, c.flushed_at IS NOT NULL AND c.lake_version <= {pinned} AS cold,
                   CASE WHEN c.op <> 'D' AND {usable_new} THEN c.image END AS image,
                   CASE WHEN c.op <> 'I' AND {usable_old} THEN c.old_image END AS old_image,
                   CASE WHEN c.op <> 'D' AND {readable} THEN {image_hash} END AS new_hash, c.old_hash
              FROM coldharbor.change_log c
             WHERE c.table_id = {table_id} AND (c.flushed_at IS NULL OR c.lake_version > {since})),
        changes AS (
            SELECT *, {chained} AS chained,
                   row_number() OVER (PARTITION BY k ORDER BY id) AS nth,
                   row_number() OVER (PARTITION BY k ORDER BY id DESC) AS nth_back,
                   row_number() OVER (PARTITION BY k, cold ORDER BY id DESC) AS nth_back_here
              FROM logged),
        keys AS (
            SELECT *, bool_and(chained AND (op = 'D' OR image IS NOT NULL)) OVER (PARTITION BY k)
                      AND bool_and(nth > 1 OR op = 'I' OR old_image IS NOT NULL) OVER (PARTITION BY k) AS fine,
                      bool_or(NOT cold) OVER (PARTITION BY k) AS has_hot
              FROM changes)
        SELECT {old_values}, -1 AS {sign}, cold AS {cold}, NOT cold AS {hot}, true AS {valid}
          FROM keys d WHERE fine AND nth = 1 AND op <> 'I'
        UNION ALL
        SELECT {new_values}, 1, true, false, true
          FROM keys d WHERE fine AND cold AND nth_back_here = 1 AND op <> 'D'
        UNION ALL
        SELECT {new_values}, -1, false, true, true
          FROM keys d WHERE fine AND cold AND nth_back_here = 1 AND op <> 'D' AND has_hot
        UNION ALL
        SELECT {new_values}, 1, false, true, true
          FROM keys d WHERE fine AND NOT cold AND nth_back = 1 AND op <> 'D'
        UNION ALL
        SELECT {no_values}, 0, false, false, false
          FROM keys d WHERE NOT fine AND nth = 1""").format(
        usable_new=hot_reader.image_usable(table, columns, "c.image"),
        usable_old=hot_reader.image_usable(table, columns, "c.old_image"),
        readable=hot_reader.image_readable(table, columns), image_hash=hot_reader.image_hash(columns),
        table_id=sql.Literal(table.table_id), since=sql.Literal(since), pinned=sql.Literal(pinned), chained=hot_reader.chained(sql.SQL("k")),
        old_values=values("d.old_image"), new_values=values("d.image"),
        no_values=sql.SQL(", ").join([sql.SQL("NULL") for _ in columns] + [sql.SQL("NULL")]),
        sign=sql.Identifier(SIGN), cold=sql.Identifier(COLD), hot=sql.Identifier(HOT),
        valid=sql.Identifier(VALID))


def _fetch(conn: psycopg.Connection, query: sql.Composed, columns: Sequence[LakeColumn]) -> pa.Table:
    schema = pa.schema([pa.field(c.name, arrow_type(c.lake_type)) for c in columns]
                       + [pa.field(lake_values.PROBLEM, pa.string()), pa.field(SIGN, pa.int32()),
                          pa.field(COLD, pa.bool_()), pa.field(HOT, pa.bool_()), pa.field(VALID, pa.bool_())])
    batches = []
    with conn.cursor(name="coldharbor_incremental") as cur:
        cur.itersize = 10_000
        cur.execute(query)
        while rows := cur.fetchmany(10_000):
            batches.append(pa.record_batch([pa.array(col, type=f.type) for col, f in zip(zip(*rows), schema)],
                                           schema=schema))
    return pa.Table.from_batches(batches, schema=schema)


def read_window(conn: psycopg.Connection, table: RegisteredTable, columns: Sequence[LakeColumn],
                frontier: Frontier | None, pinned: int | None, committed: int | None,
                why_none: str = "no state yet") -> Window | str:
    """The changes to apply, read in one snapshot taken after the lake version `pinned` (P) and
    its newest committed batch id `committed` were read, as a report pins its versions; or why
    none can be (the run is a full refresh). The cold part is lake@P: every batch committed there
    must be marked flushed in the snapshot (else an export is between its commit and its mark)."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        registry.guard_read(conn, table)
        load = base_load.load_state(conn, table.table_id)
        if load.pending:
            return f"{table.qualified_name} is waiting for its initial load or a new base"
        if pinned is None:
            return f"{table.qualified_name} has nothing in the lake yet"
        flushed, batch_id = conn.execute(
            """SELECT max(batch_id), max(batch_id) FILTER (WHERE lake_version <= %s)
                 FROM coldharbor.export_batches WHERE table_id = %s AND state = 'flushed'""",
            (pinned, table.table_id)).fetchone()
        if batch_id is None:
            return f"{table.qualified_name} has nothing in the lake yet"
        if committed is not None and committed > flushed:
            return "an export of the table is between its lake commit and its mark"
        now = conn.execute("SELECT now()").fetchone()[0].isoformat()
        cold_valid = why_none if frontier is None else _window_problem(conn, table, frontier, batch_id, pinned)
        since = frontier.version if frontier is not None and cold_valid is None else pinned
        changes = _fetch(conn, changes_query(table, columns, since, pinned), columns)
    return Window(pinned, batch_id, changes, cold_valid, now)


def _window_problem(conn: psycopg.Connection, table: RegisteredTable, frontier: Frontier, batch_id: int,
                    version: int) -> str | None:
    """Why the changes of lake versions (frontier, version] cannot move the state there, or None."""
    if version < frontier.version or batch_id < frontier.batch_id:
        return "the lake or its newest batch is older than the state's (restored from a backup?)"
    tid = table.table_id
    kinds = conn.execute("""SELECT count(*), count(*) FILTER (WHERE kind <> 'changes' AND state = 'flushed'),
                                   coalesce(sum(change_count) FILTER (WHERE kind = 'changes' AND state = 'flushed'), 0)
                              FROM coldharbor.export_batches
                             WHERE table_id = %s AND batch_id > %s AND batch_id <= %s""",
                         (tid, frontier.batch_id, batch_id)).fetchone()
    if kinds[0] != batch_id - frontier.batch_id:
        return "batches of its window were pruned from the change log"
    if kinds[1]:
        return "a new base (initial load, resync or rebase after DDL) was written since"
    logged = conn.execute("SELECT count(*) FROM coldharbor.change_log WHERE table_id = %s AND lake_version > %s "
                          "AND lake_version <= %s", (tid, frontier.version, version)).fetchone()[0]
    if logged != kinds[2]:
        return "changes of its window were pruned from the change log"
    purged = conn.execute("""SELECT count(*) FROM coldharbor.maintenance_runs WHERE table_id = %s AND kind = 'purge'
                               AND (finished_at IS NULL OR finished_at >= %s::timestamptz)""",
                          (tid, frontier.built_at)).fetchone()[0]
    if purged:
        return "keys were purged since"
    return None


# ------------------------------------------------------------------------------- the Spark side

def _template(text: str, **parts: exp.Expression) -> exp.Expression:
    """`text` (Spark SQL) with each column named __<part>__ replaced by a copy of that expression."""
    tree = sqlglot.parse_one(text, read=DIALECT)

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name.startswith("__") and node.name.endswith("__"):
            return parts[node.name.strip("_")].copy()
        return node

    return tree.transform(swap)


def state_query(parsed: sql_guard.ParsedQuery, shape: IncrementalShape,
                table: RegisteredTable) -> sql_guard.CheckedQuery:
    """The report's FROM, WHERE and GROUP BY with the state's columns as its select list, over
    signed rows (SIGN): per group its rows, and per aggregate its values' count (_n), sum (_s)
    and the extremes the rows add (_a) and remove (_d)."""
    tree = parsed.tree.copy()
    items = [exp.alias_(g.copy(), f"_g{i}") for i, g in enumerate(shape.groups)]
    items.append(exp.alias_(_template(f"sum({SIGN})"), ROWS))
    for i, agg in enumerate(shape.aggregates):
        if agg.argument is None:
            continue
        x = agg.argument
        items.append(exp.alias_(_template(f"sum(CASE WHEN __x__ IS NOT NULL THEN {SIGN} ELSE 0 END)", x=x), f"_n{i}"))
        if agg.kind in ("sum", "avg"):
            items.append(exp.alias_(_template(f"sum(CASE WHEN {SIGN} > 0 THEN __x__ ELSE -(__x__) END)", x=x), f"_s{i}"))
        if agg.kind == "avg":   # the largest running total Spark's double sum can reach (`_b`: 2^53 and up)
            whole = "abs(CAST(__x__ AS DECIMAL(38, 0)))"
            items.append(exp.alias_(_template(f"sum(CASE WHEN {SIGN} > 0 THEN {whole} ELSE -{whole} END)", x=x),
                                    f"_b{i}"))
        elif agg.kind in ("min", "max"):
            items.append(exp.alias_(_template(f"{agg.kind}(CASE WHEN {SIGN} > 0 THEN __x__ END)", x=x), f"_a{i}"))
            items.append(exp.alias_(_template(f"{agg.kind}(CASE WHEN {SIGN} < 0 THEN __x__ END)", x=x), f"_d{i}"))
    tree.set("expressions", items)
    tree.set("group", exp.Group(expressions=[g.copy() for g in shape.groups]))
    return sql_guard.resolve(sql_guard.ParsedQuery(tree, parsed.parameters, ()), [table])


def aggregate(spark: SparkSession, rows: DataFrame, table: RegisteredTable, query: sql_guard.CheckedQuery,
              params: ParamValues) -> DataFrame:
    """The state columns over signed `rows` (the table's columns plus SIGN), as `query` computes them."""
    rows.createOrReplaceTempView(sql_guard.view_name(table))
    return spark.sql(sql_params.bind(query.sql, params))


def base_state(shape: IncrementalShape, partial: DataFrame) -> DataFrame:
    """A state from an aggregate of rows all counted positive: the extremes are the ones added."""
    return partial.select(*_group_columns(shape), column(ROWS), *[
        c for i, agg in enumerate(shape.aggregates) if agg.argument is not None for c in (
            [column(f"_n{i}")] + ([column(f"_s{i}")] if agg.kind in ("sum", "avg") else [])
            + ([column(f"_b{i}")] if agg.kind == "avg" else [])
            + ([column(f"_a{i}").alias(f"_m{i}")] if agg.kind in ("min", "max") else []))])


def _group_columns(shape: IncrementalShape) -> list:
    return [column(f"_g{i}") for i in range(len(shape.groups))]


def merge(shape: IncrementalShape, state: DataFrame, delta: DataFrame) -> tuple[DataFrame, bool]:
    """state + delta per group (groups equal as GROUP BY makes them, NULL with NULL): (the new
    state, whether an extreme a change removed left a MIN or MAX the changes cannot give). One
    GROUP BY over both: a SUM of a decimal(38, s) stays one, where adding two columns would lose
    scale. Groups left with no row go."""
    groups = _group_columns(shape)
    sums, extremes = [ROWS], []
    for i, agg in enumerate(shape.aggregates):
        if agg.argument is None:
            continue
        sums.append(f"_n{i}")
        if agg.kind in ("sum", "avg"):
            sums.append(f"_s{i}")
        if agg.kind == "avg":
            sums.append(f"_b{i}")
        if agg.kind in ("min", "max"):
            extremes.append((i, F.min if agg.kind == "min" else F.max))
    both = state.unionByName(
        delta.select(*groups, *map(column, sums), *[column(f"_{p}{i}") for i, _ in extremes for p in ("a", "d")]),
        allowMissingColumns=True)
    totals = [F.sum(column(c)).alias(c) for c in sums]
    for i, pick in extremes:
        totals += [pick(column(f"_m{i}")).alias(f"_m{i}"), pick(column(f"_a{i}")).alias(f"_a{i}"),
                   pick(column(f"_d{i}")).alias(f"_d{i}")]
    summed = both.groupBy(*groups).agg(*totals)
    stale = F.lit(False)
    out = [*groups, *map(column, sums)]
    for i, agg in enumerate(shape.aggregates):
        if agg.kind not in ("min", "max"):
            continue
        m, added, removed = column(f"_m{i}"), column(f"_a{i}"), column(f"_d{i}")
        pick, beyond = (F.least, removed <= m) if agg.kind == "min" else (F.greatest, removed >= m)
        out.append(pick(m, added).alias(f"_m{i}"))
        stale = stale | (m.isNotNull() & removed.isNotNull() & beyond)
    merged = local_checkpoint(summed.select(*out, stale.alias("_ch_stale")), eager=True)
    counts = merged.agg(F.sum(column("_ch_stale").cast("int")).alias("stale"),
                        F.sum((column(ROWS) < 0).cast("int")).alias("negative")).first()
    broken = bool(counts["stale"]) or bool(counts["negative"])
    return merged.filter(column(ROWS) > 0).drop("_ch_stale"), broken


# A report with an AVG of a decimal is finished on the driver (Python's decimals divide exactly),
# up to this many groups; above it the run is a full refresh.
DRIVER_GROUPS = 200_000
EXACT_DOUBLE_SUM = 2**53   # Spark adds an AVG of integers in doubles: exact while running totals stay below


def project(spark: SparkSession, shape: IncrementalShape, state: DataFrame, schema: T.StructType) -> DataFrame:
    """The report from a state: each output column as the full query names and types it. An AVG
    of a decimal is Spark's quotient rounded half up at the result's scale
    (DecimalDivideWithOverflowCheck), computed exactly on the driver; of anything else the double
    quotient of the sum and the count."""
    outputs = list(zip(shape.outputs, schema.fields))
    if any(o.aggregate is not None and shape.aggregates[o.aggregate].kind == "avg"
           and isinstance(f.dataType, T.DecimalType) for o, f in outputs):
        return _project_on_driver(spark, shape, state, schema)
    columns = []
    for output, field in outputs:
        if output.group is not None:
            value = column(f"_g{output.group}")
        else:
            i = output.aggregate
            agg = shape.aggregates[i]
            if agg.argument is None:
                value = column(ROWS)
            elif agg.kind == "count":
                value = column(f"_n{i}")
            elif agg.kind == "sum":
                value = F.when(column(f"_n{i}") > 0, column(f"_s{i}"))
            elif agg.kind == "avg":
                value = F.when(column(f"_n{i}") > 0, column(f"_s{i}").cast("double") / column(f"_n{i}").cast("double"))
            else:
                value = column(f"_m{i}")
        columns.append(value.cast(field.dataType).alias(field.name))
    return state.select(*columns)


def _project_on_driver(spark: SparkSession, shape: IncrementalShape, state: DataFrame,
                       schema: T.StructType) -> DataFrame:
    groups = state.count()
    if groups > DRIVER_GROUPS:
        raise NotIncremental(f"it has an AVG of a decimal over {groups:,} groups; incremental refresh finishes one "
                             f"on the driver, up to {DRIVER_GROUPS:,} groups")
    rows = []
    for row in state.collect():
        values = []
        for output, field in zip(shape.outputs, schema.fields):
            if output.group is not None:
                values.append(row[f"_g{output.group}"])
                continue
            i = output.aggregate
            agg = shape.aggregates[i]
            if agg.argument is None:
                values.append(row[ROWS])
            elif agg.kind == "count":
                values.append(row[f"_n{i}"])
            elif agg.kind in ("sum", "avg"):
                total, count = row[f"_s{i}"], row[f"_n{i}"]
                if not count:
                    values.append(None)
                elif agg.kind == "sum":
                    values.append(total)
                elif isinstance(field.dataType, T.DecimalType):
                    with localcontext() as context:
                        context.prec = 120
                        values.append((Decimal(total) / Decimal(count)).quantize(
                            Decimal(1).scaleb(-field.dataType.scale), rounding=ROUND_HALF_UP))
                else:
                    values.append(float(total) / float(count))
            else:
                values.append(row[f"_m{i}"])
        rows.append(values)
    return spark.createDataFrame(rows, schema)


def refuse_order_dependent_averages(shape: IncrementalShape, schema: T.StructType, state: DataFrame) -> None:
    """NotIncremental when an AVG of integers (added in doubles by Spark) has a group whose values
    reach 2^53 in absolute total: Spark's double sum then depends on the order of addition."""
    checks = [F.max(column(f"_b{o.aggregate}")).alias(f"b{o.aggregate}") for o, f in zip(shape.outputs, schema.fields)
              if o.aggregate is not None and shape.aggregates[o.aggregate].kind == "avg"
              and not isinstance(f.dataType, T.DecimalType)]
    if not checks:
        return
    highest = state.agg(*checks).first()
    if any(v is not None and v >= EXACT_DOUBLE_SUM for v in highest):
        raise NotIncremental("an AVG of integers has a group whose values total 2^53 or more, where Spark's sum in "
                             "doubles depends on the order of addition")


def refuse_inexact_sums(shape: IncrementalShape, partial_schema: T.StructType) -> None:
    for i, agg in enumerate(shape.aggregates):
        if agg.kind in ("sum", "avg"):
            kind = partial_schema[f"_s{i}"].dataType
            if not isinstance(kind, (T.DecimalType, T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
                raise NotIncremental(f"{agg.kind.upper()} adds {kind.simpleString()} values, whose total depends on "
                                     "the order of addition; cast them to a decimal")


# ------------------------------------------------------------------------------------- the run

def refresh(spark: SparkSession, conn: psycopg.Connection, report_sql: str, params: ParamValues,
            table: RegisteredTable, lake_root: str, target: str, write) -> Outcome:
    """The incremental refresh; `write(result)` writes the report atomically and returns its rows.
    NotIncremental: it cannot be done this time (the caller refreshes in full), saying why. One run
    of a target at a time moves its state (a session lock on the target's name); another run of it
    meanwhile is a full refresh."""
    parsed = sql_guard.parse_query(report_sql)
    shape = incremental_shape(parsed)
    columns = tuple(registry.lake_columns(conn, table))
    eligible_table(conn, table, columns)
    with pg.advisory_lock(conn, "incremental_state", zlib.crc32(target.encode()) & 0x7FFFFFFF) as acquired:
        if not acquired:
            raise NotIncremental("another run of it is refreshing its state")
        return _refresh(spark, conn, parsed, shape, columns, report_sql, params, table, lake_root, target, write)


def _refresh(spark: SparkSession, conn: psycopg.Connection, parsed: sql_guard.ParsedQuery, shape: IncrementalShape,
             columns: Sequence[LakeColumn], report_sql: str, params: ParamValues, table: RegisteredTable,
             lake_root: str, target: str, write) -> Outcome:
    if not keep_old_images(conn, table):
        log.info("%s: its changes log the rows they remove from now on (sql/028)", table.qualified_name)
    path = state_path(lake_root, target)
    prints = fingerprint(report_sql, params, table, columns)
    with _stage("reading the state"):
        stored = read_state(spark, path)
    why_none = "no state yet"
    if stored is not None and stored[1].fingerprint != prints:
        stored, why_none = None, "the report's SQL, its parameters or the table's columns changed"
    lake_path = table.lake_path(lake_root)
    # As a report pins its versions: the lake first, then PostgreSQL's snapshot.
    pinned = delta.pin_version(spark, lake_path)
    committed = commits.committed_txn_version(spark, lake_path, commits.export_app_id(table.table_id))
    with _stage("reading the changes from PostgreSQL"):
        window = read_window(conn, table, columns, stored[1] if stored else None, pinned, committed, why_none)
        if isinstance(window, Window) and window.cold_valid is None and _invalid_keys(window.changes):
            # Keys whose exported changes cannot be applied: the lake holds their rows at P.
            window = read_window(conn, table, columns, None, pinned, committed,
                                 f"{_invalid_keys(window.changes)} key(s) changed since the last refresh have "
                                 "exported changes whose rows cannot be applied")
    if isinstance(window, str):
        raise NotIncremental(window)
    changes = window.changes
    invalid = _invalid_keys(changes)
    if invalid:
        raise NotIncremental(f"{invalid} key(s) changed since the last export have changes whose rows cannot be "
                             "applied (out of order in their transaction, or a row missing or not held by the lake)")
    problems = changes[lake_values.PROBLEM].drop_null()
    if len(problems):
        raise NotIncremental(f"a changed row holds a value the lake does not: {problems[0].as_py()}")
    contract = [c.name for c in columns]
    query = state_query(parsed, shape, table)
    with _stage("planning"):
        signed = _frame(spark, changes.drop_columns([lake_values.PROBLEM, VALID]))
        report_schema = aggregate(spark, signed.select(*map(column, contract)), table,
                                  sql_guard.resolve(parsed, [table]), params).schema
        refuse_inexact_sums(shape, aggregate(spark, signed.drop(COLD, HOT).limit(0), table, query, params).schema)

    def rebuild() -> DataFrame:
        rows = delta.read_version(spark, lake_path, window.version).transform(
            cold_live(columns, split=delta.settled_split(lake_path, window.version)))
        # Pinned now: the view it reads is registered again for the next aggregate, and a Spark
        # Connect DataFrame is analysed again each time it runs.
        return local_checkpoint(base_state(shape, aggregate(spark, rows.withColumn(SIGN, F.lit(1)), table, query,
                                                            params)), eager=True)

    if window.cold_valid is None:
        state, frontier = stored
        with _stage("applying the exported changes"):
            cold, stale = merge(shape, state, aggregate(spark, signed.filter(column(COLD)), table, query, params))
        how = (f"incrementally: {len(changes)} signed rows of changes since lake version {frontier.version} "
               f"(now {window.version})")
        if stale:
            how = f"from the lake at version {window.version} (a change removed a MIN or MAX)"
            with _stage("rebuilding from the lake"):
                cold = rebuild()
    else:
        log.info("report %s: the state is rebuilt from the lake at version %s: %s", target, window.version,
                 window.cold_valid)
        with _stage("rebuilding from the lake"):
            cold = rebuild()
        how = f"from the lake at version {window.version} and the changes since ({window.cold_valid})"
    with _stage("applying the changes not exported yet"):
        now, stale = merge(shape, cold, aggregate(spark, signed.filter(column(HOT)), table, query, params))
    if stale:
        raise NotIncremental("a change not in the lake yet removed a group's MIN or MAX")
    refuse_order_dependent_averages(shape, report_schema, now)
    with _stage("writing the report"):
        written = write(project(spark, shape, now, report_schema))
    with _stage("writing the state"):
        write_state(cold, path, Frontier(window.version, window.batch_id, prints, window.now))
    hot = sum(1 for c in changes[COLD].to_pylist() if not c)
    return Outcome(written, f"refreshed {how}", window.version, hot)


def _invalid_keys(changes: pa.Table) -> int:
    return len(changes) - pc.sum(changes[VALID].cast(pa.int64())).as_py() if len(changes) else 0


def _frame(spark: SparkSession, rows: pa.Table) -> DataFrame:
    if rows.num_rows == 0:
        from pyspark.sql.pandas.types import from_arrow_schema

        return spark.createDataFrame([], from_arrow_schema(rows.schema))
    return local_checkpoint(spark.createDataFrame(rows), eager=False)



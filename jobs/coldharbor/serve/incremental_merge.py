"""An incremental report's arithmetic: the state of a report as partial aggregates per group (counts,
sums, extremes), the signed changes folded into it, and the report's own columns projected from it,
refusing what a sum of signed rows cannot keep exact.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, localcontext

import sqlglot
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from coldharbor.capture.registry import RegisteredTable
from coldharbor.lake.lake_rows import column
from coldharbor.runtime.spark import local_checkpoint
from coldharbor.serve import sql_guard, sql_params
from coldharbor.serve.incremental_changes import SIGN
from coldharbor.serve.incremental_shape import IncrementalShape, NotIncremental
from coldharbor.serve.report_spec import ParamValues
from coldharbor.serve.sql_check import DIALECT

ROWS = "_ch_rows"


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

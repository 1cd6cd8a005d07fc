"""serve_report: run a report over the unified view of every table it reads (invariant 6).

  1. validate the report before a JVM starts (one SELECT on the allow-list over registered
     tables, typed parameters, an allowed target) and record the run;
  2. pin every referenced table's lake version V;
  3. in one PostgreSQL snapshot, collect each table's dirty keys and their hot images;
  4. view = (last write per key of lake@V, markers dropped) minus dirty keys, plus hot images;
  5. run the SELECT with its parameters bound, write the result atomically, record the figures.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import psycopg
from pyspark.sql import DataFrame, SparkSession

from coldharbor.capture import registry
from coldharbor.capture.registry import RegisteredTable
from coldharbor.lake import commits, delta, registry_cache
from coldharbor.lake.lake_rows import DELETED, column
from coldharbor.lake.unified import cold_live, table_contract, unified_rows
from coldharbor.runtime import settings
from coldharbor.runtime.errors import ColdharborError, LakeUnavailableError, ReportError, jvm_message
from coldharbor.runtime.pg import JdbcTarget
from coldharbor.runtime.spark import local_checkpoint
from coldharbor.runtime.spark_errors import data_error
from coldharbor.serve import hot_snapshot, sinks, sql_guard, sql_params
from coldharbor.serve.as_of import check_as_of, lake_as_of
from coldharbor.serve.feed_views import register_feeds
from coldharbor.serve.hot_snapshot import HotSnapshot, HotTable
from coldharbor.serve.report_runs import RunRecord
from coldharbor.serve.report_spec import ParamValues, ReportSpec

log = logging.getLogger(__name__)

MODES = ("strict", "best_effort")


@dataclass(frozen=True)
class ServeConfig:
    report: ReportSpec
    params: ParamValues
    target: str
    sink: str
    mode: str
    as_of: datetime | None
    lake_root: str
    run_id: str
    history_window: timedelta


def check_parameters(parameters: frozenset[str], report: ReportSpec) -> None:
    declared = {p.name for p in report.params}
    undeclared = sorted(parameters - declared)
    if undeclared:
        raise ReportError(f"report {report.name} uses :{', :'.join(undeclared)} but declares no such parameter "
                          "(declare it in the header: -- param: name type [= default])")


def validate_report(report: ReportSpec, registered: Sequence[RegisteredTable] | None
                    ) -> sql_guard.CheckedQuery | sql_guard.ParsedQuery:
    """Step 1, with no JVM: the report's SQL on the allow-list with declared parameters, resolved
    against the registry when it is at hand (PostgreSQL); without it (best effort, PostgreSQL
    unreachable) the allow-listed query, whose tables are resolved once the lake's copy is read."""
    for param in report.params:  # before the SQL, which such a marker would only make fail to parse
        if not sql_guard.usable_marker(param.name):
            raise ReportError(f"parameter {param.name}: :{param.name} cannot stand in SQL as a parameter (it is a "
                              "keyword there): choose another name")
    parsed = sql_guard.parse_query(report.sql)
    check_parameters(parsed.parameters, report)
    return parsed if registered is None else sql_guard.resolve(parsed, registered)


def pin_versions(spark: SparkSession, tables: Sequence[RegisteredTable], lake_root: str) -> dict[int, int | None]:
    """Step 2, before the PostgreSQL snapshot: the lake version each table is read at."""
    return {t.table_id: delta.pin_version(spark, t.lake_path(lake_root)) for t in tables}


def lake_batch_ids(spark: SparkSession, tables: Sequence[RegisteredTable], lake_root: str) -> dict[int, int | None]:
    """After the pins, before the PostgreSQL snapshot: the last batch id the lake committed per
    table, which the snapshot must have used (`hot_snapshot.lake_ahead`)."""
    return {t.table_id: commits.committed_txn_version(spark, t.lake_path(lake_root), commits.export_app_id(t.table_id))
            for t in tables}


def hot_frame(spark: SparkSession, hot: HotTable) -> DataFrame:
    """The collected images as a DataFrame over the driver's copy, so never re-read from PostgreSQL.

    Spark turns Arrow data into a local relation, whose rows sit inside the plan: planning a join
    or union over it then takes time in proportion to the rows (with 100,000 dirty keys the
    read-path bench's grouped report took 23.2 s with it, 20.2 s without, cold-only 18.9 s). A
    local checkpoint hands the same rows to the plan as an RDD instead; lazy, so the query's first
    job materialises them and the rest of it reuses them.

    No dirty key is an empty dataset, from which a Spark Connect session infers no schema: it is
    given the one Spark infers from the images' Arrow schema.
    """
    if hot.images.num_rows == 0:
        from pyspark.sql.pandas.types import from_arrow_schema

        return spark.createDataFrame([], from_arrow_schema(hot.images.schema))
    return local_checkpoint(spark.createDataFrame(hot.images), eager=False)


def table_view(spark: SparkSession, hot: HotTable, version: int | None, lake_root: str,
               as_of: datetime | None) -> DataFrame:
    columns = hot.columns
    if hot.hot_only:
        return hot_frame(spark, hot).transform(table_contract(columns))
    if as_of is not None:
        if version is None:
            return hot_frame(spark, hot).limit(0).transform(table_contract(columns))
        return lake_as_of(delta.read_version(spark, hot.table.lake_path(lake_root), version), columns, as_of,
                          hot.table.qualified_name, hot.table.history == "exact", floor=hot.answerable_from)
    images = hot_frame(spark, hot)
    if version is None:  # nothing exported yet: the table is its hot images
        return images.filter(~column(DELETED)).transform(table_contract(columns))
    # Pending with evicted rows, every row PostgreSQL holds is dirty: too many to broadcast.
    path = hot.table.lake_path(lake_root)
    return delta.read_version(spark, path, version).transform(
        unified_rows(images, columns, broadcast_dirty=not hot.reads_evicted_rows,
                     split=delta.settled_split(path, version)))


def register_views(spark: SparkSession, snapshot: HotSnapshot, pinned: Mapping[int, int | None],
                   lake_root: str, as_of: datetime | None) -> None:
    for table_id, hot in snapshot.tables.items():
        view = table_view(spark, hot, pinned.get(table_id), lake_root, as_of)
        view.createOrReplaceTempView(sql_guard.view_name(hot.table))


def run_query(spark: SparkSession, checked: sql_guard.CheckedQuery, params: ParamValues) -> DataFrame:
    """The report's DataFrame; analysis errors (unknown column, bad types) become ReportError."""
    from pyspark.errors import AnalysisException, ParseException

    try:
        return spark.sql(sql_params.bind(checked.sql, params))
    except (AnalysisException, ParseException) as exc:
        message = str(exc).strip().splitlines()[0]
        for table in checked.tables:
            message = message.replace(sql_guard.view_name(table), table.qualified_name)
        for feed in checked.feeds:
            message = message.replace(feed.view, f"changes({feed.table.qualified_name}, ...)")
        raise ReportError(f"the report does not run: {message[:500]}") from exc


def write_result(result: DataFrame, config: ServeConfig, conn: psycopg.Connection | None,
                 jdbc: JdbcTarget | None, record: RunRecord) -> int:
    try:
        if config.sink == "postgres":
            if conn is None or jdbc is None:
                raise ReportError("a PostgreSQL report table cannot be written while PostgreSQL is unreachable")
            return sinks.write_postgres(result, conn, jdbc, config.target)
        return sinks.write_delta(result, sinks.delta_path(config.lake_root, config.target),
                                 {"run_id": config.run_id, "report": config.report.name,
                                  # the instant this version answers for (null: the time of the run)
                                  "as_of": config.as_of.isoformat() if config.as_of else None,
                                  "lake_versions": record.lake_versions, "degraded": record.degraded})
    except ColdharborError:
        raise
    except Exception as exc:
        if delta.files_gone(exc) and data_error(exc) is None:  # a value quoted in a data error may read "does not exist"
            raise LakeUnavailableError(f"files of a pinned lake version are gone (removed by VACUUM, or the lake "
                                       f"moved): {jvm_message(exc)}; nothing was written") from exc
        raise


def serve(spark: SparkSession, conn: psycopg.Connection, jdbc: JdbcTarget, config: ServeConfig,
          record: RunRecord, checked: sql_guard.CheckedQuery) -> int:
    """The whole read of a validated report with both tiers reachable (or the lake missing in
    best-effort mode)."""
    registry.require_present(checked.read_tables)
    for table in checked.read_tables:
        registry.require_privileges(conn, table)
    if incremental_wanted(config, checked):
        rows = serve_incrementally(spark, conn, jdbc, config, record, checked)
        if rows is not None:
            return rows
    hot_only = False
    try:
        pinned = pin_versions(spark, checked.tables, config.lake_root)
        snapshot = hot_snapshot.read(conn, pinned, checked.tables,
                                     lake_batches=lake_batch_ids(spark, checked.tables, config.lake_root))
    except LakeUnavailableError as exc:
        if config.mode == "strict" or config.as_of is not None:
            raise
        log.warning("best effort: %s; serving from PostgreSQL alone", exc)
        pinned = {t.table_id: None for t in checked.tables}
        snapshot = hot_snapshot.read(conn, pinned, checked.tables, hot_only=True)
        hot_only = True
    record.pg_snapshot_at = snapshot.taken_at
    if not hot_only:
        registry_cache.save(spark, config.lake_root, [(h.table, h.columns) for h in snapshot.tables.values()])
    record.lake_versions = {h.table.qualified_name: pinned[i] for i, h in snapshot.tables.items()}
    record.dirty_rows = {h.table.qualified_name: (0 if h.hot_only else h.images.num_rows)
                         for h in snapshot.tables.values()}
    record.served_from_postgres = sorted(h.table.qualified_name for h in snapshot.tables.values() if h.postgres_alone)
    if record.served_from_postgres:
        log.info("served from PostgreSQL alone until their base lands or their lake is resynced: %s",
                 ", ".join(record.served_from_postgres))
    if hot_only:
        record.degraded, record.missing_tier = True, "lake"
        record.detail = ("the lake was unreachable: served from PostgreSQL alone; rows evicted from the hot tier "
                         "are missing from the answer")
    if config.as_of is not None:
        check_as_of(config.as_of, snapshot, config.history_window)
        record.dirty_rows = {name: 0 for name in record.dirty_rows}
    register_views(spark, snapshot, pinned, config.lake_root, config.as_of)
    register_feeds(spark, conn, jdbc, checked.feeds, config)
    result = run_query(spark, checked, config.params)
    return write_result(result, config, conn, jdbc, record)


def incremental_wanted(config: ServeConfig, checked: sql_guard.CheckedQuery) -> bool:
    """A report file declaring `-- refresh: incremental`, run for now into its own target (an
    as-of run, a backfill's, or one into an adhoc_* table is a full refresh, as ever)."""
    report = config.report
    return (report.refresh == "incremental" and report.source is not None and config.as_of is None
            and config.target == report.target)


def serve_incrementally(spark: SparkSession, conn: psycopg.Connection, jdbc: JdbcTarget, config: ServeConfig,
                        record: RunRecord, checked: sql_guard.CheckedQuery) -> int | None:
    """The report refreshed from what changed (coldharbor.serve.incremental); None when it cannot be this
    time (the reason logged and in the run's record), and the caller refreshes it in full."""
    from coldharbor.serve import incremental
    from coldharbor.serve.incremental_shape import NotIncremental

    try:
        if len(checked.tables) != 1 or checked.feeds:
            raise NotIncremental("it reads more than one table or a change feed")
        [table] = checked.tables
        outcome = incremental.refresh(spark, conn, config.report.sql, config.params, table, config.lake_root,
                                      config.target, lambda result: write_result(result, config, conn, jdbc, record))
    except NotIncremental as exc:
        log.warning("report %s is refreshed in full: %s", config.report.name, exc)
        record.detail = f"refreshed in full: {exc}"
        return None
    except LakeUnavailableError as exc:
        log.warning("report %s is refreshed in full: its state could not be read or written: %s",
                    config.report.name, exc)
        record.detail = "refreshed in full: the lake could not be reached for its incremental state"
        return None
    log.info("report %s %s", config.report.name, outcome.detail)
    record.detail = outcome.detail
    record.lake_versions = {table.qualified_name: outcome.version}
    record.dirty_rows = {table.qualified_name: outcome.hot_rows}
    return outcome.rows


def serve_lake_only(spark: SparkSession, tables: Sequence[RegisteredTable], columns: Mapping[int, Sequence],
                    config: ServeConfig, record: RunRecord, parsed: sql_guard.ParsedQuery) -> int:
    """Best effort without PostgreSQL: the lake at its latest versions, from the registry snapshot."""
    checked = sql_guard.resolve(parsed, tables)
    if checked.feeds:
        raise ReportError("the report reads a change feed (changes()), which needs PostgreSQL, and PostgreSQL is "
                          "unreachable; nothing was written")
    pinned = pin_versions(spark, checked.tables, config.lake_root)
    last_commit = None
    for table in checked.tables:
        version = pinned[table.table_id]
        if version is None:
            raise LakeUnavailableError(f"PostgreSQL is unreachable and the lake has no table for {table.qualified_name}")
        path = table.lake_path(config.lake_root)
        committed = delta.commit_time(spark, path, version)
        last_commit = committed if last_commit is None else min(last_commit, committed)
        rows = delta.read_version(spark, path, version)
        if config.as_of is not None:
            view = lake_as_of(rows, columns[table.table_id], config.as_of, table.qualified_name,
                              table.history == "exact")
        else:
            view = rows.transform(cold_live(columns[table.table_id], split=delta.settled_split(path, version)))
        view.createOrReplaceTempView(sql_guard.view_name(table))
    record.lake_versions = {t.qualified_name: pinned[t.table_id] for t in checked.tables}
    record.degraded, record.missing_tier, record.stale_since = True, "postgres", last_commit
    record.detail = ("PostgreSQL was unreachable: served from the lake alone; changes made after the last "
                     f"export ({last_commit.isoformat() if last_commit else 'unknown'}) are missing")
    log.warning("best effort: %s", record.detail)
    result = run_query(spark, checked, config.params)
    return write_result(result, config, None, None, record)


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def default_run_id(report: str) -> str:
    import uuid

    return f"{report}-{now_utc():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def history_window() -> timedelta:
    return timedelta(hours=settings.history_window_hours())

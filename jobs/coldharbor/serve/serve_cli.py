"""The serve_report job: its command line (-> ServeConfig), `run(spark, conn, config)`, the run's
record in coldharbor.report_runs and its exit codes; the checks the Airflow operator and sensor
make before a JVM starts (`refusal`, `waiting_for`). The read itself is `serve_job`'s."""

from __future__ import annotations

import argparse
import logging
from datetime import datetime, timezone

import psycopg
from pyspark.sql import SparkSession

from coldharbor.capture import registry
from coldharbor.capture.table_job import jdbc_target
from coldharbor.export import hot_reader
from coldharbor.lake import registry_cache
from coldharbor.runtime import pg, settings
from coldharbor.runtime.errors import ColdharborError, PostgresUnavailableError, ReportError
from coldharbor.runtime.job_main import run_job
from coldharbor.runtime.spark_errors import data_error
from coldharbor.serve import report_runs, report_spec
from coldharbor.serve.as_of import waiting_for_export
from coldharbor.serve.report_runs import RunRecord
from coldharbor.serve.serve_job import (
    MODES,
    ServeConfig,
    default_run_id,
    history_window,
    serve,
    serve_lake_only,
    validate_report,
)

log = logging.getLogger("coldharbor.serve_report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="serve_report.py",
        description="Run a report over the unified view of the tables it reads (lake rows minus dirty keys, "
                    "plus their hot images) and write the result atomically. PostgreSQL is reached through "
                    f"${settings.PG_DSN_ENV}; every run is recorded in coldharbor.report_runs.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--report", help=f"a report defined under sql/reports/ (${'COLDHARBOR_REPORTS_DIR'})")
    source.add_argument("--sql", help="ad-hoc SQL: one SELECT over registered tables; it may start with the "
                                      "same '-- param: name type [= default]' header lines as a report file")
    parser.add_argument("--target", help="report table name in the reports schema; ad-hoc SQL must name one "
                                         "starting with 'adhoc_'; a report file's own target is the default")
    parser.add_argument("--sink", choices=report_spec.SINKS, help="postgres (reports.<target>) or delta "
                                                                   "(<lake root>/reports/<target>); default: the report's")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a parameter value, bound as a typed literal (never formatted into the SQL); repeatable")
    parser.add_argument("--mode", choices=MODES, default="strict",
                        help="strict (default): fail when a tier is unreachable; best_effort: serve what is "
                             "reachable and record the run as degraded")
    parser.add_argument("--as-of", help="answer as PostgreSQL held the data at this ISO-8601 time (UTC if no "
                                        "zone), inside the history window "
                                        f"(${settings.HISTORY_WINDOW_ENV}, default "
                                        f"{settings.DEFAULT_HISTORY_WINDOW_HOURS:g} hours); 'now' or omitted: "
                                        "the current data")
    parser.add_argument("--lake-root", help=f"lake folder or URI (default: ${settings.LAKE_ROOT_ENV})")
    parser.add_argument("--run-id", help="identifier of this run (default: a new one)")
    return parser


def _parse_as_of(raw: str | None) -> datetime | None:
    if raw is None or raw.strip().lower() == "now":
        return None
    if not raw.strip():  # an unset shell variable: never the present by accident
        raise ReportError("--as-of is empty: give an ISO-8601 time (e.g. 2026-11-22T06:00:00Z) or now")
    try:
        value = datetime.fromisoformat(raw.strip())
    except ValueError:
        raise ReportError(f"--as-of {raw!r} is not an ISO-8601 time (e.g. 2026-11-22T06:00:00Z)") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _raw_params(pairs: list[str]) -> dict[str, str]:
    params = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ReportError(f"--param {pair!r} is not of the form NAME=VALUE")
        if name.strip() in params:
            raise ReportError(f"--param {name.strip()} is given twice: give each parameter one value")
        params[name.strip()] = value
    return params


def build_config(args: argparse.Namespace, run_id: str) -> ServeConfig:
    """The checked configuration; ReportError for an unknown report, a bad parameter or target."""
    reports = report_spec.load_reports(settings.reports_dir())
    if args.report is not None:
        if args.report not in reports:
            raise ReportError(report_spec.missing_report(args.report, settings.reports_dir(), reports))
        report = reports[args.report]
    else:
        report = report_spec.parse_report(args.sql, "adhoc")
        if report.name != "adhoc" or report.schedule:
            raise ReportError("ad-hoc SQL may declare parameters, target and sink only")
    target = report_spec.check_target(args.target or report.target, report, reports)
    return ServeConfig(report=report, params=report.bind(_raw_params(args.param)), target=target,
                       sink=args.sink or report.sink, mode=args.mode, as_of=_parse_as_of(args.as_of),
                       lake_root=settings.lake_root(args.lake_root),
                       run_id=run_id, history_window=history_window())


def parse_args(argv: list[str]) -> ServeConfig:
    """The checked configuration of a command line; ReportError for an unknown report, a bad
    parameter or target (the job itself parses in two steps: its run is recorded from the raw
    arguments before they are checked)."""
    args = build_parser().parse_args(argv)
    return build_config(args, args.run_id or default_run_id(args.report or "adhoc"))


def _record_failure(conn: psycopg.Connection | None, record: RunRecord, message: str) -> None:
    if conn is None or conn.closed or conn.broken:
        return
    try:
        report_runs.fail(conn, record, message)
    except psycopg.Error as exc:
        log.warning("could not record the failed run %s: %s", record.run_id, exc)


def report_session():
    """The job's session, with the SQL sandbox's settings forced whatever was submitted: Spark may
    not read files named in SQL nor substitute ${...} into the checked SQL text."""
    from coldharbor.runtime.spark import get_session

    spark = get_session("coldharbor-serve-report")
    spark.conf.set("spark.sql.variable.substitute", "false")
    spark.conf.set("spark.sql.runSQLOnFiles", "false")
    return spark


def refusal(argv: list[str], dsn: str) -> str | None:
    """The check `main` makes before a JVM starts, for a caller that has not started one either (the
    Airflow operator, before its spark-submit): the refusal message, recorded as a failed run, or
    None when the report may run. A malformed command line is a refusal too. PostgreSQL
    unreachable is not decided here: the job itself handles it (best effort, or one line)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        return "the report's arguments are malformed (the job's usage message says which)"
    report_name = args.report or "adhoc"
    record = RunRecord(args.run_id or default_run_id(report_name), report_name, args.target,
                       args.sink or "postgres", args.mode, None)
    try:
        conn = pg.connect(dsn)
    except ColdharborError:
        return None
    with conn:
        try:
            config = build_config(args, record.run_id)
            record.target, record.sink, record.as_of = config.target, config.sink, config.as_of
            registry.require_present(validate_report(config.report, registry.load(conn)).read_tables)
            if config.as_of is not None:
                hot_reader.require_commit_times(conn)
        except ColdharborError as exc:
            _record_failure(conn, record, str(exc))
            return str(exc)
    return None


def waiting_for(argv: list[str], dsn: str) -> str | None:
    """For a caller that waits before it runs the report (the report DAGs' wait_for_lake sensor):
    what keeps the report's as-of instant out of the lake until an export brings it in, as one line,
    or None when nothing does. A report that would be refused (its SQL, a table gone or not
    readable, commit timestamps off, an instant in the future or before the history window), a run
    without an as-of, and a lost PostgreSQL are not waited for: the report's run decides those (and
    records them)."""
    try:
        config = parse_args(argv)
    except (SystemExit, ColdharborError):
        return None
    if config.as_of is None:
        return None
    try:
        with pg.connect(dsn) as conn:
            tables = validate_report(config.report, registry.load(conn)).read_tables
            registry.require_present(tables)
            hot_reader.require_commit_times(conn)
            for table in tables:
                registry.require_privileges(conn, table)
            now = conn.execute("SELECT statement_timestamp()").fetchone()[0]
            if not now - config.history_window <= config.as_of <= now:
                return None  # in the future, or before the history window: refused whatever an export does
            return waiting_for_export(conn, tables, config.as_of)
    except (ColdharborError, psycopg.Error):
        return None


class _Run:
    """What a failure of the run needs to record it: the run, and PostgreSQL once connected."""

    def __init__(self) -> None:
        self.record: RunRecord | None = None
        self.conn: psycopg.Connection | None = None

    def label(self) -> str:
        return f"serve_report failed (run {self.record.run_id})" if self.record is not None else "serve_report failed"

    def record_failure(self, message: str) -> None:
        if self.record is not None:
            _record_failure(self.conn, self.record, message)


def report_data_error(exc: BaseException) -> str | None:
    """A value the report's SQL cannot compute (class 22: a division by zero, an overflow): the
    report's problem, said in one line, not a bug of the job."""
    failed_on = data_error(exc)
    return None if failed_on is None else f"the report fails on its data: {failed_on}; nothing was written"


def main(argv: list[str]) -> int:
    """Runs one report; exit 0 served, 2 refused or a tier lost (one line), 1 an unforeseen failure,
    each failure recorded in its run once the run has started (job_main.run_job)."""
    current = _Run()
    try:
        return run_job("serve_report", lambda: _serve(argv, current), label=current.label,
                       on_failure=current.record_failure, named_by_job=report_data_error)
    finally:
        if current.conn is not None:
            current.conn.close()


def _serve(argv: list[str], current: _Run) -> int:
    args = build_parser().parse_args(argv)  # a malformed command line exits 2 here
    report_name = args.report or "adhoc"
    dsn = settings.pg_dsn()
    pg.JdbcTarget.from_dsn(dsn)  # a DSN Spark's JDBC readers cannot use: refused before the run is recorded
    current.record = RunRecord(args.run_id or default_run_id(report_name), report_name, args.target,
                               args.sink or "postgres", args.mode, None)
    try:
        current.conn = pg.connect(dsn)
    except PostgresUnavailableError:
        if args.mode == "strict":
            raise
    # From here on a refusal is recorded in the run (PostgreSQL reached).
    return run(None, current.conn, build_config(args, current.record.run_id), current.record)


def run(spark: SparkSession | None, conn: psycopg.Connection | None, config: ServeConfig,
        record: RunRecord | None = None) -> int:
    """Serves the report: exit 0, its figures in `record`. Refused before a JVM starts (the run
    recorded as failed in one statement), otherwise recorded as running, then served.

    :param spark: the session to serve with, or None: the report's session (`report_session`) is
        started once the report is validated
    :param conn: PostgreSQL, or None in best effort when it is unreachable: the lake alone, from the
        registry snapshot the last run left
    :param record: the run's row in coldharbor.report_runs, filled in as the run goes (`main` keeps
        it to record a failure); default: a new one for `config`
    """
    record = record or RunRecord(config.run_id, config.report.name, config.target, config.sink, config.mode, None)
    record.target, record.sink, record.as_of = config.target, config.sink, config.as_of
    checked = validate_report(config.report, registry.load(conn) if conn is not None else None)
    if conn is not None:
        jdbc = jdbc_target()
        if config.as_of is not None:
            hot_reader.require_commit_times(conn)
        report_runs.start(conn, record)  # from here on, a failure is recorded too
        record.row_count = serve(spark or report_session(), conn, jdbc, config, record, checked)
        report_runs.succeed(conn, record)
    else:  # once the report passed its checks: a refused one reads nothing
        log.warning("best effort: PostgreSQL at %s is unreachable; reading the lake alone",
                    pg.describe(settings.pg_dsn()))
        spark = spark or report_session()
        tables, columns = registry_cache.load(spark, config.lake_root)
        record.row_count = serve_lake_only(spark, tables, columns, config, record, checked)
    log.info("report %s run %s: %s rows to %s (%s)%s; lake versions %s; dirty rows %s", config.report.name,
             config.run_id, record.row_count, config.target, config.sink,
             f"; DEGRADED: {record.detail}" if record.degraded else "", record.lake_versions, record.dirty_rows)
    return 0

"""What every job's main() shares: logging, and turning a domain error into one line and exit 2."""

from __future__ import annotations

import argparse
import logging
import warnings
from collections.abc import Callable
from pathlib import Path

import psycopg

from coldharbor.runtime import settings
from coldharbor.runtime.errors import ColdharborError, PostgresUnavailableError, PrivilegeError, jvm_message, one_line

# Every exit code a job ends with: the one table, which the Airflow operator reads to say what a
# failed run's code means (a job's own meaning of a code comes before the shared one).
EXIT_UNFORESEEN = 1  # an error no check foresaw: a bug to report, its traceback kept in a file
EXIT_REFUSED = 2  # a ColdharborError: bad input, or a tier unreachable; nothing half-done
EXIT_GAVE_UP = 3  # compaction: concurrent commits won every attempt
EXIT_INCOMPLETE = 4  # purge: purged, but rows remain in files the retention keeps
EXIT_DIFFERENT = 1  # verify: the lake's view differs from PostgreSQL (verify's unforeseen errors exit 2)
EXIT_MEANINGS = {
    EXIT_UNFORESEEN: "an error no check foresaw (its one line and the file keeping its traceback are above)",
    EXIT_REFUSED: "refused or a tier was unreachable; nothing was changed or marked",
    EXIT_GAVE_UP: "compaction gave up after repeated conflicts; the table is unchanged",
    EXIT_INCOMPLETE: "the purge is incomplete (rows still match)",
}
JOB_EXIT_MEANINGS = {
    "verify": {EXIT_DIFFERENT: "the lake view differs from PostgreSQL (the differing key ranges and sample keys "
                               "are above); repair it with the coldharbor_resync DAG",
               EXIT_REFUSED: "refused, a tier was unreachable, or an error no check foresaw (the job's one line "
                             "above says which); nothing was changed"},
}
TRACEBACK_DIR_ENV = "COLDHARBOR_TRACEBACK_DIR"


def exit_meaning(job: str, code: int) -> str:
    """What exit `code` of `job` (its entrypoint's name, with or without .py) means."""
    own = JOB_EXIT_MEANINGS.get(job.removesuffix(".py"), {})
    return own.get(code) or EXIT_MEANINGS.get(code) or "Spark or the job failed"


def job_parser(prog: str, description: str, *, table_help: str | None = None, run_id_help: str | None = None,
               lake_root_help: str | None = None) -> argparse.ArgumentParser:
    """The command line every job starts from: `--table` (required, or optional with `table_help`
    saying what all tables means), `--lake-root`, and `--run-id` when the job records one.

    :param table_help: the help of an optional --table (the job then takes every registered table
        without one); None: --table names the one table, required
    :param run_id_help: the help of --run-id, or None for a job that records no run
    :param lake_root_help: the help of --lake-root when it says more than the default's
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    if table_help is None:
        parser.add_argument("--table", required=True, help="the registered table (schema.table)")
    else:
        parser.add_argument("--table", help=table_help)
    parser.add_argument("--lake-root",
                        help=lake_root_help or f"lake folder or URI (default: ${settings.LAKE_ROOT_ENV})")
    if run_id_help is not None:
        parser.add_argument("--run-id", help=run_id_help)
    return parser


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # psycopg warns with its objects' reprs when a rollback on a lost connection fails; the job's own
    # line says PostgreSQL was lost.
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    # PySpark logs every failed query whole (JSON with the JVM stack) before it raises; the job
    # says what failed in its own one line. (PySpark's logger class: its calls pass extra fields.)
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)
    # ...and the Connect client warns on stderr before it raises for a server it gave up on.
    warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")


def run_job(name: str, body: Callable[[], int], unexpected_exit: int = EXIT_UNFORESEEN, *,
            label: Callable[[], str] | None = None, on_failure: Callable[[str], None] | None = None,
            named_by_job: Callable[[BaseException], str | None] | None = None) -> int:
    """Every job's main(): runs `body` and returns its exit code. A ColdharborError, a lost
    PostgreSQL or Spark Connect server or a refused privilege is logged as one line: exit 2. Any
    other exception is one line too (`unexpected`, naming the file that keeps its traceback for a
    bug report): exit `unexpected_exit`, 1 unless the job's exit 1 means something else (verify:
    differences found). The Spark Connect sessions it opened are released.

    :param label: how the failure's line starts (default "<name> failed"; a report adds its run id)
    :param on_failure: called with that one line's message before a failed run exits (a report
        records it in its run); its own failure is logged, never raised
    :param named_by_job: the job's own one line for an exception that is its user's problem (a
        report's SQL meeting a value it cannot compute), or None: then exit 2
    """
    from coldharbor.runtime.spark import release_sessions

    configure_logging()
    try:
        return _run(name, body, unexpected_exit, label or (lambda: f"{name} failed"), on_failure, named_by_job)
    finally:
        release_sessions()


def unexpected(exc: BaseException) -> str:
    """One line for an exception no check foresaw (a bug to report): its type, its message's first
    line (a JVM error's cause) and the innermost line of Coldharbor's code it passed, which is what
    a traceback would have shown a reader."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "coldharbor" in Path(f.filename).parts[:-1]] or frames
    where = f" (at {shown_path(ours[-1].filename)}:{ours[-1].lineno} in {ours[-1].name})" if ours else ""
    return one_line(f"an error no check foresaw{where}: {type(exc).__name__}: {jvm_message(exc)}")


def shown_path(filename: str) -> str:
    """A source file as an error line names it: from the `coldharbor` package down
    (coldharbor/export/export_job.py), else its name alone."""
    parts = Path(filename).parts
    if "coldharbor" in parts[:-1]:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("coldharbor"):])
    return Path(filename).name


def reason(exc: BaseException) -> str:
    """One line saying why `exc` happened, for a record or a warning beside the job's own error line:
    a lost PostgreSQL or Spark Connect server as the job would name it, a ColdharborError's message,
    else the JVM cause or the first line (never a multi-line gRPC or JVM repr)."""
    from coldharbor.runtime.pg import lost_postgres
    from coldharbor.runtime.spark_errors import lost_spark

    lost = lost_postgres(exc) or lost_spark(exc)
    if lost is not None:
        return one_line(str(lost))[:500]
    if isinstance(exc, ColdharborError):
        return one_line(str(exc))[:500]
    return one_line(jvm_message(exc) if str(exc).strip() else type(exc).__name__)[:500]


def keep_traceback(name: str, exc: BaseException) -> Path | None:
    """Writes `exc`'s traceback to a file of its own (COLDHARBOR_TRACEBACK_DIR, else the temporary
    folder) for the bug report, and returns it; None when it cannot be written."""
    import os
    import tempfile
    import time
    import traceback

    folder = Path(os.environ.get(TRACEBACK_DIR_ENV) or tempfile.gettempdir())
    path = folder / f"coldharbor-{name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.traceback"
    try:
        path.write_text("".join(traceback.format_exception(exc)))
    except OSError:
        return None
    return path


def _run(name: str, body: Callable[[], int], unexpected_exit: int, label: Callable[[], str],
         on_failure: Callable[[str], None] | None,
         named_by_job: Callable[[BaseException], str | None] | None) -> int:
    from coldharbor.runtime import settings

    job_log = logging.getLogger(f"coldharbor.{name}")  # the job's own line, under the job's name

    def failed(message: object, code: int = EXIT_REFUSED, recorded: object | None = None) -> int:
        if on_failure is not None:
            try:
                on_failure(str(message if recorded is None else recorded))
            except Exception as exc:  # noqa: BLE001 - the run's own line below says what failed
                job_log.warning("%s: its failure could not be recorded: %s", label(), reason(exc))
        job_log.error("%s: %s", label(), message)
        return code

    try:
        settings.check_settings()
        return body()
    except ColdharborError as exc:
        return failed(exc)
    except psycopg.OperationalError as exc:
        return failed(PostgresUnavailableError(f"lost PostgreSQL: {exc}"))
    except psycopg.errors.InsufficientPrivilege as exc:  # one the checks before the work did not foresee
        return failed(PrivilegeError(
            f"PostgreSQL refused the job's role: {exc.diag.message_primary} (see README, 'Roles and privileges')"))
    except Exception as exc:
        from coldharbor.runtime.pg import lost_postgres
        from coldharbor.runtime.spark_errors import lost_spark

        # A Spark JDBC reader or writer that lost PostgreSQL, or the Spark Connect server gone.
        lost = lost_postgres(exc) or lost_spark(exc)
        if lost is not None:
            return failed(lost)
        own = named_by_job(exc) if named_by_job is not None else None
        if own is not None:
            return failed(own)
        kept = keep_traceback(name, exc)
        return failed(f"{unexpected(exc)}{f'; its traceback is in {kept}' if kept else ''}", unexpected_exit,
                      recorded=f"{type(exc).__name__}: {exc}")

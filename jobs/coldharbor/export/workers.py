"""Several tables exported at once (`table_export.export_tables` with more than one worker): each worker has a
PostgreSQL connection and a Spark session of its own and takes the next table when its last one is
done; every table is still one export of its own, under its own lock, so a crash anywhere leaves
what a sequential run would."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import psycopg
from pyspark.sql import SparkSession

from coldharbor.runtime import pg, settings
from coldharbor.runtime import spark as spark_sessions
from coldharbor.runtime.job_main import reason
from coldharbor.runtime.spark_parallelism import cores

log = logging.getLogger(__name__)
I = TypeVar("I")  # noqa: E741
R = TypeVar("R")


def in_parallel(spark: SparkSession, conn: psycopg.Connection, dsn: str, items: Sequence[I], workers: int,
                work: Callable[[SparkSession, psycopg.Connection, I], R]) -> list[R]:
    """`work(session, connection, item)` for each item, `workers` at a time, the results in the items'
    order. The first worker uses `conn` and `spark`; the others open a connection to `dsn` and a
    sibling Spark session (one that cannot start leaves its items to the others). An unforeseen
    error stops the other workers after their current item and is raised; the job being stopped
    (Airflow's timeout or on_kill, Ctrl-C) interrupts the items under way in Spark."""
    results: list[R | None] = [None] * len(items)
    queue = iter(enumerate(items))
    taking = threading.Lock()
    stop = threading.Event()
    failures: list[BaseException] = []
    sessions = [spark]

    def worker(first: bool) -> None:
        try:
            with contextlib.ExitStack() as own:
                if first:
                    session, connection = spark, conn
                else:
                    try:
                        connection = own.enter_context(pg.connect(dsn))
                        # Released before the connection closes (the table locks go with it).
                        own.callback(spark_sessions.release_sessions)
                        session = spark_sessions.sibling_session(spark, "coldharbor-cdc-export")
                    except Exception as exc:  # noqa: BLE001 - the other workers go on
                        log.warning("an export worker could not start (%s); the others export its tables",
                                    reason(exc))
                        return
                    sessions.append(session)
                while not stop.is_set():
                    with taking:
                        index, item = next(queue, (None, None))
                    if index is None:
                        return
                    results[index] = work(session, connection, item)
        except BaseException as exc:  # noqa: BLE001 - raised again below, in the job's thread
            failures.append(exc)
            stop.set()

    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="export")
    try:
        for future in [pool.submit(worker, n == 0) for n in range(workers)]:
            future.result()
    except BaseException:
        # The job is being stopped (Airflow's timeout or on_kill, Ctrl-C): no table is started any
        # more and the ones under way are interrupted in Spark, as the one-worker job's would be.
        stop.set()
        spark_sessions.interrupt_sessions(sessions)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for extra in failures[1:]:
        log.warning("another export worker failed too: %s", reason(extra))
    if failures:
        raise failures[0]
    return [r for r in results if r is not None]


def worker_count(spark: SparkSession, tables: int) -> int:
    """How many tables an export cycle exports at once: COLDHARBOR_EXPORT_WORKERS, else as many as
    Spark runs tasks at once (at most settings.DEFAULT_MAX_EXPORT_WORKERS); never more than the
    tables. Most of a small table's export is the Spark driver's planning and Delta's commit (which
    rebuilds the table's state to check the batch's transaction id), so a second table's export uses
    the time one leaves idle: 50 tables of 200 dirty rows on a 2-core Connect server took 22-30 s
    two at a time against 35-38 s one after the other (bench.engine; the machine is noisy).
    """
    configured = settings.export_workers()
    if tables <= 1:
        return 1
    if configured:
        return min(configured, tables)
    return max(1, min(cores(spark), settings.DEFAULT_MAX_EXPORT_WORKERS, tables))

"""A base's place among the lake's versions: per key the lake holds, its newest change sequence
(`lake_sequences`; a base row takes it, so it outranks every older version of its key and loses
to every change exported after it), and the change_log id sequence moved past the lake's newest
when PostgreSQL was restored from a backup (`advance_change_sequence`), or a new change would lose
to an older version of its key."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from coldharbor.capture.registry import RegisteredTable
from coldharbor.lake import delta
from coldharbor.lake.lake_rows import DELETED, SEQ, column, latest_per_key
from coldharbor.runtime.errors import LakeUnavailableError, TableBusyError, jvm_message

log = logging.getLogger(__name__)


def lake_sequences(spark: SparkSession, path: str, keys: Sequence[str]) -> DataFrame | None:
    """Per key the lake holds: its newest change sequence and whether that version is live."""
    version = delta.pin_version(spark, path)
    if version is None:
        return None
    newest = delta.read_version(spark, path, version).transform(latest_per_key(keys))
    return newest.select(*map(column, keys), column(SEQ).alias("_ch_lake_seq"),
                         (~column(DELETED)).alias("_ch_lake_live"))


SEQUENCE_WAIT_S = 60


def advance_change_sequence(conn: psycopg.Connection, lake_keys: DataFrame, table: RegisteredTable,
                            path: str) -> None:
    """Makes every change id from now on larger than every sequence the lake holds.

    Normally it already is. After PostgreSQL was restored from a backup the sequence is back in the
    past, and a new change with a smaller id than the lake's newest version of its key would lose to
    it. Once the sequence is moved, the base waits for the transactions that may hold an id taken
    before (they were running when it moved), so its snapshot holds every such change.

    This is the base's first read of every lake file: one removed by hand is refused here, in one
    line, before the base records its intent.
    """
    try:
        newest = lake_keys.agg(F.max(column("_ch_lake_seq"))).first()[0]
    except Exception as exc:
        if not delta.files_gone(exc):
            raise
        raise LakeUnavailableError(
            f"files of the lake table of {table.quoted_name} at {path} are gone (removed by hand, or a lost "
            f"folder): {jvm_message(exc)}; a base outranks the lake's rows key by key and cannot do so "
            "without them: move that folder aside (or remove it) and run the resync again, which writes the "
            "table whole into a new lake table there; nothing was written") from None
    if newest is None:
        return
    moved = conn.execute(
        """SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
                  setval('coldharbor.change_log_id_seq', %s)
             FROM coldharbor.change_log_id_seq WHERE last_value < %s""", (newest, newest)).fetchone()
    if moved is None:
        return
    log.warning("the change_log id sequence was behind the lake's newest change sequence %s (PostgreSQL "
                "restored from a backup?); moved it past, waiting for transactions that took ids before", newest)
    deadline = time.monotonic() + SEQUENCE_WAIT_S
    while conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint < %s",
                       (moved[0],)).fetchone()[0]:
        if time.monotonic() > deadline:
            raise TableBusyError(f"transactions open since the change sequence was moved did not end within "
                                 f"{SEQUENCE_WAIT_S} s; nothing was written, retry the resync")
        time.sleep(0.2)

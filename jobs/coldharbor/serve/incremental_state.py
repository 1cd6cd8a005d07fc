"""An incremental report's state in the lake (`<root>/_coldharbor/incremental/<target>`): one row per
group with its partial aggregates, and the frontier it reflects (lake version, batch, fingerprint
of the report) in the commit's user metadata. See `incremental` for the refresh that keeps it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from coldharbor.capture import table_names
from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.lake import delta, lake_store
from coldharbor.runtime.errors import jvm_message
from coldharbor.runtime.spark import local_checkpoint
from coldharbor.serve.report_spec import ParamValues

log = logging.getLogger(__name__)


STATE_FOLDER = "incremental"


STATE_FORMAT = 1


@dataclass(frozen=True)
class Frontier:
    version: int            # the lake version of the newest batch the cold part holds
    batch_id: int
    fingerprint: str
    built_at: str           # PostgreSQL's now() when the state was written (ISO 8601)


def state_path(lake_root: str, target: str) -> str:
    return f"{lake_root}/{table_names.OWN_FOLDER}/{STATE_FOLDER}/{target}"


def fingerprint(report_sql: str, params: ParamValues, table: RegisteredTable,
                columns: Sequence[LakeColumn]) -> str:
    """What the state answers: the report's SQL and parameter values over the table's columns."""
    text = json.dumps({"format": STATE_FORMAT, "sql": report_sql,
                       "params": {k: f"{params.types.get(k)} {v!r}" for k, v in sorted(params.items())},
                       "table": table.table_id, "columns": [(c.name, c.lake_type, c.key_position) for c in columns]},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


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

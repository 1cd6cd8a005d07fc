"""File count and size of a Delta table, read from its log with the `deltalake` package (no JVM in
the Airflow API server)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)
UNAVAILABLE = "unavailable (see the API server's log)"
NO_LAKE_ROOT = "unavailable: no lake root configured"
NO_OWN_FOLDER = "none: its name is no folder name; an administrator registers it again with a p_lake_location"


def folder(table: Mapping[str, Any]) -> tuple[str | None, str]:
    """(the table's lake folder as the jobs find it, ""), or (None, a sentence why it has none).
    `table` is a row of the health figures (schema_name, table_name, lake_location)."""
    from coldharbor.capture.table_names import lake_path
    from coldharbor.runtime.errors import ConfigError

    root = os.environ.get("COLDHARBOR_LAKE_ROOT")
    if not (table["lake_location"] or root):
        return None, NO_LAKE_ROOT
    try:
        return lake_path(table["schema_name"], table["table_name"], table["lake_location"],
                         (root or "").rstrip("/")), ""
    except ConfigError:
        return None, NO_OWN_FOLDER


def read_log(path: str) -> tuple[int, list[int]] | str:
    """(the table's current Delta version, the size in bytes of each of its files), or a short
    sentence saying they could not be read; why (an error text naming paths) goes to the log, not
    to the caller."""
    try:
        from deltalake import DeltaTable

        table = DeltaTable(path)
        return table.version(), table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    except Exception as exc:  # a missing or unreachable lake is shown, not raised
        log.warning("cannot read the Delta log of %s: %s", path, exc)
        return UNAVAILABLE


def file_figures(path: str) -> tuple[int, float] | str:
    """(file count, average file size in bytes), or the sentence of `read_log`."""
    read = read_log(path)
    if isinstance(read, str):
        return read
    sizes = read[1]
    return len(sizes), (sum(sizes) / len(sizes) if sizes else 0.0)

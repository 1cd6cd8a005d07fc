"""File count and size of a Delta table, read from its log with the `deltalake` package (no JVM in
the Airflow API server)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
UNAVAILABLE = "unavailable (see the API server's log)"


def file_figures(path: str) -> tuple[int, float] | str:
    """(file count, average file size in bytes), or a short sentence saying they could not be
    read; why (an error text naming paths) goes to the log, not to the page."""
    try:
        from deltalake import DeltaTable

        sizes = DeltaTable(path).get_add_actions(flatten=True).column("size_bytes").to_pylist()
    except Exception as exc:  # a missing or unreachable lake is shown, not raised
        log.warning("health page: cannot read the Delta log of %s: %s", path, exc)
        return UNAVAILABLE
    return len(sizes), (sum(sizes) / len(sizes) if sizes else 0.0)

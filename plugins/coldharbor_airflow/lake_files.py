"""File count and size of a Delta table, read from its log with the `deltalake` package (no JVM in
the Airflow API server)."""

from __future__ import annotations


def file_figures(path: str) -> tuple[int, float] | str:
    """(file count, average file size in bytes), or why they could not be read."""
    try:
        from deltalake import DeltaTable

        sizes = DeltaTable(path).get_add_actions(flatten=True).column("size_bytes").to_pylist()
    except Exception as exc:  # a missing or unreachable lake is shown, not raised
        return f"unavailable: {str(exc).splitlines()[0][:200]}"
    return len(sizes), (sum(sizes) / len(sizes) if sizes else 0.0)

"""The lake seen from the job's Python process, without a JVM: what Spark's DataFrame/SQL API does
not offer, the same on a classic session and on a Spark Connect one.

- the Delta log, through the `deltalake` package: whether a folder holds a Delta table, its
  version, its newest commits' information, its live files with their statistics, the last
  txnVersion an app id committed (milliseconds, where a Spark query takes a good part of a second);
- small files of our own (the registry copy, the write probe, a killed export's leftovers) and the
  listing of a table folder, through pyarrow's file systems.

Local paths and file: URIs, and S3 as s3:// or s3a:// (credentials, region and endpoint from the
AWS_* environment, as s3a and the health page read them); other URIs as pyarrow and deltalake know
them. Every failure is one LakeUnavailableError naming what failed where.
"""

from __future__ import annotations

import functools
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from coldharbor.runtime.errors import ColdharborError, LakeUnavailableError

S3_SCHEMES = ("s3", "s3a", "s3n")
DELTA_LOG = "_delta_log"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextmanager
def failing_as(what: str, path: str) -> Iterator[None]:
    """Any failure inside becomes one LakeUnavailableError: `what` `path` failed: the cause."""
    try:
        yield
    except ColdharborError:
        raise
    except Exception as exc:
        raise LakeUnavailableError(f"{what} {path} failed: {message(exc)}") from exc


def message(exc: BaseException) -> str:
    """The cause in one line: deltalake and pyarrow errors are chains of indented lines, the first
    saying what was attempted and the last why it failed."""
    lines = [line.strip(" ↳\t") for line in _ANSI.sub("", str(exc)).splitlines() if line.strip(" ↳\t")]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]}: {lines[-1]}"
    return text[:500]


# The Delta log -----------------------------------------------------------------------------------

def is_delta_table(path: str) -> bool:
    with failing_as("reading the Delta log of", path):
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(path)


def version(path: str) -> int | None:
    """The table's current version, or None when there is no table."""
    with failing_as("reading the Delta log of", path):
        table = _load(path)
        return None if table is None else table.version()


def history(path: str, limit: int) -> list[dict] | None:
    """The newest `limit` commits' information (version, operation, userMetadata,
    operationMetrics, isBlindAppend), newest first; None when there is no table."""
    with failing_as("reading the Delta history of", path):
        table = _load(path)
        return None if table is None else table.history(limit)


def txn_version(path: str, app_id: str) -> int | None:
    """The newest txnVersion Delta recorded for `app_id`, or None (no table, or never that app id)."""
    with failing_as("reading the Delta log of", path):
        table = _load(path)
        return None if table is None else table.transaction_version(app_id)


def table_property(path: str, name: str) -> str | None:
    """The value of the Delta table's property `name` (None: not set, or no table)."""
    with failing_as("reading the Delta log of", path):
        table = _load(path)
        return None if table is None else table.metadata().configuration.get(name)


def settled_split(path: str, version: int, column: str) -> tuple[int, int] | None:
    """(rows in the files of `version` that hold a NULL `column` or lack its statistics, rows in
    the files that hold none), from the Delta log's file statistics; None when no file has them."""
    with failing_as("reading the Delta log of", path):
        import pyarrow as pa
        from deltalake import DeltaTable

        actions = pa.table(DeltaTable(path, version=version).get_add_actions(flatten=True))
        nulls = f"null_count.{column}"
        if nulls not in actions.column_names or "num_records" not in actions.column_names:
            return None
        unsettled = settled = 0
        for records, null_count in zip(actions.column("num_records").to_pylist(), actions.column(nulls).to_pylist()):
            if records is None:
                return None
            if null_count == 0:
                settled += records
            else:
                unsettled += records
        return unsettled, settled


def live_files(path: str) -> tuple[int, list[dict]] | None:
    """(version, one dict per live file: path as the log has it, partition as text, size_bytes,
    num_records, and from the file's statistics max_batch_id and unsettled_rows (its NULL
    `_ch_settled` values; None without statistics of the column)), or None when there is no table."""
    with failing_as("reading the Delta log of", path):
        import pyarrow as pa

        table = _load(path)
        if table is None:
            return None
        actions = pa.table(table.get_add_actions(flatten=False))
        names = set(actions.column_names)
        files = []
        for row in actions.to_pylist():
            partition = row.get("partition") if "partition" in names else None
            maxima = (row.get("max") if "max" in names else None) or {}
            nulls = (row.get("null_count") if "null_count" in names else None) or {}
            files.append({"path": row["path"], "size": row["size_bytes"], "records": row.get("num_records"),
                          "partition": {k: partition_text(v) for k, v in (partition or {}).items()},
                          "max_batch_id": maxima.get("_ch_batch_id"), "unsettled_rows": nulls.get("_ch_settled")})
        return table.version(), files


def _load(path: str):
    """The Delta table's latest snapshot, or None when the folder holds no Delta log (or no folder)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path)
    except TableNotFoundError:
        return None


def partition_text(value) -> str | None:
    """A typed partition value as text Spark casts back to the same value (CAST(text AS type))."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):  # isoformat: strftime's %Y does not pad a year before 1000
        if value.tzinfo is not None:
            return value.astimezone(timezone.utc).replace(tzinfo=None).isoformat("T", "microseconds") + "Z"
        return value.isoformat(" ", "microseconds")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    return str(value)


# Files ------------------------------------------------------------------------------------------

def read_text(path: str) -> str | None:
    """A small file's text, or None if it is not there."""
    import pyarrow.fs as pafs

    with failing_as("reading", path):
        fs, where = filesystem(path)
        if fs.get_file_info(where).type != pafs.FileType.File:
            return None
        with fs.open_input_stream(where) as stream:
            return stream.read().decode("utf-8")


def write_text(path: str, text: str) -> None:
    """Replaces a small file: written aside under a name of this writer's own (reports running at
    once each refresh the registry copy), then moved over in one step."""
    with failing_as("writing", path):
        fs, where = filesystem(path)
        fs.create_dir(str(PurePosixPath(where).parent), recursive=True)
        staged = f"{where}.{uuid.uuid4().hex}.tmp"
        with fs.open_output_stream(staged) as out:
            out.write(text.encode("utf-8"))
        fs.move(staged, where)


def probe_writable(path: str, probe_name: str) -> None:
    """Creates the folder if needed and proves a file can be written there (and removed)."""
    with failing_as("writing the lake at", path):
        fs, where = filesystem(path)
        fs.create_dir(where, recursive=True)
        probe = f"{where.rstrip('/')}/{probe_name}"
        with fs.open_output_stream(probe):
            pass
        fs.delete_file(probe)


def remove_if_older(folder: str, name: str, cutoff: datetime, dry_run: bool) -> str | None:
    """Removes folder/name if it was last written before `cutoff`; returns its path if it went (or,
    dry, would go)."""
    import pyarrow.fs as pafs

    path = f"{folder.rstrip('/')}/{name}"
    with failing_as("removing", path):
        fs, where = filesystem(path)
        info = fs.get_file_info(where)
        if info.type != pafs.FileType.File or info.mtime is None or _aware(info.mtime) >= cutoff:
            return None
        if not dry_run:
            fs.delete_file(where)
        return path


def data_files(path: str) -> list[str]:
    """Every non-empty Parquet file under the table folder outside _delta_log, referenced or not, as
    paths under `path` (so Spark reads them with the lake's own URI)."""
    import pyarrow.fs as pafs

    with failing_as("listing", path):
        fs, root = filesystem(path)
        found = []
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
            relative = PurePosixPath(info.path[len(root.rstrip("/")):].lstrip("/"))
            if info.type != pafs.FileType.File or not relative.parts or relative.parts[0] == DELTA_LOG:
                continue
            if relative.suffix == ".parquet" and info.size:
                found.append(f"{path.rstrip('/')}/{relative}")
        return sorted(found)


def filesystem(path: str):
    """(pyarrow file system, path inside it) of a lake path or URI."""
    import pyarrow.fs as pafs

    parts = urlsplit(path)
    scheme = parts.scheme.lower()
    if scheme in S3_SCHEMES:
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return _s3(endpoint, os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")), \
            f"{parts.netloc}{parts.path}"
    if scheme in ("", "file"):
        return pafs.LocalFileSystem(), parts.path if scheme else path
    return pafs.FileSystem.from_uri(path)


@functools.cache
def _s3(endpoint: str | None, region: str | None):
    """S3 as s3a and deltalake see it: credentials from the AWS default chain (AWS_ACCESS_KEY_ID,
    ...), the region from AWS_REGION, an endpoint (MinIO) from AWS_ENDPOINT_URL, path-style."""
    import pyarrow.fs as pafs

    options = {}
    if endpoint:
        parts = urlsplit(endpoint)
        options["endpoint_override"] = parts.netloc or endpoint
        options["scheme"] = parts.scheme or "https"
    if region:
        options["region"] = region
    return pafs.S3FileSystem(**options)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)

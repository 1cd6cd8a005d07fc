"""OpenLineage for Coldharbor's jobs: what a task read and wrote, as datasets an OpenLineage backend
(Marquez, or any) links into PostgreSQL table -> Delta table -> report table.

Airflow's OpenLineage provider asks the operator (`get_openlineage_facets_on_complete`) after a task
ran, and only when it is configured with a transport ([openlineage] transport, or OPENLINEAGE_URL):
otherwise nothing here runs. The datasets are named as OpenLineage's naming spec says:

    PostgreSQL table   namespace postgres://<host>:<port>   name <database>.<schema>.<table>
    lake table, local  namespace file                        name <absolute path>
    lake table, S3     namespace s3://<bucket>               name <key>   (s3a:// and s3n:// too)

Each registered table's datasets carry a schema facet (its columns with their PostgreSQL types on
the PostgreSQL side, their Delta types on the lake side). What a job reads and writes:

    cdc_export.py        PostgreSQL tables -> their lake tables (every registered table when the
                         task exports every dirty table)
    compact.py, cleanup.py
                         the lake tables they rewrite
    purge.py             PostgreSQL and lake tables -> the same (it deletes from both)
    resync.py            PostgreSQL and lake tables -> the lake tables
    verify.py            PostgreSQL and lake tables (it compares; it writes nothing)
    serve_report.py      the report's tables (PostgreSQL and lake, change feeds included) -> the
                         report table (reports.<target> in PostgreSQL, or its Delta folder)
    changes.py           the table (PostgreSQL and lake) -> reports.<target>
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

from airflow.providers.common.compat.openlineage.facet import Dataset, SchemaDatasetFacet, SchemaDatasetFacetFields
from airflow.providers.openlineage.extractors import OperatorLineage

from coldharbor_airflow.paths import import_jobs_package

log = logging.getLogger(__name__)

# The other jobs, per table: (reads PostgreSQL's table, reads the lake's, writes PostgreSQL's, writes the lake's).
_SIDES = {"compact.py": (False, True, False, True), "cleanup.py": (False, True, False, True),
          "purge.py": (True, True, True, True), "resync.py": (True, True, False, True),
          "verify.py": (True, True, False, False)}


def postgres_dataset(dsn: str, schema: str, table: str, fields: Sequence[tuple[str, str]] = ()) -> Dataset:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    # libpq's lists of hosts and ports (failover): the first one names the server. A socket folder
    # is the local server; an IPv6 address is bracketed, as in a URL.
    host = (str(params.get("host") or params.get("hostaddr") or "localhost")).split(",")[0] or "localhost"
    port = str(params.get("port") or 5432).split(",")[0] or "5432"
    host = "localhost" if host.startswith(("/", "@")) else (f"[{host}]" if ":" in host else host)
    namespace = f"postgres://{host}:{port}"
    return Dataset(namespace=namespace, name=f"{params.get('dbname') or params.get('user')}.{schema}.{table}",
                   facets=_schema(fields))


def lake_dataset(path: str, fields: Sequence[tuple[str, str]] = ()) -> Dataset:
    """A Delta table by its folder: file + absolute path, or s3://bucket + key."""
    scheme, sep, rest = path.partition("://")
    if not sep:  # a local folder
        return Dataset(namespace="file", name=os.path.abspath(path), facets=_schema(fields))
    # Split by hand: a folder name may hold '#' or '?', which a URL parser would cut off.
    host, _, key = rest.partition("/")
    if scheme in ("s3", "s3a", "s3n"):
        return Dataset(namespace=f"s3://{host}", name=key, facets=_schema(fields))
    if scheme == "file":
        return Dataset(namespace="file", name=f"/{key}", facets=_schema(fields))
    return Dataset(namespace=f"{scheme}://{host}", name=f"/{key}", facets=_schema(fields))


def _schema(fields: Sequence[tuple[str, str]]) -> dict:
    if not fields:
        return {}
    return {"schema": SchemaDatasetFacet(fields=[SchemaDatasetFacetFields(name=n, type=t) for n, t in fields])}


def job_lineage(job: str, argv: Sequence[str], dsn: str, lake_root: str) -> OperatorLineage:
    """The datasets one run of `job` with `argv` reads and writes, from the registry (and, for a
    report, its checked SQL): a report that would be refused names no dataset."""
    import_jobs_package()
    from coldharbor.capture import registry
    from coldharbor.runtime import pg
    from coldharbor.runtime.errors import ColdharborError

    with pg.connect(dsn) as conn:
        if job == "serve_report.py":
            return _report(conn, argv, dsn, lake_root)
        tables = _tables(conn, argv)

        def sides(table):
            columns = registry.lake_columns(conn, table)
            source = postgres_dataset(dsn, table.schema_name, table.table_name, [(c.name, c.pg_type) for c in columns])
            lake = lake_dataset(table.lake_path(lake_root), [(c.name, c.lake_type.lower()) for c in columns])
            return source, lake

        pairs = []
        for table in tables:
            try:
                pairs.append(sides(table))
            except ColdharborError as exc:  # no lake folder of its own name, gone since: the job refuses it too
                log.info("no lineage for %s: %s", table.qualified_name, exc)
        if job == "cdc_export.py":
            return OperatorLineage(inputs=[s for s, _ in pairs], outputs=[lake for _, lake in pairs])
        if job == "changes.py":
            target = _option(argv, "--target")
            output = _report_output(dsn, lake_root, target, _option(argv, "--sink") or "postgres")
            return OperatorLineage(inputs=[d for pair in pairs for d in pair], outputs=[output] if target else [])
        read_pg, read_lake, write_pg, write_lake = _SIDES.get(job, (False, False, False, False))
        return OperatorLineage(
            inputs=[d for source, lake in pairs for d, used in ((source, read_pg), (lake, read_lake)) if used],
            outputs=[d for source, lake in pairs for d, used in ((source, write_pg), (lake, write_lake)) if used])


def _tables(conn, argv: Sequence[str]):
    """The tables a job's --table arguments name, else every registered table present."""
    from coldharbor.capture import registry

    named = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--table"]
    if named:
        return [t for name in named for t in registry.load(conn, name)]
    return [t for t in registry.load(conn) if t.present]


def _report(conn, argv: Sequence[str], dsn: str, lake_root: str) -> OperatorLineage:
    from coldharbor.capture import registry
    from coldharbor.runtime.errors import ColdharborError
    from coldharbor.serve.serve_cli import build_config, build_parser
    from coldharbor.serve.serve_job import validate_report

    if "--lake-root" not in argv:  # the operator's lake root (its argument, the Variable, the environment)
        argv = [*argv, "--lake-root", lake_root]
    try:
        args = build_parser().parse_args(list(argv))
        config = build_config(args, args.run_id or "lineage")
        checked = validate_report(config.report, registry.load(conn))
    except (ColdharborError, SystemExit, argparse.ArgumentError):
        return OperatorLineage()
    inputs = []
    try:
        for table in checked.read_tables:
            columns = registry.lake_columns(conn, table)
            inputs.append(postgres_dataset(dsn, table.schema_name, table.table_name,
                                           [(c.name, c.pg_type) for c in columns]))
            inputs.append(lake_dataset(table.lake_path(lake_root), [(c.name, c.lake_type.lower()) for c in columns]))
    except ColdharborError:  # the report will be refused for it
        return OperatorLineage()
    return OperatorLineage(inputs=inputs, outputs=[_report_output(dsn, lake_root, config.target, config.sink)])


def _report_output(dsn: str, lake_root: str, target: str | None, sink: str) -> Dataset:
    from coldharbor.serve import sinks
    from coldharbor.serve.report_spec import REPORTS_SCHEMA, target_name

    name = target_name(target or "")
    if sink == "delta":
        return lake_dataset(sinks.delta_path(lake_root, name))
    return postgres_dataset(dsn, REPORTS_SCHEMA, name)


def _option(argv: Sequence[str], flag: str) -> str | None:
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]
    return values[-1] if values else None

"""The lake on S3: a real MinIO server, the export as spark-submit runs it with hadoop-aws and the
s3a settings docker-compose.yaml gives, and the lake commit lock that S3 needs.

MinIO comes from `make minio` (built from the Go module proxy into data/minio); without it (no Go
toolchain) these tests are skipped and say so, except under CI, where they fail.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from coldharbor.runtime import pg, settings

from tests.helpers import dirty_ids, pg_rows, spark_submit_export

ACCESS_KEY, SECRET_KEY = "coldharbor", "minio-test-secret"
BUCKET = "coldharbor-lake"
HADOOP_AWS = "org.apache.hadoop:hadoop-aws:3.5.0"


def minio_binary() -> str | None:
    built = settings.DATA_DIR / "minio" / "minio"
    return str(built) if built.exists() else shutil.which("minio")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def minio(tmp_path_factory):
    binary = minio_binary()
    if binary is None:
        why = "no MinIO binary: `make minio` builds one (needs Go)"
        if os.environ.get("CI"):  # CI installs it (`make test`): a skip there would prove nothing
            pytest.fail(why)
        pytest.skip(why)
    port = free_port()
    env = {**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY}
    server = subprocess.Popen([binary, "server", str(tmp_path_factory.mktemp("minio")), "--address",
                               f"127.0.0.1:{port}", "--console-address", f"127.0.0.1:{free_port()}"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        import pyarrow.fs as pafs

        deadline = time.monotonic() + 60
        while True:
            try:
                pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, endpoint_override=endpoint,
                                  scheme="http", region="us-east-1", allow_bucket_creation=True).create_dir(BUCKET)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.5)
        yield endpoint
    finally:
        server.terminate()
        server.wait(30)


def s3_env(endpoint: str) -> dict[str, str]:
    """What docker-compose.yaml gives the jobs: credentials and hadoop-aws through the environment."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "COLDHARBOR_EXTRA_PACKAGES": HADOOP_AWS}


def s3a_args(endpoint: str) -> list[str]:
    return ["--conf", f"spark.hadoop.fs.s3a.endpoint={endpoint}", "--conf", "spark.hadoop.fs.s3a.endpoint.region=us-east-1",
            "--conf", "spark.hadoop.fs.s3a.path.style.access=true",
            "--conf", "spark.hadoop.fs.s3a.connection.ssl.enabled=false"]


def submit_export(dsn: str, lake_root: str, table: str, endpoint: str, log_file: Path | None = None):
    return spark_submit_export(dsn, lake_root, "--table", table, env=s3_env(endpoint), log_file=log_file,
                               spark_args=s3a_args(endpoint))


def lake_live_rows(path: str, endpoint: str, monkeypatch) -> dict:
    """Live rows of the lake table read with deltalake (as the health page reads S3), no Spark."""
    from deltalake import DeltaTable

    for key, value in s3_env(endpoint).items():
        monkeypatch.setenv(key, value)
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    latest: dict = {}
    for row in sorted(rows, key=lambda r: (r["_ch_seq"], r["_ch_batch_id"])):
        latest[(row["id"],)] = row
    return {k: {"id": r["id"], "v": r["v"]} for k, r in latest.items() if not r["_ch_deleted"]}


def test_export_to_s3a_round_trips_and_waits_for_the_lake_commit_lock(minio, pg_dsn, pg_conn, table_name,
                                                                      tmp_path, monkeypatch):
    monkeypatch.delenv("COLDHARBOR_LAKE_COMMIT_LOCK", raising=False)  # auto: on for s3a
    lake_root = f"s3a://{BUCKET}/lake-{table_name}"
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'v' || g FROM generate_series(1, 200) g")
    first = submit_export(pg_dsn, lake_root, table_name, minio)
    assert first.returncode == 0, first.stdout[-4000:]
    path = f"{lake_root}/public/{table_name}"
    assert lake_live_rows(path, minio, monkeypatch) == pg_rows(pg_conn, f"SELECT id, v FROM {table_name}", ["id"])

    # A second export while another job holds the table's lake commit lock: it writes its files,
    # then waits, and commits once the lock is released.
    pg_conn.execute(f"UPDATE {table_name} SET v = 'second' WHERE id <= 20")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id > 190")
    [table_id] = pg_conn.execute("SELECT table_id FROM coldharbor.tables WHERE table_name = %s",
                                 (table_name,)).fetchone()
    log_file = tmp_path / "export.log"
    with pg.connect(pg_dsn) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", (pg.LOCK_NAMESPACES["lake_commit"], table_id))
        job = submit_export(pg_dsn, lake_root, table_name, minio, log_file=log_file)
        deadline = time.monotonic() + 300
        while "waiting for the lake commit lock" not in log_file.read_text():
            assert job.poll() is None, f"the export finished without waiting:\n{log_file.read_text()[-4000:]}"
            assert time.monotonic() < deadline, "the export never reached the lake commit lock"
            time.sleep(0.5)
        assert len(dirty_ids(pg_conn, table_name)) == 30, "nothing is marked while the lock is held"
        holder.execute("SELECT pg_advisory_unlock(%s, %s)", (pg.LOCK_NAMESPACES["lake_commit"], table_id))
    assert job.wait(300) == 0, log_file.read_text()[-4000:]
    assert dirty_ids(pg_conn, table_name) == []
    assert lake_live_rows(path, minio, monkeypatch) == pg_rows(pg_conn, f"SELECT id, v FROM {table_name}", ["id"])


def test_the_jobs_own_lake_files_round_trip_on_s3(minio, monkeypatch, table_name):
    """What the jobs read and write from Python (lake_store: the registry copy, the write probe, a
    killed export's leftover, the listing purge verifies) works on s3a with the AWS_* settings."""
    from datetime import datetime, timedelta, timezone

    from coldharbor.lake import lake_store

    for key, value in s3_env(minio).items():
        monkeypatch.setenv(key, value)
    root = f"s3a://{BUCKET}/files-{table_name}"
    registry_copy = f"{root}/_coldharbor/registry.json"
    assert lake_store.read_text(registry_copy) is None
    for text in ('{"a": "x\'y 日本"}', '{"b": 2}'):
        lake_store.write_text(registry_copy, text)
        assert lake_store.read_text(registry_copy) == text
    table = f"{root}/public/{table_name}"
    lake_store.probe_writable(table, "_coldharbor_write_probe")
    assert not lake_store.is_delta_table(table) and lake_store.data_files(table) == []

    fs, where = lake_store.filesystem(table)
    for name, body in (("_coldharbor_write_probe", b""), ("region=eu%27x/part-0.parquet", b"PAR1"),
                       ("region=eu%27x/part-1.parquet", b""), ("_delta_log/00000000000000000000.json", b"{}")):
        with fs.open_output_stream(f"{where}/{name}") as out:
            out.write(body)
    assert lake_store.data_files(table) == [f"{table}/region=eu%27x/part-0.parquet"]
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    assert lake_store.remove_if_older(table, "_coldharbor_write_probe", later - timedelta(days=1), False) is None
    assert lake_store.remove_if_older(table, "_coldharbor_write_probe", later, True) is not None
    assert lake_store.remove_if_older(table, "_coldharbor_write_probe", later, False) == \
        f"{table}/_coldharbor_write_probe"
    assert lake_store.remove_if_older(table, "_coldharbor_write_probe", later, False) is None

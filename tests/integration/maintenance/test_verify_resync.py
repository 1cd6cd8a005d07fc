"""verify finds every way the lake can drift from PostgreSQL; resync repairs it (real PostgreSQL and Spark + Delta)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from coldharbor.capture import registry
from coldharbor.export import export_job as export_job
from coldharbor.lake import delta
from coldharbor.maintenance import resync, verify
from coldharbor.runtime import pg
from coldharbor.runtime.errors import TableBusyError
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from tests.helpers import dirty_ids, export, lake_live, pg_rows, report_run, serve_report

DDL = "id bigint PRIMARY KEY, customer text, amount numeric(12,2), status text"


def loaded_table(spark, dsn, conn, name: str, lake_root: str, rows: int = 3000) -> str:
    """A table registered with rows, loaded, changed and exported, with a few changes still dirty."""
    conn.execute(f"CREATE TABLE {name} ({DDL})")
    conn.execute(f"INSERT INTO {name} SELECT g, 'c' || (g % 13), g * 0.5, 'new' FROM generate_series(1, {rows}) g")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    conn.execute(f"UPDATE {name} SET status = 'paid' WHERE id % 10 = 0")
    export(spark, dsn, name, lake_root)
    conn.execute(f"UPDATE {name} SET status = 'dirty' WHERE id % 100 = 1")
    conn.execute(f"DELETE FROM {name} WHERE id % 100 = 2")
    return f"{lake_root}/public/{name}"


def run_verify(spark, dsn, name: str, lake_root: str, chunks: int = 8) -> verify.VerifyResult:
    with pg.connect(dsn) as conn:
        [table] = registry.load(conn, name)
        config = verify.VerifyConfig(name, lake_root, chunks, "test-verify")
        return verify.verify_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table, config)


def run_resync(spark, dsn, name: str, lake_root: str):
    with pg.connect(dsn) as conn:
        [table] = registry.load(conn, name)
        return resync.resync_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table,
                                   resync.ResyncConfig(name, lake_root, "test-resync"))


def test_a_table_with_dirty_changes_is_in_sync(spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, capsys):
    loaded_table(spark, pg_dsn, pg_conn, table_name, lake_root)
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert verify.main(["--table", table_name, "--lake-root", lake_root, "--chunks", "5"]) == 0
    count = pg_conn.execute(f"SELECT count(*) FROM {table_name}").fetchone()[0]
    assert f"public.{table_name} in sync: {count} rows in 5 chunks" in capsys.readouterr().out
    last = pg_conn.execute("SELECT state, detail->>'result' FROM coldharbor.maintenance_runs "
                           "WHERE kind = 'verify' ORDER BY started_at DESC LIMIT 1").fetchone()
    assert last == ("succeeded", "in sync")


def delete_row(spark, path: str) -> None:
    DeltaTable.forPath(spark, path).delete("id = 1234")


def change_row(spark, path: str) -> None:
    DeltaTable.forPath(spark, path).update("id = 2345", {"status": F.lit("tampered")})


def add_row(spark, path: str) -> None:
    rows = spark.read.format("delta").load(path).filter("id = 5").withColumn("id", F.lit(99999).cast("long"))
    rows.write.format("delta").mode("append").save(path)


@pytest.mark.parametrize("edit,problem", [
    (delete_row, "missing from the lake view"),
    (change_row, "different values"),
    (add_row, "not in PostgreSQL"),
], ids=["row-deleted-from-lake", "row-changed-in-lake", "row-added-to-lake"])
def test_verify_finds_a_lake_edited_by_hand_and_resync_repairs_it(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                  edit, problem):
    path = loaded_table(spark, pg_dsn, pg_conn, table_name, lake_root)
    edit(spark, path)

    found = run_verify(spark, pg_dsn, table_name, lake_root)
    assert not found.in_sync and len(found.differing) == 1
    assert len(found.samples) == 1 and problem in found.samples[0]["problem"], found.samples
    assert "NOT in sync" in found.summary()

    run_resync(spark, pg_dsn, table_name, lake_root)
    assert run_verify(spark, pg_dsn, table_name, lake_root).in_sync
    export(spark, pg_dsn, table_name, lake_root)
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])


def test_verify_finds_a_dirty_change_marked_flushed_by_hand(spark, pg_dsn, pg_conn, table_name, lake_root):
    loaded_table(spark, pg_dsn, pg_conn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET amount = -7 WHERE id = 777")
    pg_conn.execute("""UPDATE coldharbor.change_log SET flushed_at = now(), lake_version = 0
                        WHERE flushed_at IS NULL AND key = jsonb_build_object('id', 777::bigint)""")
    found = run_verify(spark, pg_dsn, table_name, lake_root)
    assert [s["key"] for s in found.samples] == ["(id=777)"]
    run_resync(spark, pg_dsn, table_name, lake_root)
    assert run_verify(spark, pg_dsn, table_name, lake_root).in_sync


def test_text_keys_are_chunked_by_hash_and_still_compared(spark, pg_dsn, pg_conn, table_name, lake_root):
    pg_conn.execute(f"CREATE TABLE {table_name} (code text, region text, n integer, PRIMARY KEY (code, region))")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT md5(g::text), 'r' || (g % 4), g FROM generate_series(1, 800) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    export(spark, pg_dsn, table_name, lake_root)
    assert run_verify(spark, pg_dsn, table_name, lake_root, chunks=7).in_sync
    DeltaTable.forPath(spark, f"{lake_root}/public/{table_name}").update("n = 17", {"n": F.lit(-1)})
    found = run_verify(spark, pg_dsn, table_name, lake_root, chunks=7)
    assert len(found.samples) == 1 and "code=" in found.samples[0]["key"]


def test_resync_keeps_earlier_versions_for_as_of_reports(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                        monkeypatch):
    loaded_table(spark, pg_dsn, pg_conn, table_name, lake_root, rows=500)
    export(spark, pg_dsn, table_name, lake_root)
    before = datetime.now(timezone.utc)
    old_total = pg_conn.execute(f"SELECT sum(amount) FROM {table_name}").fetchone()[0]
    pg_conn.execute(f"UPDATE {table_name} SET amount = amount + 1000 WHERE id <= 50")
    export(spark, pg_dsn, table_name, lake_root)
    run_resync(spark, pg_dsn, table_name, lake_root)

    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT sum(amount) AS total FROM {table_name}",
                        "--target", "adhoc_resync_as_of", "--as-of", before.isoformat()) == 0
    assert pg_conn.execute("SELECT total FROM reports.adhoc_resync_as_of").fetchone()[0] == old_total
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT sum(amount) AS total FROM {table_name}",
                        "--target", "adhoc_resync_now") == 0
    assert pg_conn.execute("SELECT total FROM reports.adhoc_resync_now").fetchone()[0] == \
        pg_conn.execute(f"SELECT sum(amount) FROM {table_name}").fetchone()[0]


def test_a_lake_moved_aside_and_written_again_starts_as_of_history_at_its_new_base(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog):
    """The export's own advice for a lake that no longer matches: move it aside, write it whole again.
    Changes alone must not start the new lake; once the resync's base did, an as-of instant before it
    is refused (the lake there now knows nothing earlier) instead of answering with no rows."""
    name = table_name + ' "q\'s" ü'
    quoted = '"' + name.replace('"', '""') + '"'
    pg_conn.execute(f"CREATE TABLE {quoted} ({DDL})")
    pg_conn.execute(f"INSERT INTO {quoted} SELECT g, 'c', g * 0.5, 'new' FROM generate_series(1, 200) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (quoted,))
    export(spark, pg_dsn, f"public.{name}", lake_root)
    pg_conn.execute(f"UPDATE {quoted} SET status = 'paid' WHERE id <= 20")
    export(spark, pg_dsn, f"public.{name}", lake_root)
    between = pg_conn.execute("SELECT clock_timestamp()").fetchone()[0]
    path = Path(lake_root) / "public" / name
    path.rename(path.with_name("moved aside"))
    pg_conn.execute(f"UPDATE {quoted} SET status = 'late' WHERE id = 3")

    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert export_job.main(["--table", f"public.{name}", "--lake-root", lake_root]) == 2
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert f"there is no lake table of public.{quoted} at {path}" in line
    assert "jobs/resync.py --table 'public." + name.replace("'", "'\"'\"'") + "'" in line
    assert not path.exists()  # nothing written

    run_resync(spark, pg_dsn, f"public.{name}", lake_root)
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status == "exported"  # the change dirty since
    [table] = registry.load(pg_conn, f"public.{name}")
    base_at = pg_conn.execute("SELECT loaded_at FROM coldharbor.tables WHERE table_id = %s",
                              (table.table_id,)).fetchone()[0]
    assert base_at > between
    query = f"SELECT count(*) AS n, min(status) AS s FROM public.`{name}`"
    run_id = f"moved-{table.table_id}"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", query, "--target", "adhoc_moved",
                        "--as-of", between.isoformat(), "--run-id", run_id) == 2
    assert "the lake knows nothing earlier" in report_run(pg_conn, run_id)["error"]
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", query, "--target", "adhoc_moved", "--as-of",
                        pg_conn.execute("SELECT clock_timestamp()").fetchone()[0].isoformat()) == 0
    assert pg_conn.execute("SELECT n, s FROM reports.adhoc_moved").fetchone() == (200, "late")


def take_backup(conn, name: str) -> dict:
    """What a backup of PostgreSQL holds of the table: its rows, its change_log (ids and which are
    dirty), its batch counter."""
    conn.execute(f"CREATE TABLE {name}_backup AS SELECT * FROM {name}")
    [table] = registry.load(conn, name)
    return {"table_id": table.table_id,
            "last_batch_id": conn.execute("SELECT last_batch_id FROM coldharbor.tables WHERE table_id = %s",
                                          (table.table_id,)).fetchone()[0],
            "last_change": conn.execute("SELECT max(id) FROM coldharbor.change_log WHERE table_id = %s",
                                        (table.table_id,)).fetchone()[0],
            "dirty": dirty_ids(conn, name)}


def restore_backup(conn, name: str, backup: dict) -> None:
    """Puts the table and its coldharbor rows back as the backup held them (no trigger fires: a
    restore does not capture), while the lake keeps every later commit."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(f"DELETE FROM {name}")
        conn.execute(f"INSERT INTO {name} SELECT * FROM {name}_backup")
        conn.execute("DELETE FROM coldharbor.change_log WHERE table_id = %s AND id > %s",
                     (backup["table_id"], backup["last_change"]))
        conn.execute("UPDATE coldharbor.change_log SET flushed_at = NULL, lake_version = NULL "
                     "WHERE table_id = %s AND id = ANY(%s)", (backup["table_id"], backup["dirty"]))
        conn.execute("DELETE FROM coldharbor.export_batches WHERE table_id = %s AND batch_id > %s",
                     (backup["table_id"], backup["last_batch_id"]))
        conn.execute("UPDATE coldharbor.tables SET last_batch_id = %s WHERE table_id = %s",
                     (backup["last_batch_id"], backup["table_id"]))


def test_an_export_after_postgresql_was_restored_from_a_backup_is_refused_until_resync(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog):
    path = loaded_table(spark, pg_dsn, pg_conn, table_name, lake_root, rows=300)
    backup = take_backup(pg_conn, table_name)  # with dirty changes of its own
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET amount = amount + 1 WHERE id <= 40")
    export(spark, pg_dsn, table_name, lake_root)  # the lake moves two batches past the backup
    restore_backup(pg_conn, table_name, backup)
    pg_conn.execute(f"UPDATE {table_name} SET status = 'after-restore' WHERE id > 250")
    dirty = dirty_ids(pg_conn, table_name)
    version = delta.pin_version(spark, path)

    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    for _ in range(3):  # a refused run used up a batch id: the third, past the lake's, went through
        assert export_job.main(["--table", table_name, "--lake-root", lake_root]) == 2
    assert "PostgreSQL is behind the lake" in caplog.text
    assert f"jobs/resync.py --table public.{table_name}" in caplog.text
    assert dirty_ids(pg_conn, table_name) == dirty  # nothing marked flushed
    assert delta.pin_version(spark, path) == version  # nothing written
    caplog.clear()
    assert verify.main(["--table", table_name, "--lake-root", lake_root]) == 2
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert f"public.{table_name} cannot be verified: the lake is ahead of PostgreSQL" in line, line
    assert f"`jobs/resync.py --table public.{table_name}`" in line

    run_resync(spark, pg_dsn, table_name, lake_root)
    assert run_verify(spark, pg_dsn, table_name, lake_root).in_sync
    pg_conn.execute(f"UPDATE {table_name} SET amount = -1 WHERE id = 7")
    assert export(spark, pg_dsn, table_name, lake_root).status == "exported"
    assert dirty_ids(pg_conn, table_name) == []
    assert run_verify(spark, pg_dsn, table_name, lake_root).in_sync


def restored_after_two_exports(spark, dsn: str, conn, name: str, lake_root: str) -> None:
    """The table exported, backed up, exported twice more, then restored from the backup and changed."""
    backup = take_backup(conn, name)
    export(spark, dsn, name, lake_root)
    conn.execute(f"UPDATE {name} SET amount = amount + 1 WHERE id <= 40")
    export(spark, dsn, name, lake_root)
    restore_backup(conn, name, backup)
    conn.execute(f"UPDATE {name} SET status = 'after-restore' WHERE id > 250")


def test_reports_after_postgresql_was_restored_equal_postgresql_until_resync(spark, pg_dsn, pg_conn, table_name,
                                                                            lake_root, monkeypatch, caplog):
    """The lake's later commits are not PostgreSQL's past any more: a report that read them served
    amounts PostgreSQL no longer holds. It is served from PostgreSQL alone until a resync, and says so."""
    loaded_table(spark, pg_dsn, pg_conn, table_name, lake_root, rows=300)
    other = f"{table_name}_other"
    loaded_table(spark, pg_dsn, pg_conn, other, lake_root, rows=100)
    restored_after_two_exports(spark, pg_dsn, pg_conn, table_name, lake_root)
    query = (f"SELECT t.id, t.customer, t.amount, t.status, o.amount AS other FROM {table_name} t "
             f"LEFT JOIN {other} o ON o.id = t.id")
    expected = pg_rows(pg_conn, query, ["id"])

    run_id = f"restored-{table_name}"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", query, "--target", f"adhoc_{table_name}",
                        "--run-id", run_id) == 0
    assert pg_rows(pg_conn, f"SELECT * FROM reports.adhoc_{table_name}", ["id"]) == expected
    assert report_run(pg_conn, run_id)["served_from_postgres"] == [f"public.{table_name}"]
    assert f"jobs/resync.py --table public.{table_name}" in caplog.text
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", query, "--target", f"adhoc_{table_name}",
                        "--as-of", datetime.now(timezone.utc).isoformat(), "--run-id", f"{run_id}-as-of") == 2
    assert "PostgreSQL is behind the lake" in report_run(pg_conn, f"{run_id}-as-of")["error"]

    run_resync(spark, pg_dsn, table_name, lake_root)
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", query, "--target", f"adhoc_{table_name}",
                        "--run-id", f"{run_id}-resynced") == 0
    assert pg_rows(pg_conn, f"SELECT * FROM reports.adhoc_{table_name}", ["id"]) == expected
    assert report_run(pg_conn, f"{run_id}-resynced")["served_from_postgres"] is None


def test_a_report_over_a_tiered_table_restored_from_a_backup_is_refused(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                       monkeypatch, caplog):
    """Rows evicted from a tiered table live in the lake alone: PostgreSQL alone is not the table."""
    pg_conn.execute(f"CREATE TABLE {table_name} ({DDL})")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'c', g, 'new' FROM generate_series(1, 300) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 hour')", (table_name,))
    export(spark, pg_dsn, table_name, lake_root)
    restored_after_two_exports(spark, pg_dsn, pg_conn, table_name, lake_root)
    run_id = f"restored-tiered-{table_name}"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT sum(amount) AS total FROM {table_name}",
                        "--target", f"adhoc_{table_name}", "--run-id", run_id) == 2
    error = report_run(pg_conn, run_id)["error"]
    assert error.startswith(f"PostgreSQL is behind the lake for public.{table_name}") and "evicted" in error
    assert f"jobs/resync.py --table public.{table_name}" in error and "Traceback" not in caplog.text
    assert pg_conn.execute("SELECT to_regclass(%s)", (f"reports.adhoc_{table_name}",)).fetchone()[0] is None


def test_resync_while_the_table_is_exported_changes_nothing(spark, pg_dsn, pg_conn, table_name, lake_root):
    loaded_table(spark, pg_dsn, pg_conn, table_name, lake_root, rows=100)
    [table] = registry.load(pg_conn, table_name)
    with pg.connect(pg_dsn) as holder, pg.advisory_lock(holder, "export", table.table_id):
        with pytest.raises(TableBusyError, match="being exported or compacted"):
            run_resync(spark, pg_dsn, table_name, lake_root)
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.export_batches WHERE table_id = %s AND kind = 'resync'",
                           (table.table_id,)).fetchone()[0] == 0


def test_resync_of_a_lake_whose_file_was_removed_by_hand_is_one_line_and_records_nothing(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog, tmp_path):
    """Found by an outside attack: a traceback (exit 1) and a pending intent left behind. The base
    cannot outrank rows it cannot read: one line saying to move the folder aside, then it works."""
    path = loaded_table(spark, pg_dsn, pg_conn, table_name, lake_root)
    [table] = registry.load(pg_conn, table_name)
    removed = sorted(Path(path).glob("*.parquet"))[0]
    removed.rename(tmp_path / removed.name)
    intents = "SELECT count(*) FROM coldharbor.export_batches WHERE table_id = %s AND state = 'pending'"
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    caplog.clear()
    assert resync.main(["--table", table_name, "--lake-root", lake_root]) == 2
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert f"files of the lake table of public.{table_name} at {path} are gone" in line, line
    assert "move that folder aside" in line and "\n" not in line and "Traceback" not in caplog.text
    assert pg_conn.execute(intents, (table.table_id,)).fetchone()[0] == 0

    Path(path).rename(tmp_path / "aside")
    assert resync.main(["--table", table_name, "--lake-root", lake_root]) == 0
    assert run_verify(spark, pg_dsn, table_name, lake_root).in_sync


@pytest.mark.parametrize("job", [verify, resync], ids=["verify", "resync"])
def test_an_unregistered_table_is_refused_with_exit_2(pg_dsn, lake_root, monkeypatch, caplog, job):
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert job.main(["--table", "public.no_such_table", "--lake-root", lake_root]) == 2
    assert "public.no_such_table is not registered" in caplog.text


def test_verify_before_the_initial_load_is_refused(spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog):
    pg_conn.execute(f"CREATE TABLE {table_name} ({DDL})")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a', 1, 'new')")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert verify.main(["--table", table_name, "--lake-root", lake_root]) == 2
    assert "initial load has not landed" in caplog.text


def test_a_tiered_table_with_evicted_rows_verifies_and_resync_keeps_them(spark, pg_dsn, pg_conn, table_name,
                                                                         lake_root, monkeypatch):
    """Evicted rows live in the lake alone: verify compares the keys PostgreSQL holds, and resync
    (which rebuilds the lake from PostgreSQL) must not mark them deleted; a captured delete still
    reaches the lake."""
    pg_conn.execute(f"CREATE TABLE {table_name} (k int PRIMARY KEY, v text)")
    table_id = pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 hour')",
                               (table_name,)).fetchone()[0]
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'cold'), (2, 'hot'), (3, 'gone')")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute("UPDATE coldharbor.change_log SET created_at = created_at - interval '2 hours', "
                    "flushed_at = flushed_at - interval '2 hours' WHERE table_id = %s", (table_id,))
    pg_conn.execute(f"UPDATE {table_name} SET v = 'hot2' WHERE k = 2")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE k = 3")
    evicted = pg_conn.execute("SELECT coldharbor.evict(%s, now() - interval '1 hour')", (table_id,)).fetchone()[0]
    assert evicted == 1 and pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["k"]) == {(2,): {"k": 2, "v": "hot2"}}
    assert run_verify(spark, pg_dsn, table_name, lake_root).in_sync

    run_resync(spark, pg_dsn, table_name, lake_root)
    export(spark, pg_dsn, table_name, lake_root)
    assert run_verify(spark, pg_dsn, table_name, lake_root).in_sync
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT k, v FROM {table_name}",
                        "--target", f"adhoc_{table_name}", "--run-id", f"{table_name}-r") == 0
    served = sorted(pg_conn.execute(f"SELECT k, v FROM reports.adhoc_{table_name}").fetchall())
    assert served == [(1, "cold"), (2, "hot2")]

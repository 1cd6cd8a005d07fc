"""A job killed over Spark Connect does not take its work with it: the server carries a write whose
client is gone to its end. The write is held there (the task that killed the client waits for a
resume) while the next jobs run, then let go; whatever it does then must change nothing they
decided: no purged row comes back, no row is doubled, nothing marked flushed that the lake lacks."""

from __future__ import annotations

import json
import time

from coldharbor.capture import registry
from coldharbor.lake import lake_store

from tests.connect_server import run_job
from tests.consistency.test_connect_server_kill import REGIONS, assert_converged, change, make_table, ok
from tests.helpers import wait_until_paused

SETTLE_TIMEOUT_S = 300


def pending_batch(conn, table_id: int) -> int:
    [(batch_id,)] = conn.execute("SELECT batch_id FROM coldharbor.export_batches WHERE table_id = %s "
                                 "AND state = 'pending'", (table_id,)).fetchall()
    return batch_id


def settled(path: str, batch_id: int) -> str:
    """Waits until the lake's history says batch `batch_id` landed or can no longer land (a fence
    recorded it): "committed" or "fenced". A write the test let go ends in one or the other."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        for entry in lake_store.history(path, 20) or []:
            meta = json.loads(entry.get("userMetadata") or "{}")
            if meta.get("batch_id") == batch_id:
                return "committed"
            if meta.get("fenced_batch_id") == batch_id:
                return "fenced"
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} neither landed nor was fenced within {SETTLE_TIMEOUT_S} s")


def test_a_purge_while_a_dead_exports_write_goes_on(connect_url, connect_spark, pg_dsn, pg_conn, table_name,
                                                    lake_root, tmp_path):
    """The export dies inside its Delta write of rows the purge then erases; the write, let go after
    the purge, must not bring them back into the lake."""
    make_table(pg_conn, table_name)
    ok(run_job("cdc_export.py", connect_url, pg_dsn, lake_root, "--table", table_name))
    change(pg_conn, table_name, 2)  # dirty images of every region, the purged one among them
    pause = tmp_path / "pause"
    pause.mkdir()
    killed = run_job("cdc_export.py", connect_url, pg_dsn, lake_root, "--table", table_name,
                     env={"COLDHARBOR_CRASH_AT": "during_write", "COLDHARBOR_PAUSE_AT": "during_write",
                          "COLDHARBOR_PAUSE_DIR": str(pause)})
    assert killed.returncode == -9, killed.stderr[-3000:]
    wait_until_paused(pause, "during_write", _Ended())  # the server's task: the write goes on, held
    [table] = registry.load(pg_conn, f"public.{table_name}")
    batch_id = pending_batch(pg_conn, table.table_id)
    purged = REGIONS[0]
    ok(run_job("purge.py", connect_url, pg_dsn, lake_root, "--table", table_name, "--where",
               f"region = '{purged.replace(chr(39), chr(39) * 2)}'", "--vacuum-retention-hours", "0",
               "--allow-short-retention"))

    (pause / "during_write.resume").write_text("go")
    print(f"the dead export's batch {batch_id}: {settled(table.lake_path(lake_root), batch_id)}")
    ok(run_job("cdc_export.py", connect_url, pg_dsn, lake_root, "--table", table_name))
    assert pg_conn.execute(f"SELECT count(*) FROM {table_name} WHERE region = %s", (purged,)).fetchone() == (0,)
    assert_converged(connect_spark, pg_conn, table_name, lake_root)  # the purged region's rows included


class _Ended:
    """A stand-in process for wait_until_paused: the job that reaches the point is already dead."""

    @staticmethod
    def poll() -> None:
        return None

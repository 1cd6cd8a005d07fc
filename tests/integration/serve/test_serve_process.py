"""serve_report.py as production runs it: through spark-submit, with a shipped report file."""

from __future__ import annotations

import subprocess
import sys

from coldharbor.embedded import stack

from tests.helpers import PROJECT, export, report_run, spark_submit


def test_help_documents_the_job():
    out = subprocess.run([sys.executable, str(PROJECT / "jobs" / "serve_report.py"), "--help"],
                         capture_output=True, text=True, env={"PYTHONPATH": str(PROJECT / "jobs")}, check=True).stdout
    for option in ("--report", "--sql", "--target", "--sink", "--param", "--mode", "--as-of"):
        assert option in out


def test_a_shipped_report_runs_under_spark_submit(spark, pg_dsn, admin_dsn, pg_conn, lake_root):
    stack.demo(admin_dsn, "demo-password", rows=500)  # demo_orders, registered, with inserts, updates and deletes
    export(spark, pg_dsn, "public.demo_orders", lake_root)
    pg_conn.execute("UPDATE demo_orders SET status = 'refunded' WHERE order_id % 10 = 1")  # dirty again
    done = spark_submit("serve_report.py", pg_dsn, lake_root, "--report", "demo_orders_by_status",
                        "--param", "min_amount=0", "--run-id", "submitted-1")
    assert done.returncode == 0, done.stdout[-3000:]
    expected = pg_conn.execute("""SELECT status, count(*), sum(amount) FROM demo_orders
                                  GROUP BY status ORDER BY status""").fetchall()
    served = pg_conn.execute("""SELECT status, orders, revenue FROM reports.demo_orders_by_status
                                ORDER BY status""").fetchall()
    assert served == expected
    run = report_run(pg_conn, "submitted-1")
    assert run["state"] == "succeeded" and run["dirty_rows"]["public.demo_orders"] > 0

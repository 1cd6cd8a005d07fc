"""Randomized workloads against real PostgreSQL and real Spark + Delta, checked against the model.

A seed fixes the whole sequence: every choice is drawn from `random.Random(seed)` over state that
the same sequence makes the same (keys are chosen from the model and from PostgreSQL read in key
order; a writer "committing while an export runs" commits at a named point of the export, through
the export's hook, not on a timer). A failure raises `Violation` naming the seed, the step and the
steps that led there, so `run_sequence(seed, ...)` reproduces it.

The table is registered empty or already holding rows (then its initial load comes first, and
writers may commit inside it). Steps: inserts, updates, deletes, delete-then-reinsert, primary-key changes, bulk statements, a
transaction held open across later steps, export (optionally with a writer committing inside it),
compaction, cleanup (eviction, VACUUM, pruning), purge, reports now and as of a past instant, and
crashes: the job runs under spark-submit with COLDHARBOR_CRASH_AT=<point> and must die there by
SIGKILL (a point never reached is an error, not a pass); the next run must recover.

With `connect_url` every job runs as a client of that Spark Connect server instead: the crashed job
is `python jobs/<job>.py` killed at the point (inside a Spark task, the task kills the client, and
the server carries the orphaned write to its end), and every other step, recovery included, runs
on the Connect session given as `spark`. The server goes on after a client dies, so before the
recovery the harness waits for what the dead client left running there (a write inside which it
was killed, a VACUUM) to end: the next run then meets a settled lake, and a seed replays the same.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import psycopg
from coldharbor.capture import registry
from coldharbor.lake import lake_store
from coldharbor.maintenance import cleanup, compaction, compaction_plan, purge
from coldharbor.runtime import pg
from psycopg import sql

from tests.connect_server import run_job
from tests.consistency.model import Model
from tests.helpers import export, lake_live, spark_submit

# Application sessions as different as settings make a key's text (the jobs pin their own).
APP_SETTINGS = ({"TimeZone": "UTC", "bytea_output": "hex", "DateStyle": "ISO, MDY"},
                {"TimeZone": "Pacific/Chatham", "bytea_output": "escape", "DateStyle": "SQL, DMY"})
KEYS = range(1, 41)  # a small key space, so keys collide, die and come back
# Crash points, each with the job that reaches it.
CRASH_POINTS = {
    "load_after_snapshot": "cdc_export.py",
    "load_during_write": "cdc_export.py",
    "load_after_commit": "cdc_export.py",
    "after_read": "cdc_export.py",
    "during_write": "cdc_export.py",
    "after_commit": "cdc_export.py",
    "during_mark": "cdc_export.py",
    "compact_during_write": "compact.py",
    "during_vacuum": "cleanup.py",
    "rebase_after_snapshot": "cdc_export.py",  # the base after DDL that rewrote the table (sql/migrations/014)
}
TASK_POINTS = ("during_write", "compact_during_write", "load_during_write")
# Reachable only while the table's initial load is pending: the sequence opens with them.
LOAD_POINTS = ("load_after_snapshot", "load_during_write", "load_after_commit")
EXPORT_HOOK_POINTS = ("load_after_intent", "load_after_snapshot", "after_read", "after_intent", "after_commit",
                      "after_mark")
WRITE_STEPS = ("insert", "update", "delete", "delete_reinsert", "pk_change", "bulk_update", "bulk_delete",
               "bulk_insert")
# What a job killed over Spark Connect left running on the server, by crash point: the history
# entry that shows it ended (None: any new commit). Points not listed leave nothing running.
ORPHANS = {**{point: None for point in TASK_POINTS}, "during_vacuum": "VACUUM END"}
ORPHAN_TIMEOUT_S = 300
# The incremental report a sequence with `incremental` compares with its full recompute.
INCREMENTAL_REPORT = ("SELECT id % 4 AS g, count(*) AS n, count(v) AS vs, sum(id) AS ids, avg(id) AS mean, "
                      "min(v) AS low, max(id) AS high FROM {table} WHERE id % 5 <> 2 GROUP BY id % 4")
# Relative weights of the steps drawn at random.
WEIGHTS = {"insert": 6, "update": 6, "delete": 4, "delete_reinsert": 2, "pk_change": 2, "bulk_update": 2,
           "bulk_delete": 1, "bulk_insert": 2, "hold_open": 2, "export": 6, "export_with_writer": 3,
           "compact": 2, "cleanup": 2, "purge": 1, "report": 3, "report_as_of": 3}


class Violation(AssertionError):
    """The system disagreed with the model."""


class CrashPointNotReached(RuntimeError):
    """A named crash point the job never reached: a test error, never a pass."""


class OrphanNotSettled(RuntimeError):
    """What a killed Connect client left running on the server never ended: a test error."""


@dataclass
class Held:
    """A transaction left open across later steps; its keys are off-limits to other writers."""

    conn: psycopg.Connection
    writes: list[tuple[str, int, str | None]]
    keys: set[int]
    commit_after: int


@dataclass
class Run:
    seed: int
    spark: object
    dsn: str             # the jobs' login (coldharbor_pipeline)
    admin_dsn: str       # set-up's: the table, its registration and the application's writes
    lake_root: str
    rng: random.Random = field(init=False)
    model: Model = field(default_factory=Model)
    table: str = field(init=False)
    trace: list[str] = field(default_factory=list)
    held: Held | None = None
    counter: int = 0
    reports: int = 0
    incremental_refreshes: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    export_instants: list = field(default_factory=list)

    prefilled: bool | None = None  # None: the seed decides
    exact: bool | None = None      # p_history => 'exact' (sql/migrations/021); None: the seed decides
    connect_url: str | None = None  # the jobs run as clients of this Spark Connect server
    # A report refreshed incrementally (`-- refresh: incremental`) is compared with the same SQL
    # recomputed in full after every step; its table keeps exact history and no hot retention
    # (incremental refresh refuses a table with rows in the lake alone).
    incremental: bool = False

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.settings_rng = random.Random(-self.seed)  # its own stream: the seeds' steps stay as they were
        self.compaction_rng = random.Random(f"compaction modes {self.seed}")  # the same
        self.table = f"public.cs_{self.seed}_{uuid.uuid4().hex[:6]}"
        self.target = f"adhoc_cs_{self.table.split('.')[1]}"
        self.conn = self.app_connection(autocommit=True)
        # The model's key is id; the table's key is composite, with a timestamptz and a bytea column
        # derived from it, whose text varies with the writing session's settings (invariant 15).
        self.conn.execute(f"""CREATE TABLE {self.table} (
            id int, at timestamptz GENERATED ALWAYS AS (to_timestamp(id * 60.5)) STORED,
            raw bytea GENERATED ALWAYS AS (int4send(id)) STORED, v text, PRIMARY KEY (id, at, raw))""")
        if self.prefilled is None:
            self.prefilled = self.rng.random() < 0.5
        if self.prefilled:
            # Rows the table holds before it is registered: they reach the lake by its initial load.
            self.committed_write("bulk_insert")
            self.committed_write("insert")
        if self.exact is None:  # even seeds; no random draw: the seeds' steps stay as they were
            self.exact = self.seed % 2 == 0 or self.incremental
        # A hot retention of a millisecond: cleanup evicts every flushed, unchanged row.
        self.conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => %s::interval, p_history => %s)",
                          (self.table, None if self.incremental else "1 millisecond",
                           "exact" if self.exact else "latest"))
        self.saved_reports_dir = os.environ.get("COLDHARBOR_REPORTS_DIR")
        if self.incremental:
            self.incremental_report = f"inc_{self.table.split('.')[1]}"
            folder = Path(self.lake_root).parent / f"reports-{self.seed}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{self.incremental_report}.sql").write_text(
                f"-- refresh: incremental\n{INCREMENTAL_REPORT.format(table=self.table)}\n")
            os.environ["COLDHARBOR_REPORTS_DIR"] = str(folder)
            self.trace.append("an incremental report is compared with its full recompute after every step")
        if self.prefilled:
            self.trace.append("registered with rows")
        if self.exact:
            self.trace.append("registered with exact history: no as-of instant may be refused as a span")
        self.stamp()

    # -- bookkeeping --------------------------------------------------------------------------

    def app_connection(self, autocommit: bool) -> psycopg.Connection:
        """An application connection in one of two sets of session settings, chosen at random: the
        same key must stay one key whichever wrote it."""
        conn = pg.connect(self.admin_dsn, autocommit=autocommit)
        for name, value in self.settings_rng.choice(APP_SETTINGS).items():
            conn.execute(sql.SQL("SELECT set_config({}, {}, false)").format(sql.Literal(name), sql.Literal(value)))
        if not autocommit:
            conn.commit()
        return conn

    def value(self) -> str:
        self.counter += 1
        return f"s{self.seed}-{self.counter}"

    def stamp(self) -> None:
        """After a commit: record the model's state at PostgreSQL's clock."""
        self.model.stamp(self.now())

    def now(self):
        """PostgreSQL's clock, read in binary: psycopg parses no timestamptz text in the application
        session's DateStyle 'SQL, DMY'."""
        return self.conn.execute("SELECT clock_timestamp()", binary=True).fetchone()[0]

    def hot_keys(self) -> list[int]:
        """Keys PostgreSQL holds (evicted ones are only in the lake), minus the held transaction's."""
        held = self.held.keys if self.held else set()
        return [r[0] for r in self.conn.execute(f"SELECT id FROM {self.table} ORDER BY id") if r[0] not in held]

    def free_keys(self) -> list[int]:
        """Keys not in PostgreSQL and not touched by the held transaction (an evicted key is free:
        an insert of it is an upsert, as in the model)."""
        taken = set(self.hot_keys()) | (self.held.keys if self.held else set())
        return [k for k in KEYS if k not in taken]

    def fail(self, message: str) -> None:
        steps = "\n  ".join(self.trace[-40:])
        raise Violation(f"seed {self.seed}, step {len(self.trace)}: {message}\nlast steps:\n  {steps}")

    # -- writes ---------------------------------------------------------------------------------

    def write(self, kind: str, conn: psycopg.Connection | None = None) -> list[tuple[str, int, str | None]]:
        """One write step in its own transaction on `conn` (default: the main connection);
        returns the model writes it made, for the caller to apply once it commits."""
        conn = conn or self.conn
        hot, free, rng, t = self.hot_keys(), self.free_keys(), self.rng, self.table
        writes: list[tuple[str, int, str | None]] = []
        if kind == "insert" and free:
            for key in rng.sample(free, min(len(free), rng.randint(1, 3))):
                value = self.value()
                conn.execute(f"INSERT INTO {t} (id, v) VALUES (%s, %s)", (key, value))
                writes.append(("put", key, value))
        elif kind == "update" and hot:
            for key in rng.sample(hot, min(len(hot), rng.randint(1, 3))):
                value = self.value()
                conn.execute(f"UPDATE {t} SET v = %s WHERE id = %s", (value, key))
                writes.append(("put", key, value))
        elif kind == "delete" and hot:
            for key in rng.sample(hot, min(len(hot), rng.randint(1, 2))):
                conn.execute(f"DELETE FROM {t} WHERE id = %s", (key,))
                writes.append(("del", key, None))
        elif kind == "delete_reinsert" and hot:
            key, value = rng.choice(hot), self.value()
            conn.execute(f"DELETE FROM {t} WHERE id = %s", (key,))
            conn.execute(f"INSERT INTO {t} (id, v) VALUES (%s, %s)", (key, value))
            writes += [("del", key, None), ("put", key, value)]
        elif kind == "pk_change" and hot and free:
            old, new = rng.choice(hot), rng.choice(free)
            [value] = conn.execute(f"UPDATE {t} SET id = %s WHERE id = %s RETURNING v", (new, old)).fetchone()
            writes += [("del", old, None), ("put", new, value)]
        elif kind in ("bulk_update", "bulk_delete") and hot:
            modulus = rng.randint(2, 4)
            residue = rng.randrange(modulus)
            chosen = [k for k in hot if k % modulus == residue]
            if kind == "bulk_update":
                value = self.value()
                conn.execute(f"UPDATE {t} SET v = %s || '-' || id WHERE id = ANY(%s)", (value, chosen))
                writes += [("put", k, f"{value}-{k}") for k in chosen]
            else:
                conn.execute(f"DELETE FROM {t} WHERE id = ANY(%s)", (chosen,))
                writes += [("del", k, None) for k in chosen]
        elif kind == "bulk_insert" and free:
            chosen = sorted(rng.sample(free, min(len(free), rng.randint(3, 8))))
            value = self.value()
            conn.execute(f"INSERT INTO {t} (id, v) SELECT k, %s || '-' || k FROM unnest(%s::int[]) k", (value, chosen))
            writes += [("put", k, f"{value}-{k}") for k in chosen]
        return writes

    def committed_write(self, kind: str) -> None:
        with self.conn.transaction():
            writes = self.write(kind)
        self.model.apply(writes)
        self.stamp()
        self.trace.append(f"{kind}: {writes}")

    def hold_open(self, step: int) -> None:
        if self.held is not None:
            return
        conn = self.app_connection(autocommit=False)
        kind = self.rng.choice(("insert", "update", "delete", "bulk_update"))
        writes = self.write(kind, conn)
        self.held = Held(conn, writes, {k for _, k, _ in writes}, step + self.rng.randint(2, 6))
        self.trace.append(f"hold_open {kind}: {writes} (commits at step {self.held.commit_after})")

    def commit_held(self) -> None:
        if self.held is None:
            return
        self.held.conn.commit()
        self.held.conn.close()
        self.model.apply(self.held.writes)
        self.stamp()
        self.trace.append(f"commit held: {self.held.writes}")
        self.held = None

    # -- jobs -----------------------------------------------------------------------------------

    def export(self, writer_at: str | None = None) -> None:
        made: list[tuple[str, int, str | None]] = []
        kind = self.rng.choice(WRITE_STEPS) if writer_at else None

        def hook(point: str) -> None:
            if point == writer_at:
                with pg.connect(self.admin_dsn) as other, other.transaction():
                    made.extend(self.write(kind, other))

        result = export(self.spark, self.dsn, self.table, self.lake_root, hook)
        if made:
            self.model.apply(made)
            self.stamp()
        # An instant right after an export: as-of reports there are answerable unless a writer
        # committed inside it (the final as-of checks use these).
        self.export_instants.append(self.now())
        self.trace.append(f"export{f' with {kind} at {writer_at}' if writer_at else ''}: {result.status} "
                          f"batch {result.batch_id} rows {result.rows}{f' writer {made}' if made else ''}")

    def compact(self) -> None:
        """A compaction in one of its modes: the full rewrite, the merge of export files, or the
        DAG's choice between them (the share of exported rows decides; a full rewrite is due daily)."""
        mode = self.compaction_rng.choice(compaction_plan.MODES)
        config = compaction_plan.CompactionConfig(table=self.table, lake_root=self.lake_root, run_id=f"cs-{self.seed}",
                                             target_file_bytes=1024 * 1024, min_small_files=2, mode=mode,
                                             full_rewrite_fraction=0.5)
        with pg.connect(self.dsn) as conn:
            [table] = registry.load(conn, self.table)
            result = compaction.compact_table(self.spark, conn, table, config)
        self.trace.append(f"compact ({mode}): {result.status}")

    def cleanup(self) -> None:
        config = cleanup.CleanupConfig(table=self.table, lake_root=self.lake_root, run_id=f"cs-{self.seed}",
                                       retention=timedelta(0), allow_short_retention=True)
        with pg.connect(self.dsn) as conn:
            [table] = registry.load(conn, self.table)
            result = cleanup.cleanup_table(self.spark, conn, table, config)
        self.trace.append(f"cleanup: evicted {result.evicted_rows}, vacuumed {len(result.vacuumed_files)}, "
                          f"pruned {result.change_log_pruned}")

    def purge(self) -> None:
        """A purge by key range or, half the time, by value."""
        self.commit_held()  # its row locks would hold the purge's DELETE
        if self.rng.random() < 0.5:
            self.purge_range()
        else:
            self.purge_values()

    def purge_range(self) -> None:
        low = self.rng.choice(list(KEYS))
        high = low + self.rng.randint(0, 3)
        result = self.run_purge(f"id BETWEEN {low} AND {high}")
        self.model.purge(low, high)
        self.stamp()
        self.trace.append(f"purge {result.predicate}: {result.keys_purged} keys")

    def purge_values(self, values: list[str] | None = None) -> None:
        """By `values`, or by some values once written or a prefix of one."""
        where, matches = self.value_predicate(values)
        # Keys deleted in PostgreSQL but not yet in the lake, whose newest lake version matches:
        # the purge takes every version of them.
        also = [k for k, v in self.lake_live().items() if k not in self.model.rows and matches(v)]
        result = self.run_purge(where)
        self.model.purge_values(matches, also)
        self.stamp()
        self.trace.append(f"purge {result.predicate}: {result.keys_purged} keys, {result.keys_kept} kept")

    def run_purge(self, where: str) -> purge.PurgeResult:
        config = purge.PurgeConfig(table=self.table, where=where, lake_root=self.lake_root,
                                   run_id=f"cs-{self.seed}-{len(self.trace)}", vacuum_retention=timedelta(0),
                                   allow_short_retention=True)
        with pg.connect(self.dsn) as conn:
            [table] = registry.load(conn, self.table)
            result = purge.purge(self.spark, conn, table, config)
        if not result.complete:
            self.fail(f"purge {where} left rows: {result.remaining}")
        return result

    def value_predicate(self, values: list[str] | None) -> tuple[str, Callable[[str], bool]]:
        """`v IN (...)` over `values` or one to three values written so far, or `v LIKE 'prefix%'`,
        with the same test in Python."""
        if values:
            return f"v IN ({', '.join(repr(v) for v in values)})", lambda v: v in values
        written = sorted({v for _, rows in self.model.history for v in rows.values()} | set(self.model.rows.values()))
        chosen = self.rng.sample(written, min(len(written), self.rng.randint(1, 3))) if written else [self.value()]
        if self.rng.random() < 0.3:
            prefix = chosen[0].rsplit("-", 1)[0] if chosen[0].count("-") > 1 else chosen[0]
            return f"v LIKE '{prefix}%'", lambda v: v is not None and v.startswith(prefix)
        return f"v IN ({', '.join(repr(v) for v in chosen)})", lambda v: v in chosen

    def lake_live(self) -> dict[int, str]:
        """The lake's newest live value per key (none before the first commit)."""
        from coldharbor.lake import delta

        path = self.lake_path()
        if delta.pin_version(self.spark, path) is None:
            return {}
        return {key: row["v"] for (key,), row in lake_live(self.spark, self.lake_root, self.table, ["id"]).items()}

    def crash(self, point: str) -> None:
        """The job (under spark-submit, or as a Connect client) killed at `point`; then the next run
        must recover."""
        job = CRASH_POINTS[point]
        if point.startswith("rebase_"):
            self.rewrite_table()
        if job == "cdc_export.py":
            self.committed_write("insert" if self.free_keys() else "update")  # something to export
        elif job == "compact.py":
            self.ensure_small_files(2)
        elif job == "cleanup.py":
            self.ensure_small_files(2)
            self.compact()  # the files it replaces are what VACUUM removes
        args = ["--table", self.table, *{"cdc_export.py": [], "compact.py": ["--min-small-files", "2",
                                                                            "--target-file-mb", "1"],
                                         "cleanup.py": ["--retention-hours", "0", "--allow-short-retention",
                                                        "--no-evict"]}[job]]
        env = {"COLDHARBOR_CRASH_AT": point}
        before = self.lake_version()
        if self.connect_url:
            done = run_job(job, self.connect_url, self.dsn, self.lake_root, *args, env=env)
            output = done.stderr + done.stdout
        else:
            done = spark_submit(job, self.dsn, self.lake_root, *args, env=env)
            output = done.stdout
        # A point inside a Spark task kills the JVM (spark-submit itself: exit -9) or, over Connect,
        # the client from the server's task; the others kill the job's process, which says so first.
        reached = (done.returncode == -9 if point in TASK_POINTS
                   else f"fault injection: killing the process at {point}" in output)
        if not reached:
            raise CrashPointNotReached(f"seed {self.seed}: {job} never reached crash point {point} "
                                       f"(exit {done.returncode}):\n{output[-3000:]}")
        if done.returncode == 0:
            raise CrashPointNotReached(f"seed {self.seed}: {job} finished normally; crash point {point} was "
                                       f"never reached:\n{output[-3000:]}")
        self.crashes.append(point)
        self.trace.append(f"crash at {point}: {job} exit {done.returncode}")
        if self.connect_url and point in ORPHANS:
            self.wait_for_orphan(point, before)
        # Recovery: the next run of the same job.
        {"cdc_export.py": self.export, "compact.py": self.compact, "cleanup.py": self.cleanup}[job]()

    def rewrite_table(self) -> None:
        """DDL that rewrites every row without a change capture sees (the values stay as they were):
        the table goes back to pending, and the next export writes a rebase base. A transaction held
        open would block the ALTER: it commits first."""
        self.commit_held()
        self.conn.execute(f"ALTER TABLE {self.table} ALTER COLUMN v TYPE text USING v || ''")
        self.trace.append("table rewritten by ALTER TABLE: rebase requested")

    def in_rebase_window(self, at) -> bool:
        """Whether `at` lies in a rebase window: from the oldest change not exported when the DDL ran
        (or the request) until the base that answered it (sql/migrations/016)."""
        return self.conn.execute("""
            SELECT EXISTS (SELECT 1 FROM coldharbor.rebases r JOIN coldharbor.tables t USING (table_id)
                            WHERE t.schema_name || '.' || t.table_name = %s
                              AND least(r.dirty_since, r.requested_at) <= %s
                              AND (r.settled_at IS NULL OR %s < r.settled_at))""",
                                 (self.table, at, at)).fetchone()[0]

    def lake_path(self) -> str:
        return f"{self.lake_root}/{self.table.replace('.', '/')}"

    def lake_version(self) -> int:
        """The lake table's newest version (-1 before its first commit)."""
        newest = lake_store.history(self.lake_path(), 1)
        return newest[0]["version"] if newest else -1

    def wait_for_orphan(self, point: str, before: int) -> None:
        """Waits until the operation the client killed at `point` left on the Connect server has
        ended: a commit after version `before` of the kind ORPHANS names."""
        import time

        wanted = ORPHANS[point]
        deadline = time.monotonic() + ORPHAN_TIMEOUT_S
        while True:
            newer = [e for e in lake_store.history(self.lake_path(), 50) or [] if e["version"] > before]
            ended = [e for e in newer if wanted is None or e.get("operation") == wanted]
            if ended:
                self.trace.append(f"the server ended what the killed client left at {point}: "
                                  f"{ended[-1].get('operation')} at version {ended[-1]['version']}")
                return
            if time.monotonic() > deadline:
                raise OrphanNotSettled(f"seed {self.seed}: the server's operation left by the client killed at "
                                       f"{point} did not end within {ORPHAN_TIMEOUT_S} s (lake versions after "
                                       f"{before}: {[(e['version'], e.get('operation')) for e in newer]})")
            time.sleep(0.2)

    def ensure_small_files(self, count: int) -> None:
        """At least `count` lake files (each export adds one or more)."""
        from coldharbor.lake import delta

        path = self.lake_path()
        while True:
            snap = delta.snapshot(self.spark, path)
            if snap is not None and len(snap.files) >= count:
                return
            self.committed_write("insert" if self.free_keys() else "update")
            self.export()

    # -- reports --------------------------------------------------------------------------------

    def serve(self, *extra: str) -> tuple[int, str]:
        from coldharbor.serve import serve_cli

        run_id = f"cs-{uuid.uuid4().hex[:12]}"
        code = serve_cli.main(["--lake-root", self.lake_root, "--sql", f"SELECT id, v FROM {self.table}",
                               "--target", self.target, "--run-id", run_id, *extra])
        error = self.conn.execute("SELECT error FROM coldharbor.report_runs WHERE run_id = %s", (run_id,)).fetchone()
        return code, (error[0] if error else None) or ""

    def served(self) -> dict[int, str]:
        rows = self.conn.execute(f"SELECT id, v FROM reports.{self.target}").fetchall()
        served = {r[0]: r[1] for r in rows}
        if len(served) != len(rows):
            self.fail(f"the report served a key twice: {sorted(r[0] for r in rows)}")
        return served

    def compare(self, actual: dict[int, str], expected: dict[int, str], what: str) -> None:
        if actual == expected:
            return
        stale = {k: (actual[k], expected[k]) for k in actual.keys() & expected.keys() if actual[k] != expected[k]}
        self.fail(f"{what} differs from the model: missing {sorted(expected.keys() - actual.keys())}, "
                  f"extra (resurrected or never written) {sorted(actual.keys() - expected.keys())}, "
                  f"stale (served, expected) {stale}")

    def report(self) -> None:
        code, error = self.serve()
        if code != 0:
            self.fail(f"report failed with exit {code}: {error}")
        self.reports += 1
        self.compare(self.served(), self.model.rows, "report")
        self.trace.append(f"report: {len(self.model.rows)} rows match")

    def compare_incremental(self, index: int) -> None:
        """The incremental report, refreshed now, against the same SQL recomputed in full."""
        from coldharbor.serve import serve_cli

        run_id = f"cs-inc-{uuid.uuid4().hex[:12]}"
        code = serve_cli.main(["--lake-root", self.lake_root, "--report", self.incremental_report, "--run-id", run_id])
        _, detail, error = self.conn.execute("SELECT state, detail, error FROM coldharbor.report_runs "
                                                 "WHERE run_id = %s", (run_id,)).fetchone()
        if code != 0:
            self.fail(f"the incremental report failed with exit {code}: {error}")
        full_target = f"adhoc_full_{self.incremental_report}"[:48]
        code = serve_cli.main(["--lake-root", self.lake_root, "--sql", INCREMENTAL_REPORT.format(table=self.table),
                               "--target", full_target, "--run-id", f"cs-full-{uuid.uuid4().hex[:12]}"])
        if code != 0:
            self.fail(f"the full recompute of the incremental report failed with exit {code}")
        incremental, full = (sorted(self.conn.execute(f"SELECT * FROM reports.{t}").fetchall(), key=repr)
                             for t in (self.incremental_report, full_target))
        if incremental != full:
            self.fail(f"after step {index} the incremental report ({detail}) differs from its full recompute: "
                      f"{incremental} != {full}")
        self.incremental_refreshes.append(detail)
        self.trace.append(f"incremental report: {detail}")

    def report_as_of(self, at=None) -> None:
        if at is None:
            at, _ = self.rng.choice(self.model.history)
        code, error = self.serve("--as-of", at.isoformat())
        if code == 0:
            self.reports += 1
            self.compare(self.served(), self.model.as_of(at), f"report as of {at.isoformat()}")
            self.trace.append(f"report as of {at.isoformat()}: {len(self.model.as_of(at))} rows match")
        elif "is not in the lake yet" in error:
            if not self.unexported_before(at):
                self.fail(f"as-of {at.isoformat()} was refused as not in the lake, but every change committed "
                          f"by then is flushed: {error}")
            self.trace.append(f"report as of {at.isoformat()}: refused, not in the lake yet (correct)")
        elif "was loaded into the lake" in error:
            loaded_at = self.loaded_at()
            if loaded_at is None or at >= loaded_at:
                self.fail(f"as-of {at.isoformat()} was refused as before the initial load, which read the table "
                          f"as of {loaded_at}: {error}")
            self.trace.append(f"report as of {at.isoformat()}: refused, before the initial load (correct)")
        elif "falls inside a rebase" in error or "falls before a rebase" in error:
            pending = self.conn.execute("SELECT load_state = 'pending' FROM coldharbor.tables "
                                        "WHERE schema_name || '.' || table_name = %s", (self.table,)).fetchone()[0]
            if not (pending or self.in_rebase_window(at)):
                self.fail(f"as-of {at.isoformat()} was refused as inside a rebase, but no rebase window holds it "
                          f"and the table is not pending: {error}")
            self.trace.append(f"report as of {at.isoformat()}: refused, inside a rebase (correct)")
        elif "initial load has not landed" in error:
            if self.loaded_at() is not None:
                self.fail(f"as-of {at.isoformat()} was refused as before the load landed, but it has: {error}")
            self.trace.append(f"report as of {at.isoformat()}: refused, the initial load is pending (correct)")
        elif "newest base landed in the lake after the version this report read" in error:
            if self.loaded_at() is None:
                self.fail(f"as-of {at.isoformat()} was refused as after a base, but none landed: {error}")
            self.trace.append(f"report as of {at.isoformat()}: refused, a base landed after the pin (correct)")
        elif "cannot be answered exactly" in error:
            if self.exact and not self.in_rebase_window(at):
                self.fail(f"as-of {at.isoformat()} was refused as inside a span of changes exported together, but "
                          f"the table keeps exact history (every change's image): {error}")
            if not self.exported_together_around(at):
                self.fail(f"as-of {at.isoformat()} was refused as inside a span of changes exported together, "
                          f"but the lake has no such span: {error}")
            self.trace.append(f"report as of {at.isoformat()}: refused, inside a span exported together (correct)")
        else:
            self.fail(f"report as of {at.isoformat()} failed with exit {code}: {error}")

    def loaded_at(self):
        """The initial load's snapshot time, the registration's for a table registered empty, or None
        (pending)."""
        return self.conn.execute("SELECT CASE WHEN loaded_at IS NOT NULL THEN loaded_at "
                                 "WHEN load_state = 'loaded' THEN registered_at END "
                                 "FROM coldharbor.tables WHERE schema_name || '.' || table_name = %s",
                                 (self.table,), binary=True).fetchone()[0]

    def exported_together_around(self, at) -> bool:
        """Whether the lake has a key whose changes before and after `at` went out in one export."""
        from pyspark.sql import functions as F

        rows = self.spark.read.format("delta").load(f"{self.lake_root}/{self.table.replace('.', '/')}")
        return rows.filter((F.col("_ch_first_changed_at") <= F.lit(at)) & (F.col("_ch_changed_at") > F.lit(at))
                           ).limit(1).count() > 0

    def unexported_before(self, at) -> bool:
        """Whether some change committed at or before `at` is not flushed to the lake."""
        return self.conn.execute("""
            SELECT EXISTS (SELECT 1 FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id)
                            WHERE t.schema_name || '.' || t.table_name = %s AND c.flushed_at IS NULL
                              AND coalesce(pg_xact_commit_timestamp(c.xmin), c.created_at) <= %s)""",
                                 (self.table, at)).fetchone()[0]

    # -- the sequence ---------------------------------------------------------------------------

    def step(self, index: int, crash_at: dict[int, str]) -> None:
        if self.held is not None and index >= self.held.commit_after:
            self.commit_held()
        if index in crash_at:
            self.crash(crash_at[index])
            return
        kinds, weights = zip(*WEIGHTS.items())
        kind = self.rng.choices(kinds, weights)[0]
        if kind in WRITE_STEPS:
            self.committed_write(kind)
        elif kind == "hold_open":
            self.hold_open(index)
        elif kind == "export":
            self.export()
        elif kind == "export_with_writer":
            self.export(writer_at=self.rng.choice(EXPORT_HOOK_POINTS))
        elif kind == "compact":
            self.compact()
        elif kind == "cleanup":
            self.cleanup()
        elif kind == "purge":
            self.purge()
        elif kind == "report":
            self.report()
        else:
            self.report_as_of()

    def finish(self) -> None:
        """Everything committed and exported, then a last report now, two as of past instants and
        one as of an instant right after an export."""
        self.commit_held()
        self.export()
        self.report()
        for _ in range(2):
            self.report_as_of()
        since = self.model.history[0][0]  # a purge by value restarts the history the model can answer
        self.report_as_of(self.rng.choice([at for at in self.export_instants if at >= since] or [since]))

    def close(self) -> None:
        if self.incremental:
            if self.saved_reports_dir is None:
                os.environ.pop("COLDHARBOR_REPORTS_DIR", None)
            else:
                os.environ["COLDHARBOR_REPORTS_DIR"] = self.saved_reports_dir
        if self.held is not None:
            self.held.conn.rollback()
            self.held.conn.close()
        self.conn.close()


@dataclass
class Outcome:
    seed: int
    steps: int
    reports: int
    crashes: list[str]
    trace: list[str]
    incremental_refreshes: list[str] = field(default_factory=list)


def run_sequence(seed: int, steps: int, crash_points: list[str], *, spark, dsn: str, admin_dsn: str,
                 workdir: Path, prefilled: bool | None = None, connect_url: str | None = None,
                 incremental: bool = False) -> Outcome:
    """One seeded sequence of `steps` random steps with the given crash points spread over it: the jobs
    run as `dsn` (the pipeline's login), the application writes as `admin_dsn`. The table holds rows
    before its registration when `prefilled` (None: the seed decides; always when a crash point of
    the initial load is asked for). With `connect_url` the jobs are clients of that Spark Connect
    server, `spark` a session of it, and COLDHARBOR_SPARK_REMOTE must name it too (reports)."""
    load_points = [p for p in crash_points if p in LOAD_POINTS]
    if len(load_points) > 1:
        raise ValueError(f"one initial load per sequence: at most one of {LOAD_POINTS}, got {load_points}")
    run = Run(seed, spark, dsn, admin_dsn, str(workdir / f"lake-{seed}"),
              prefilled=True if load_points else prefilled, connect_url=connect_url, incremental=incremental)
    rng = random.Random(seed * 7919)
    later = [p for p in crash_points if p not in LOAD_POINTS]
    slots = sorted(rng.sample(range(2, steps), len(later))) if later else []
    crash_at = dict(zip(slots, later))
    try:
        for point in load_points:  # the table's first export is its load: killed there, then recovered
            run.committed_write("update")
            run.crash(point)
        for index in range(steps):
            run.step(index, crash_at)
            if incremental:
                run.compare_incremental(index)
        run.finish()
        if incremental:
            run.compare_incremental(steps)
        missing = set(crash_points) - set(run.crashes)
        if missing:
            raise CrashPointNotReached(f"seed {seed}: crash points never exercised: {sorted(missing)}")
        return Outcome(seed, steps, run.reports, run.crashes, run.trace, run.incremental_refreshes)
    finally:
        run.close()

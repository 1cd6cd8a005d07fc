"""A class-data-sharing archive for the short-lived JVMs the tests start (each job's spark-submit,
Airflow's, a Connect server started for one test).

Such a JVM spends seconds loading and verifying the same ~17,000 classes (Spark, Delta, Hadoop,
the JDBC driver) every time. Java 17 can write the classes a run loaded to an archive
(-XX:ArchiveClassesAtExit) and map them in at the next start (-XX:SharedArchiveFile): one spark-submit
writing and reading a small Delta table took 32 s against 37.5 s without it (2026-11-28, the mean
of two runs each). Tests only: it changes no result, and a JVM whose archive does not fit (another
JDK, another class path) ignores it.

The archive is written once per JDK, PySpark and package set, in the background while the first
tests run, under the data folder next to the resolved jars; a run starts handing it to JVMs as soon
as it is there (`ready_option`). Run as a script (by spark-submit), this file is the workload whose
classes are archived: what the jobs do, on a tiny Delta table.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# A JVM given an archive it cannot use warns on stdout: a job's output would change.
QUIET = "-Xlog:cds=off,cds+dynamic=off"


def _key() -> str:
    import pyspark
    from coldharbor.runtime.spark import maven_packages

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True).stderr
    parts = [java, pyspark.__version__, ",".join(maven_packages()), sys.executable, Path(__file__).read_text()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_path() -> Path:
    from coldharbor.runtime.spark import ivy_dir

    return Path(ivy_dir()).parent / "class-archive" / f"{_key()}.jsa"


class Archive:
    """The archive of this run: already there, or being written by a background spark-submit."""

    def __init__(self, submit_opts: str) -> None:
        self.path = archive_path()
        self._writer: subprocess.Popen | None = None
        self._work: Path | None = None
        if not self.path.exists():
            self._start_writing(submit_opts)

    def _start_writing(self, submit_opts: str) -> None:
        from coldharbor.runtime.spark import ivy_dir, maven_packages

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._work = work = Path(tempfile.mkdtemp(prefix="class-archive-"))
        self._partial = self.path.with_name(f"{self.path.stem}.{os.getpid()}.partial")
        bin_dir = Path(sys.executable).parent
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_SUBMIT_OPTS": f"{submit_opts} -XX:ArchiveClassesAtExit={self._partial}",
               "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "jobs")}
        command = [str(bin_dir / "spark-submit"), "--master", "local[1]", "--packages", ",".join(maven_packages()),
                   "--conf", f"spark.jars.ivy={ivy_dir()}", "--conf", "spark.ui.enabled=false",
                   __file__, str(work / "lake")]
        with open(work / "writer.log", "w") as out:
            self._writer = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def ready_option(self) -> str | None:
        """The JVM options that use the archive, once it is there; None while it is being written
        (or when writing it failed: the JVMs then start as they always did)."""
        if self._writer is not None and self._writer.poll() is not None:
            if self._writer.returncode == 0 and self._partial.exists():
                os.replace(self._partial, self.path)
                for stale in self.path.parent.glob("*.jsa"):  # another JDK's, PySpark's or workload's
                    if stale != self.path:
                        stale.unlink(missing_ok=True)
                shutil.rmtree(self._work, ignore_errors=True)
            else:  # its log stays in the temporary folder
                self._partial.unlink(missing_ok=True)
            self._writer = None
        return f"-XX:SharedArchiveFile={self.path} {QUIET}" if self._writer is None and self.path.exists() else None

    def stop(self) -> None:
        if self._writer is not None and self._writer.poll() is None:
            os.killpg(self._writer.pid, 9)
            self._writer.wait()
            self._partial.unlink(missing_ok=True)
            shutil.rmtree(self._work, ignore_errors=True)


def _workload(lake: str) -> None:
    """What the jobs' JVMs do, on a few rows: a Delta write, MERGE, DELETE, reads with a window and
    an aggregate, OPTIMIZE, VACUUM, the log's history, Parquet, and a JDBC connection attempt."""
    from coldharbor.runtime.spark import get_session

    spark = get_session("coldharbor-class-archive")
    spark.conf.set("spark.sql.runSQLOnFiles", "true")  # as the jobs do where they name a table by path
    table = f"delta.`{lake}/t`"
    rows = spark.range(200).selectExpr("id", "CAST(id % 7 AS STRING) AS s", "current_timestamp() AS ts",
                                       "CAST(id AS DECIMAL(20, 2)) AS d", "id % 3 = 0 AS deleted")
    rows.write.format("delta").partitionBy("s").save(f"{lake}/t")
    rows.createOrReplaceTempView("changes")
    spark.sql(f"""MERGE INTO {table} t USING (SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY id
                  ORDER BY ts DESC) AS n FROM changes) WHERE n = 1) c ON t.id = c.id
                  WHEN MATCHED AND c.deleted THEN DELETE WHEN MATCHED THEN UPDATE SET d = c.d
                  WHEN NOT MATCHED THEN INSERT (id, s, ts, d, deleted) VALUES (c.id, c.s, c.ts, c.d, c.deleted)""")
    spark.sql(f"DELETE FROM {table} WHERE id < 5")
    cold = spark.read.format("delta").load(f"{lake}/t")
    cold.join(rows.select("id"), "id", "left_anti").groupBy("s").count().collect()
    cold.write.mode("overwrite").parquet(f"{lake}/p")
    spark.read.parquet(f"{lake}/p").orderBy("id").limit(3).collect()
    spark.sql(f"OPTIMIZE {table}").collect()
    spark.sql(f"DESCRIBE HISTORY {table}").collect()
    spark.sql(f"VACUUM {table} RETAIN 168 HOURS").collect()
    try:
        spark.read.format("jdbc").option("driver", "org.postgresql.Driver").option(
            "url", "jdbc:postgresql://127.0.0.1:1/none").option("dbtable", "x").load()
    except Exception as failure:  # noqa: BLE001 - nothing listens there: only the driver's classes are wanted
        print(f"as expected, no database: {type(failure).__name__}")
    spark.stop()


if __name__ == "__main__":
    _workload(sys.argv[1])

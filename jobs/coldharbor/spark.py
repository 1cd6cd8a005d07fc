"""The SparkSession every job uses: Delta enabled, UTC, jars resolved from Maven Central once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from coldharbor import settings

# Knobs with their defaults; each can be overridden by spark-submit --conf or the environment.
DEFAULT_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.sql.shuffle.partitions": os.environ.get("COLDHARBOR_SHUFFLE_PARTITIONS", "4"),
    "spark.ui.enabled": "false",
    # Reports must not read arbitrary files from SQL (SELECT * FROM parquet.`/etc/...`).
    "spark.sql.runSQLOnFiles": "false",
    # ...nor substitute ${var}, ${system:...} or ${env:...} into SQL text after it was checked.
    "spark.sql.variable.substitute": "false",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    # Spark 4.2 binds :name parameters inside its parser, which Delta's parser wrapper does not pass
    # on (the parameters stay unbound); the analysis-time binding still works through it. Values
    # are bound as literals either way, never formatted into the SQL text.
    "spark.sql.legacy.parameterSubstitution.constantsOnly": "true",
    # Delta rebuilds table state (for txnVersion checks) in this many tasks; its default of 50
    # turns a per-minute export into seconds of task overhead on a small machine.
    "spark.databricks.delta.snapshotPartitions": os.environ.get("COLDHARBOR_DELTA_SNAPSHOT_PARTITIONS", "2"),
    # VACUUM lists the table's folders in this many tasks; the default of 10,000 makes it minutes
    # of task overhead even for a table of one folder.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism":
        os.environ.get("COLDHARBOR_LISTING_PARALLELISM", "8"),
}


def maven_packages() -> list[str]:
    """Delta for this PySpark's major.minor, the PostgreSQL JDBC driver, and any extra packages
    (hadoop-aws for an s3a:// lake)."""
    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    return [
        f"io.delta:delta-spark_{spark_minor}_{settings.SCALA_BINARY_VERSION}:{settings.DELTA_JAR_VERSION}",
        f"org.postgresql:postgresql:{settings.POSTGRES_JDBC_VERSION}",
        *settings.extra_packages(),
    ]


def ivy_dir() -> str:
    """Where resolved jars are cached: set-up fills it once so scheduled runs never download."""
    return os.environ.get("COLDHARBOR_IVY_DIR", str(settings.DATA_DIR / "ivy"))


def session_conf(master: str | None = None) -> dict[str, str]:
    conf = dict(DEFAULT_CONF)
    conf["spark.jars.packages"] = ",".join(maven_packages())
    conf["spark.jars.ivy"] = ivy_dir()
    if master:
        conf["spark.master"] = master
    return conf


@contextmanager
def temporary_conf(spark, values: dict[str, str]) -> Iterator[None]:
    """Session settings for the duration of one block, restored (or unset) afterwards."""
    previous = {key: spark.conf.get(key, None) for key in values}
    try:
        for key, value in values.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def get_session(app_name: str):
    """The job's session. Under spark-submit the submitted conf wins and only missing keys are
    filled in; run directly (tests, `python jobs/x.py`) it starts `COLDHARBOR_SPARK_MASTER`.
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # launched by spark-submit
        from pyspark import SparkContext

        # Connect to spark-submit's JVM first: a SparkConf made before that is an empty Python dict,
        # and every default below would then override what was submitted (spark.ui.enabled, ...).
        SparkContext._ensure_initialized()
        submitted = SparkConf()
        conf = {k: v for k, v in session_conf().items() if not submitted.contains(k)}
    else:
        conf = session_conf(os.environ.get("COLDHARBOR_SPARK_MASTER", "local[2]"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()

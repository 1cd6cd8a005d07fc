"""How many tasks a session runs at once (`cores`, asked of Spark with a query, which a Connect
client can do), and so how many JDBC readers share a read (`parallelism`) and how many read a
whole table for a base (`base_parallelism`, leaving a core to the application)."""

from __future__ import annotations

import weakref

from coldharbor.runtime import settings

_parallelism_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def base_parallelism(spark) -> int:
    """How many JDBC readers read a base (a whole table): COLDHARBOR_BASE_READERS, else one fewer than
    `parallelism` (at least one). A base reads every row as fast as PostgreSQL and Spark can take
    them; the core left over is the application's, whose single-row writes otherwise wait for CPU
    (bench.initial_load on 2 cores: 65 % of their unloaded rate with one reader, 34 % with two, the
    load 181k and 236k rows/s)."""
    return settings.base_readers() or max(1, parallelism(spark) - 1)


def parallelism(spark) -> int:
    """How many tasks the session runs at once (`cores`), which is how many JDBC readers share a
    read; COLDHARBOR_JDBC_READERS overrides it."""
    return settings.jdbc_readers() or cores(spark)


def cores(spark) -> int:
    """Spark's default parallelism (the cores of local mode, the executors' on a cluster). Asked of
    Spark with a query, not of its SparkContext, which a Connect client does not have; once per
    session."""
    if spark not in _parallelism_seen:
        from pyspark.sql import functions as F

        # range() without a partition count splits into the default parallelism; each gets a row.
        last = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("part")).agg(F.max("part")).first()[0]
        _parallelism_seen[spark] = max(1, int(last) + 1)
    return _parallelism_seen[spark]

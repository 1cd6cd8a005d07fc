"""Values crossing from Spark into this Python process, exactly, whatever the process's time zone.

PySpark hands a TIMESTAMP to Python as a naive datetime in the process's local time zone, and
Python's conversion to local time looks a day earlier (for a daylight-saving fold): 0001-01-01
00:00 UTC, a value the lake holds, fails there with 'year 0 is out of range' in every zone, and any
other value reads differently under another TZ. A job that brings timestamps into Python selects
them with `collectable` and turns what it collected back with `collected`: a zone-aware datetime in
UTC, which psycopg binds as timestamptz and PySpark sends back to Spark by its UTC instant.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from pyspark.sql import Column
from pyspark.sql import functions as F

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def collectable(value: Column, lake_type: str | None) -> Column:
    """`value` in a form Python receives exactly: a TIMESTAMP as its microseconds since 1970."""
    return F.unix_micros(value) if lake_type == "TIMESTAMP" else value


def collected(value: object, lake_type: str | None) -> object:
    """A value `collectable` sent: a TIMESTAMP as a datetime in UTC (zone-aware), others as they came."""
    if lake_type == "TIMESTAMP" and value is not None:
        return EPOCH + timedelta(microseconds=value)
    return value

"""verify and resync over keys at the edges of what the lake holds, for every key type (real
PostgreSQL and Spark + Delta): in sync says so, a row changed in the lake by hand is found (exit 1),
resync repairs it."""

from __future__ import annotations

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from coldharbor import resync, verify
from tests.helpers import export

# key type, lowest and highest keys the lake holds, an ordinary key of the row number g
EDGE_KEYS = [
    ("timestamptz", "'0001-01-01 00:00:00+00'", "'9999-12-31 23:59:59.999999+00'",
     "timestamptz '2020-01-01 00:00:00+00' + g * interval '1 hour 1.5 second'"),
    ("timestamp", "'0001-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'",
     "timestamp '2020-01-01' + g * interval '1 hour 1.5 second'"),
    ("date", "'0001-01-01'", "'9999-12-31'", "date '2020-01-01' + g"),
    ("smallint", "-32768", "32767", "g"),
    ("integer", "-2147483648", "2147483647", "g"),
    ("bigint", "-9223372036854775808", "9223372036854775807", "g"),
    ("numeric(38,0)", "-99999999999999999999999999999999999999", "99999999999999999999999999999999999999", "g"),
    ("text", "''", "E'\\U0010FFFF ''q'' \\n; DROP TABLE x; --'", "'k' || g"),
    ("uuid", "'00000000-0000-0000-0000-000000000000'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'", "md5(g::text)::uuid"),
    ("bytea", "'\\x'", "'\\xffffffffffffffffffff'", "decode(md5(g::text), 'hex')"),
]


def edge_table(conn, name: str, key_type: str, low: str, high: str, ordinary: str) -> None:
    """A table holding its key type's lowest and highest keys and ordinary ones, then registered."""
    conn.execute(f"CREATE TABLE {name} (k {key_type} PRIMARY KEY, v text)")
    conn.execute(f"INSERT INTO {name} VALUES ({low}, 'lo'), ({high}, 'hi')")
    conn.execute(f"INSERT INTO {name} SELECT {ordinary}, 'row ' || g FROM generate_series(1, 40) g")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))


@pytest.mark.parametrize("key_type,low,high,ordinary", EDGE_KEYS, ids=[k[0].split("(")[0] for k in EDGE_KEYS])
def test_keys_at_the_edges_verify_in_sync_and_a_hand_edit_is_found(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                   monkeypatch, capsys, caplog,
                                                                   key_type, low, high, ordinary):
    edge_table(pg_conn, table_name, key_type, low, high, ordinary)
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'dirty' WHERE v = 'row 7'")  # a dirty key beside them
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    for chunks in ("1", "16"):
        assert verify.main(["--table", table_name, "--lake-root", lake_root, "--chunks", chunks]) == 0, caplog.text
        assert f"public.{table_name} in sync: 42 rows in {chunks} chunks" in capsys.readouterr().out

    DeltaTable.forPath(spark, f"{lake_root}/public/{table_name}").update("v IN ('lo', 'hi')", {"v": F.lit("edited")})
    assert verify.main(["--table", table_name, "--lake-root", lake_root, "--chunks", "5"]) == 1, caplog.text
    out = capsys.readouterr().out
    assert "NOT in sync" in out and out.count("has different values in the lake view and in PostgreSQL") == 2, out

    assert resync.main(["--table", table_name, "--lake-root", lake_root]) == 0, caplog.text
    assert verify.main(["--table", table_name, "--lake-root", lake_root]) == 0, caplog.text
    assert "Traceback" not in caplog.text

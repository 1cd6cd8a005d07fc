"""Which reports incremental refresh takes (coldharbor.serve.incremental_shape): the one shape it can
update from a change's own rows, and a reason for every other."""

from __future__ import annotations

import pytest
from coldharbor.serve import sql_guard
from coldharbor.serve.incremental_shape import NotIncremental, incremental_shape
from coldharbor.serve.report_spec import parse_report


def shape(sql: str):
    return incremental_shape(sql_guard.parse_query(sql))


def test_the_grouped_shape_is_taken_apart():
    found = shape("SELECT o.status, count(*) AS n, count(o.note) AS notes, sum(o.amount) AS total, avg(o.amount) a, "
                  "MIN(o.at) first_at, max(o.at) FROM app.orders o WHERE o.amount >= :floor AND o.note <> 'x' "
                  "GROUP BY o.status")
    assert found.table.name == "orders" and found.table.db == "app"
    assert [a.kind for a in found.aggregates] == ["count", "count", "sum", "avg", "min", "max"]
    assert found.aggregates[0].argument is None and found.aggregates[2].argument.sql() == "o.amount"
    assert [(o.group, o.aggregate) for o in found.outputs] == [(0, None)] + [(None, i) for i in range(6)]
    assert found.where is not None and "floor" in found.where.sql()


def test_keys_by_position_and_by_expression_and_keys_not_selected():
    found = shape("SELECT date_trunc('day', at) AS day, upper(kind), sum(CAST(v AS decimal(12,2))) "
                  "FROM t GROUP BY 1, upper(kind), region")
    assert [g.sql(dialect="spark") for g in found.groups] == ["DATE_TRUNC('day', at)", "UPPER(kind)", "region"]
    assert [(o.group, o.aggregate) for o in found.outputs] == [(0, None), (1, None), (None, 0)]


@pytest.mark.parametrize("sql, why", [
    ("SELECT count(*) FROM t", "it has no GROUP BY"),
    ("SELECT k, count(DISTINCT v) FROM t GROUP BY k", "counts distinct values"),
    ("SELECT k, sum(v) FILTER (WHERE v > 1) FROM t GROUP BY k", "has a FILTER clause"),
    ("SELECT k, sum(v) / count(*) FROM t GROUP BY k", "computes with an aggregate"),
    ("SELECT k, coalesce(sum(v), 0) FROM t GROUP BY k", "computes with an aggregate"),
    ("SELECT k, v FROM t GROUP BY k", "neither a GROUP BY expression nor an aggregate"),
    ("SELECT k, max_by(v, k) FROM t GROUP BY k", "neither a GROUP BY expression nor an aggregate"),
    ("SELECT k, stddev(v) FROM t GROUP BY k", "neither a GROUP BY expression nor an aggregate"),
    ("SELECT k, count(*) FROM t JOIN u USING (k) GROUP BY k", "it has a join"),
    ("SELECT k, count(*) FROM t GROUP BY k HAVING count(*) > 1", "it has HAVING"),
    ("SELECT k, count(*) FROM t GROUP BY k ORDER BY k", "it has ORDER BY"),
    ("SELECT k, count(*) FROM t GROUP BY k LIMIT 5", "it has LIMIT"),
    ("SELECT DISTINCT k, count(*) FROM t GROUP BY k", "SELECT DISTINCT"),
    ("WITH x AS (SELECT * FROM t) SELECT k, count(*) FROM x GROUP BY k", "a WITH clause"),
    ("SELECT k, count(*) FROM (SELECT * FROM t) x GROUP BY k", "not a table"),
    ("SELECT k, count(*) FROM t WHERE k IN (SELECT k FROM u) GROUP BY k", "WHERE holds a subquery"),
    ("SELECT k, count(*) FROM t WHERE EXISTS (SELECT 1 FROM u) GROUP BY k", "WHERE holds a subquery"),
    ("SELECT k, count(*) FROM t GROUP BY ROLLUP (k)", "it groups by ROLLUP"),
    ("SELECT k, count(*) FROM t GROUP BY k, explode(array(1, 2))", "GROUP BY calls explode"),
    ("SELECT k, max(row_number() OVER (ORDER BY k)) FROM t GROUP BY k", "holds a window function"),
    ("SELECT k, sum(v) FROM t WHERE v > avg(v) GROUP BY k", "WHERE calls avg"),
    ("SELECT upper(k) AS k, count(*) FROM t GROUP BY k", "may name a select alias or a column"),
    ("SELECT k, count(*) FROM t GROUP BY 3", "GROUP BY 3 names no select item"),
    ("SELECT k, count(*) FROM t GROUP BY k UNION ALL SELECT k, 1 FROM t", "it is a UNION of queries"),
    ("SELECT k, count(*) FROM changes(t, 1, 2) GROUP BY k", "it reads a change feed"),
])
def test_every_other_shape_is_refused_saying_why(sql, why):
    with pytest.raises(NotIncremental, match=why.replace("(", r"\(")):
        shape(sql)


def test_the_header_declares_it():
    spec = parse_report("-- refresh: incremental\nSELECT k, count(*) FROM t GROUP BY k", "r")
    assert spec.refresh == "incremental"
    assert parse_report("SELECT 1", "r").refresh == "full"

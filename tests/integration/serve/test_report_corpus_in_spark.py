"""The legitimate reports of the corpus run in Spark over the unified views and answer as PostgreSQL
does; and Spark's own parser reads the SQL the guard writes as the guard does: it reads only the
views and the query's CTEs and calls only allow-listed functions."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

import pytest
from coldharbor.capture import registry
from coldharbor.runtime import pg
from coldharbor.serve import hot_snapshot, serve_job
from coldharbor.serve.report_spec import parse_report
from coldharbor.serve.sql_allowlist import ALLOWED_FUNCTIONS, GUARD_FUNCTIONS, SPARK_PARENTHESIS_FREE_FUNCTIONS
from coldharbor.serve.sql_check import could_fold_to
from coldharbor.serve.sql_guard import check_query

from tests.helpers import report_run, serve_report
from tests.report_corpus import CUSTOMERS, ITEMS, ORDERS, fill, legitimate

LEGITIMATE = legitimate()
SERVED_END_TO_END = ("orders-by-status-param", "three-table-join", "date-arithmetic-params", "values-mapping-join",
                     "tags-lateral-view")
# Accepted reports with odd spellings: names that are keywords, quotes, comments and escapes in
# literals, unicode names, lambda variables named like Spark's parenthesis-free functions.
ODD_BUT_ACCEPTED = [
    f"SELECT o.`user`, o.current_date FROM {ORDERS} o",
    f"SELECT transform(split(tags, ','), `user` -> upper(`user`)) AS t FROM {ORDERS}",
    f"SELECT 'it''s', 'a\\'b', \"dq\", 'back\\\\slash', '/* no comment */', '-- nor this', ';' AS x FROM {ORDERS}",
    f"SELECT order_id AS `select`, status AS `from` FROM {ORDERS} AS `where`",
    f"SELECT * FROM {ORDERS} /* ; DROP TABLE {ORDERS}; */ WHERE 1 = 1 -- ; DROP TABLE {ORDERS}",
    f"WITH `with` AS (SELECT * FROM {ORDERS}) SELECT * FROM `with`",
    f"SELECT get_json_object(meta, '$..a') AS a, get_json_object(meta, '$[''x'']') AS b FROM {ORDERS}",
    f"SELECT `é`, `日本`, `a``b`, `c d` FROM {ORDERS} AS `ü`",
    f"SELECT * FROM (SELECT * FROM (SELECT * FROM {ORDERS}) a) b",
    f"SELECT a.*, 1 AS one FROM {ORDERS} a",
    f"FROM {ORDERS} |> SELECT order_id",
    f"SELECT tag FROM {ORDERS} LATERAL VIEW OUTER explode(split(tags, ',')) lv AS tag",
    f"SELECT INTERVAL '1' DAY, INTERVAL 2 HOURS, DATE '2026-01-01', TIMESTAMP '2026-01-01 00:00:00', X'AB', 1L, 1.5BD "
    f"FROM {ORDERS}",
    f"SELECT order_id FROM {ORDERS} WHERE amount > :min AND status = :s",
    f"SELECT count(*) FROM {ORDERS} o JOIN {CUSTOMERS} c ON o.customer_id = c.customer_id "
    f"LEFT SEMI JOIN {ITEMS} i ON i.order_id = o.order_id",
]
# The Catalyst classes Spark's parser makes of the corpus: a report that needs another is a
# conscious addition here.
CATALYST_CLASSES = frozenset({
    "Add", "Aggregate", "Alias", "And", "AttributeReference", "CaseWhen", "Cast", "CurrentRow$", "Distinct",
    "Divide", "EqualTo", "Except", "Exists", "Filter", "Generate", "GlobalLimit", "GreaterThan",
    "GreaterThanOrEqual", "InSubquery", "Intersect", "IsNull", "Join", "LambdaFunction", "LessThan",
    "LessThanOrEqual", "ListQuery", "Literal", "LocalLimit", "LocalRelation", "Multiply", "NamedParameter", "Not",
    "Offset", "Or", "Project", "Rollup", "ScalarSubquery", "Sort", "SortOrder", "SpecifiedWindowFrame",
    "SubqueryAlias", "Subtract", "UnboundedPreceding$", "Union", "UnresolvedAlias", "UnresolvedAttribute",
    "UnresolvedExtractValue", "UnresolvedFunction", "UnresolvedGenerator", "UnresolvedHaving",
    "UnresolvedNamedLambdaVariable", "UnresolvedOrdinal", "UnresolvedRelation", "UnresolvedStar",
    "UnresolvedWindowExpression", "UnresolvedWith", "UnspecifiedFrame$", "WindowExpression", "WindowSpecDefinition",
    "WithWindowDefinition", "In", "Like", "RLike", "UnresolvedInlineTable", "UnresolvedRegex",
})


@pytest.fixture(scope="module")
def unified_views(spark, pg_dsn, sandbox):
    """The corpus tables' unified views registered once; the registry to check reports against."""
    with pg.connect(pg_dsn) as conn:
        tables = registry.load(conn)
        ours = [t for t in tables if t.table_name in (ORDERS, CUSTOMERS, ITEMS)]
        pinned = serve_job.pin_versions(spark, ours, sandbox.lake_root)
        snapshot = hot_snapshot.read(conn, pinned, ours)
    serve_job.register_views(spark, snapshot, pinned, sandbox.lake_root, None)
    return tables


def normal(value):
    """One comparable form for a value from Spark or psycopg."""
    if isinstance(value, Decimal):
        return value.normalize()
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def rows_of(rows) -> list[tuple]:
    return sorted((tuple(normal(v) for v in row) for row in rows), key=repr)


@pytest.mark.parametrize("report", LEGITIMATE, ids=[r.id for r in LEGITIMATE])
def test_a_legitimate_report_runs_in_spark_and_answers_as_postgres(spark, pg_conn, unified_views, report):
    spec = parse_report(fill(report.report), "adhoc")
    checked = check_query(spec.sql, unified_views)
    served = serve_job.run_query(spark, checked, spec.bind({})).collect()
    assert served, "a legitimate report of the corpus returns rows"
    if report.postgres is not None:
        assert rows_of(served) == rows_of(pg_conn.execute(fill(report.postgres)).fetchall())


@pytest.mark.parametrize("report_id", SERVED_END_TO_END)
def test_legitimate_reports_are_served_end_to_end(spark, pg_dsn, pg_conn, sandbox, report_id, monkeypatch):
    [report] = [r for r in LEGITIMATE if r.id == report_id]
    target = f"adhoc_{report_id.replace('-', '_')}"
    assert serve_report(monkeypatch, pg_dsn, sandbox.lake_root, "--sql", fill(report.report), "--target", target,
                        "--run-id", f"legit-{report_id}") == 0
    assert report_run(pg_conn, f"legit-{report_id}")["state"] == "succeeded"
    assert rows_of(pg_conn.execute(f"SELECT * FROM reports.{target}").fetchall()) == \
        rows_of(pg_conn.execute(fill(report.postgres)).fetchall())


def test_every_allowed_function_is_a_spark_built_in(spark):
    """A built-in function, or a call form of Spark's grammar (TIMESTAMPDIFF(unit, a, b))."""
    built_in = {row[0] for row in spark.sql("SHOW SYSTEM FUNCTIONS").collect()}
    keywords = {row[0].lower() for row in spark.sql("SELECT * FROM sql_keywords()").collect()}
    assert sorted(ALLOWED_FUNCTIONS - built_in) == ["timestampadd", "timestampdiff"]
    assert sorted(ALLOWED_FUNCTIONS - built_in - keywords) == []


def _seq(scala_seq) -> list:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def spark_parse(spark, sql: str) -> dict[str, set[str]]:
    """What Spark's own parser makes of `sql`: the relations and functions it names, the CTEs it
    defines, its one-part column names and every plan and expression class."""
    found: dict[str, set[str]] = {"relations": set(), "ctes": set(), "functions": set(), "columns": set(),
                                  "classes": set()}

    def plan(node) -> None:
        name = node.getClass().getSimpleName()
        found["classes"].add(name)
        if name == "UnresolvedRelation":
            found["relations"].add(node.tableName())
        if name == "UnresolvedWith":
            for pair in _seq(node.cteRelations()):
                found["ctes"].add(pair._1())
                plan(pair._2())
        for child in _seq(node.expressions()):
            expression(child)
        for child in _seq(node.children()):
            plan(child)

    def expression(node) -> None:
        name = node.getClass().getSimpleName()
        found["classes"].add(name)
        if name == "UnresolvedFunction":
            found["functions"].add(".".join(_seq(node.nameParts())).lower())
        elif name == "UnresolvedGenerator":
            found["functions"].add(node.name().funcName().lower())
        elif name == "UnresolvedAttribute" and node.nameParts().size() == 1:
            found["columns"].add(node.nameParts().apply(0))
        elif name in ("ScalarSubquery", "Exists", "ListQuery", "LateralSubquery"):
            plan(node.plan())
        for child in _seq(node.children()):
            expression(child)

    plan(spark._jsparkSession.sessionState().sqlParser().parsePlan(sql))
    return found


@pytest.mark.parametrize("text", [r.report for r in LEGITIMATE] + ODD_BUT_ACCEPTED,
                         ids=[r.id for r in LEGITIMATE] + [f"odd-{i}" for i in range(len(ODD_BUT_ACCEPTED))])
def test_spark_reads_the_guarded_sql_as_the_guard_does(spark, unified_views, text):
    checked = check_query(parse_report(fill(text), "adhoc").sql, unified_views)
    found = spark_parse(spark, checked.sql)
    assert found["relations"] <= {serve_job.sql_guard.view_name(t) for t in checked.tables} | found["ctes"]
    assert found["functions"] <= ALLOWED_FUNCTIONS | GUARD_FUNCTIONS  # the guard's own bounds call raise_error
    assert not [c for c in found["columns"] for f in SPARK_PARENTHESIS_FREE_FUNCTIONS if could_fold_to(c, f)]
    assert found["classes"] <= CATALYST_CLASSES

"""The report sandbox by allow-list (invariant 13) against its corpus: every hostile report is
refused naming the construct, every legitimate one passes and reads only the unified views."""

from __future__ import annotations

import pytest
import sqlglot
from coldharbor.capture.registry import RegisteredTable
from coldharbor.runtime.errors import ReportError
from coldharbor.runtime.settings import PROJECT_DIR
from coldharbor.serve.report_spec import load_reports, parse_report
from coldharbor.serve.sql_check import DIALECT
from coldharbor.serve.sql_guard import check_query, parse_query
from coldharbor.serve.sql_names import table_references
from sqlglot import exp

from tests.report_corpus import REGISTERED, fill, hostile, legitimate

HOSTILE = hostile()
LEGITIMATE = legitimate()


def test_the_corpus_holds_enough_distinct_reports():
    assert len(HOSTILE) >= 60 and len(LEGITIMATE) >= 20
    assert len({r.id for r in HOSTILE}) == len(HOSTILE)
    assert len({r.id for r in LEGITIMATE}) == len(LEGITIMATE)


@pytest.mark.parametrize("report", HOSTILE, ids=[r.id for r in HOSTILE])
def test_every_hostile_report_is_refused_naming_the_construct(report):
    with pytest.raises(ReportError) as refused:
        check_query(fill(report.sql), REGISTERED)
    assert report.refused in str(refused.value), report.harm


@pytest.mark.parametrize("report", LEGITIMATE, ids=[r.id for r in LEGITIMATE])
def test_every_legitimate_report_passes_and_reads_only_the_views(report):
    spec = parse_report(fill(report.report), "adhoc")
    checked = check_query(spec.sql, REGISTERED)
    assert checked.parameters <= {p.name for p in spec.params}
    tree = sqlglot.parse_one(checked.sql, read=DIALECT)
    assert {t.name for t in table_references(tree)} <= {f"_ch_view_{t.table_id}" for t in checked.tables}


def test_typed_and_anonymous_functions_resolve_against_the_one_list():
    typed = parse_query("SELECT datediff(order_date, order_date) FROM sb_orders").tree  # exp.DateDiff
    anonymous = parse_query("SELECT sum(amount) FROM sb_orders").tree  # kept as written: exp.Anonymous
    assert typed.find(exp.DateDiff) and anonymous.find(exp.Anonymous).name == "sum"
    for text, name in (("SELECT current_user() FROM sb_orders", "current_user"),  # exp.CurrentUser
                       ("SELECT reflect('a', 'b') FROM sb_orders", "reflect")):    # exp.Anonymous
        with pytest.raises(ReportError, match=f"function {name} is not allowed"):
            parse_query(text)


def test_a_bare_column_spark_would_call_is_refused_and_a_qualified_one_passes():
    for name in ("user", "USER", "`session_user`", "`current_date`", "`u\u017fer`"):
        with pytest.raises(ReportError, match="Spark reads a bare"):
            parse_query(f"SELECT o.order_id, {name} FROM sb_orders o")
    checked = check_query("SELECT o.user, o.current_date FROM sb_orders o", REGISTERED)
    assert "`o`.`user`" in checked.sql


def test_spark_runs_sql_regenerated_from_the_checked_tree():
    checked = check_query("SELECT /* a comment */ order_id, 'it''s' AS q -- trailing\nFROM sb_orders", REGISTERED)
    assert "comment" not in checked.sql and "trailing" not in checked.sql
    assert checked.sql == "SELECT `order_id`, 'it\\'s' AS `q` FROM `_ch_view_1` AS `sb_orders`"
    [literal] = [lit for lit in sqlglot.parse_one(checked.sql, read=DIALECT).find_all(exp.Literal) if lit.is_string]
    assert literal.this == "it's"  # Spark 4 reads '' inside a literal as one quote; so does the check


def test_ctes_resolve_by_scope():
    checked = check_query("WITH a AS (SELECT * FROM sb_orders), b AS (SELECT * FROM a) SELECT * FROM b", REGISTERED)
    assert "FROM `a`" in checked.sql and "FROM `b`" in checked.sql and [t.table_id for t in checked.tables] == [1]
    with pytest.raises(ReportError, match="table a is not a registered table"):
        check_query("SELECT * FROM (WITH a AS (SELECT * FROM sb_orders) SELECT * FROM a) s JOIN a ON true", REGISTERED)


def test_the_shipped_reports_pass_the_allow_list():
    registered = [RegisteredTable(1, "public", "demo_orders", ("order_id",), None, (), ()),
                  RegisteredTable(2, "entities", "demo_customer", ("row_id",), None, (), (), None, "entity")]
    reports = load_reports(PROJECT_DIR / "sql" / "reports")
    assert len(reports) == 3
    for spec in reports.values():
        assert check_query(spec.sql, registered).parameters == {p.name for p in spec.params}

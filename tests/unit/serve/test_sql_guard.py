"""Report SQL validation: the injection corpus is refused with a clear message, good SQL passes."""

from __future__ import annotations

import re

import pytest
import sqlglot
from coldharbor.capture.registry import RegisteredTable
from coldharbor.runtime.errors import ReportError
from coldharbor.serve import sql_guard
from coldharbor.serve.sql_check import DIALECT
from coldharbor.serve.sql_feeds import FeedPoint
from coldharbor.serve.sql_guard import check_query
from sqlglot import exp

ORDERS = RegisteredTable(1, "public", "orders", ("id",), None, (), ())
CUSTOMERS = RegisteredTable(2, "shop", "customers", ("id",), None, (), ())
OTHER_ORDERS = RegisteredTable(3, "archive", "orders", ("id",), None, (), ())
REGISTERED = [ORDERS, CUSTOMERS]

INJECTIONS = [
    ("SELECT * FROM orders; DROP TABLE orders", "exactly one SELECT; this SQL holds 2 statements"),
    ("SELECT 1 FROM orders; SELECT 2 FROM orders", "holds 2 statements"),
    ("DROP TABLE orders", "this SQL is a DROP statement"),
    ("DELETE FROM orders", "this SQL is a DELETE statement"),
    ("INSERT INTO orders SELECT * FROM orders", "this SQL is a INSERT statement"),
    ("CREATE TABLE x AS SELECT * FROM orders", "this SQL is a CREATE statement"),
    ("SET spark.sql.runSQLOnFiles=true", "this SQL is a SET statement"),
    ("ADD JAR /tmp/evil.jar", "this SQL is a ADD JAR statement"),
    ("CACHE TABLE orders", "read-only SELECT"),
    ("SELECT * INTO copy FROM orders", "may not contain INTO"),
    ("SELECT * FROM parquet.`/etc/passwd`", "table parquet./etc/passwd is not a registered table"),
    ("SELECT * FROM csv.`/etc/passwd`", "is not a registered table"),
    ("SELECT * FROM delta.`/tmp/lake/public/orders`", "is not a registered table"),
    ("SELECT * FROM read_files('/etc')", "function read_files is not allowed"),
    ("SELECT reflect('java.lang.System', 'exit', '1') FROM orders", "function reflect is not allowed"),
    ("SELECT java_method('java.lang.Runtime', 'getRuntime') FROM orders", "function java_method is not allowed"),
    ("SELECT input_file_name() FROM orders", "function input_file_name is not allowed"),
    ("SELECT * FROM range(10)", "reads registered tables only"),
    ("SELECT * FROM pg_catalog.pg_authid", "is not a registered table"),
    ("SELECT * FROM coldharbor.change_log", "is not a registered table"),
    ("SELECT * FROM _ch_view_1", "table _ch_view_1 is not a registered table"),
    ("SELECT * FROM global_temp.anything", "is not a registered table"),
    ("SELECT * FROM spark_catalog.default.orders", "is not a registered table"),
    ("SELECT /*+ BROADCAST(o) */ * FROM orders o", "may not contain HINT"),
    ("SELECT * FROM orders WHERE id = 1 UNION SELECT * FROM secrets", "table secrets is not a registered table"),
    ("", "has no SQL"),
    ("SELECT * FROM orders WHERE (", "does not parse"),
    ("SELECT 1", "reads no registered table"),
    ('WITH "x\n" AS (SELECT id FROM orders) SELECT * FROM "x\n"', "CTE name 'x\\n' is not allowed"),
]


@pytest.mark.parametrize("text, message", INJECTIONS)
def test_the_injection_corpus_is_refused(text, message):
    with pytest.raises(ReportError, match=re.escape(message)):
        check_query(text, REGISTERED)


def test_quotes_and_comments_stay_inside_literals():
    checked = check_query("SELECT * FROM orders WHERE note = 'x; DROP TABLE orders; --' -- trailing; comment",
                          REGISTERED)
    [statement] = sqlglot.parse(checked.sql, read=DIALECT)
    [literal] = [lit for lit in statement.find_all(exp.Literal) if lit.is_string]
    assert literal.this == "x; DROP TABLE orders; --"
    # A doubled quote is one quote inside the literal (as Spark 4 reads it), not its end.
    checked = check_query("SELECT * FROM orders WHERE 'a' = 'a'' OR 1=1; DROP TABLE orders; --'", REGISTERED)
    [statement] = sqlglot.parse(checked.sql, read=DIALECT)
    assert [lit.this for lit in statement.find_all(exp.Literal)] == ["a", "a' OR 1=1; DROP TABLE orders; --"]


def test_tables_resolve_to_their_views_keeping_aliases_and_clauses():
    checked = check_query("""WITH big AS (SELECT * FROM orders WHERE amount > :min)
        SELECT c.name, count(*) AS n FROM big JOIN shop.customers c ON big.customer_id = c.id
        GROUP BY c.name""", REGISTERED)
    assert {t.table_id for t in checked.tables} == {1, 2}
    assert "`_ch_view_1` AS `orders`" in checked.sql and "`_ch_view_2` AS `c`" in checked.sql
    assert checked.parameters == frozenset({"min"})
    renamed = check_query("SELECT o.a FROM orders AS o(a, b, c)", REGISTERED)
    assert "`_ch_view_1` AS `o`(`a`, `b`, `c`)" in renamed.sql
    with pytest.raises(ReportError, match="may not contain SAMPLE in TABLE"):  # random: not a function of the data
        check_query("SELECT orders.id FROM orders TABLESAMPLE (10 PERCENT)", REGISTERED)


MIXED = RegisteredTable(4, "public", "CaseT", ("id",), None, (), ())
LOWER = RegisteredTable(5, "public", "caset", ("id",), None, (), ())


@pytest.mark.parametrize("order", [[MIXED, LOWER], [LOWER, MIXED]], ids=["mixed first", "lower first"])
def test_tables_whose_names_differ_only_in_case_are_told_apart_by_the_exact_spelling(order):
    """Before, the second registered overwrote the first: `public.CaseT` read public.caset (20 rows
    for 10), and which one it read depended on the order of registration."""
    for sql, table_id in [("SELECT * FROM public.CaseT", 4), ("SELECT * FROM `public`.`CaseT`", 4),
                          ("SELECT * FROM CaseT", 4), ("SELECT * FROM public.caset", 5), ("SELECT * FROM caset", 5)]:
        assert [t.table_id for t in check_query(sql, order).tables] == [table_id], sql
    for sql in ["SELECT * FROM public.CASET", "SELECT * FROM Caset"]:
        with pytest.raises(ReportError, match="differ only in case; write the name in its exact case"):
            check_query(sql, order)
    # one table alone answers to any case, as Spark's names do
    assert [t.table_id for t in check_query("SELECT * FROM PUBLIC.CASET", [MIXED]).tables] == [4]


def test_a_bare_name_in_two_schemas_must_be_qualified():
    with pytest.raises(ReportError, match="table name orders is ambiguous"):
        check_query("SELECT * FROM orders", [ORDERS, OTHER_ORDERS])
    checked = check_query("SELECT * FROM archive.orders", [ORDERS, OTHER_ORDERS])
    assert [t.table_id for t in checked.tables] == [3]


def test_a_change_feed_stands_as_a_table_with_its_points_taken_as_written():
    checked = sql_guard.check_query(
        "SELECT c.id, o.amount FROM changes(public.orders, :since, 'now') c "
        "JOIN orders o ON o.id = c.id UNION ALL SELECT id, 0 FROM changes('shop.customers', 3, '2026-11-28T06:00Z')",
        REGISTERED)
    assert checked.sql == ("SELECT `c`.`id`, `o`.`amount` FROM `_ch_feed_0` AS `c` JOIN `_ch_view_1` AS `o` "
                           "ON `o`.`id` = `c`.`id` UNION ALL SELECT `id`, 0 FROM `_ch_feed_1` AS `changes`")
    assert [(f.view, f.table, f.start, f.end) for f in checked.feeds] == [
        ("_ch_feed_0", ORDERS, FeedPoint("param", "since"), FeedPoint("text", "now")),
        ("_ch_feed_1", CUSTOMERS, FeedPoint("version", 3), FeedPoint("text", "2026-11-28T06:00Z"))]
    assert checked.tables == (ORDERS,) and checked.read_tables == (ORDERS, CUSTOMERS)
    assert checked.parameters == {"since"}
    assert sql_guard.check_query("SELECT * FROM changes(orders, 0, 'now')", REGISTERED).tables == ()


@pytest.mark.parametrize("text, message", [
    ("SELECT * FROM changes(orders, 0)", "changes() takes three arguments, a table, from and to (2 given)"),
    ("SELECT * FROM changes(orders, 0, 'now', 1)", "(4 given)"),
    ("SELECT * FROM changes(orders, now(), 'now')", "the from point of changes() is a string"),
    ("SELECT * FROM changes(orders, 0, 'now' || '')", "the to point of changes() is a string"),
    ("SELECT * FROM changes(orders, -1, 'now')", "the from point of changes() is a string"),
    ("SELECT * FROM changes(orders, 1e3, 'now')", "the from point of changes() is a string"),
    ("SELECT * FROM changes(orders, (SELECT max(id) FROM orders), 'now')", "the from point of changes() is a string"),
    ("SELECT * FROM changes(?, 0, 'now')", "the first argument of changes() is a registered table's name"),
    ("SELECT * FROM changes(a.b.c, 0, 'now')", "the first argument of changes() is a registered table's name"),
    ("SELECT * FROM changes('a.b.c', 0, 'now')", "the first argument of changes() is a registered table's name"),
    ("SELECT * FROM changes('', 0, 'now')", "the first argument of changes() is a registered table's name"),
    ("SELECT * FROM changes(upper('orders'), 0, 'now')", "the first argument of changes() is a registered table's"),
    ("SELECT * FROM changes(nope, 0, 'now')", "table nope is not a registered table"),
    ("SELECT * FROM changes('orders; DROP TABLE x', 0, 'now')", "not a registered table"),
    ("SELECT * FROM _ch_feed_0", "the prefix _ch_feed_ is reserved"),
    ("SELECT * FROM changes(orders, 0, 'now') JOIN _CH_FEED_0 ON true", "the prefix _ch_feed_ is reserved"),
    ("SELECT changes(orders, 0, 'now') FROM orders", "function changes is not allowed in a report"),
    ("SELECT * FROM changes(orders, 0, 'now') TABLESAMPLE (10 PERCENT)", "may not contain SAMPLE"),
    ("SELECT * FROM other_changes(orders, 0, 'now')", "function other_changes is not allowed in a report as a table"),
])
def test_a_change_feed_call_other_than_a_name_and_two_points_is_refused(text, message):
    with pytest.raises(ReportError, match=re.escape(message)):
        sql_guard.check_query(text, REGISTERED)


def test_an_unknown_table_is_named_on_one_line_with_a_few_registered_ones():
    many = [RegisteredTable(10 + n, "public", f"t{n:02d}\nx", ("id",), None, (), ()) for n in range(25)]
    with pytest.raises(ReportError) as refused:
        check_query('SELECT * FROM "no\nsuch"', many)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("table no\\nsuch is not a registered table (registered: public.t00\\nx, ")
    assert message.endswith("public.t09\\nx and 15 more)")

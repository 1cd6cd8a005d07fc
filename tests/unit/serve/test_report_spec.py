"""Report definitions: header parsing, typed parameters, the target allow-list."""

from __future__ import annotations

import re
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path

import pytest
from coldharbor.runtime import settings
from coldharbor.runtime.errors import ReportError
from coldharbor.serve.report_spec import (
    ParamSpec,
    check_target,
    load_reports,
    missing_report,
    parse_report,
    read_report_files,
)

REPORT = """-- report: revenue
-- target: reports.revenue_by_day
-- sink: delta
-- schedule: @daily
-- param: since date
-- param: min_amount decimal(10,2) = 0.5
-- param: label string = all
SELECT * FROM orders WHERE day >= :since AND amount >= :min_amount
"""


def test_header_and_typed_parameters():
    spec = parse_report(REPORT, "file_name", "revenue.sql")
    assert (spec.name, spec.target, spec.sink, spec.schedule) == ("revenue", "revenue_by_day", "delta", "@daily")
    assert spec.sql.startswith("SELECT * FROM orders")
    assert spec.bind({"since": "2026-01-02"}) == {"since": date(2026, 1, 2), "min_amount": Decimal("0.50"),
                                                  "label": "all"}


@pytest.mark.parametrize("raw, message", [
    ({}, "needs a value for parameter since"),
    ({"since": "yesterday"}, "parameter since: 'yesterday' is not a valid date"),
    ({"since": "2026-01-02", "min_amount": "1e400"}, "parameter min_amount"),
    ({"since": "2026-01-02", "min_amount": "123456789.12"}, "not a valid decimal(10,2)"),
    ({"since": "2026-01-02", "min_amount": "NaN"}, "not a valid decimal(10,2)"),
    ({"since": "2026-01-02", "other": "1"}, "has no parameter other"),
])
def test_bad_parameters_are_refused_by_name(raw, message):
    with pytest.raises(ReportError, match=re.escape(message)):
        parse_report(REPORT, "revenue").bind(raw)


def test_parameter_types():
    spec = parse_report("-- param: n int\n-- param: b boolean\n-- param: t timestamp\n-- param: x double\n"
                        "SELECT 1 FROM orders", "p")
    values = spec.bind({"n": "-7", "b": "false", "t": "2026-01-02T03:04:05", "x": "2.5"})
    assert values == {"n": -7, "b": False, "t": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc), "x": 2.5}
    with pytest.raises(ReportError, match="parameter n: '2147483648' is not a valid int"):
        spec.bind({"n": "2147483648", "b": "true", "t": "2026-01-02", "x": "1"})
    with pytest.raises(ReportError, match="parameter n: '1; DROP TABLE x' is not a valid int"):
        spec.bind({"n": "1; DROP TABLE x", "b": "true", "t": "2026-01-02", "x": "1"})


@pytest.mark.parametrize("type_, raw, value", [
    # Found by a cold attack: Python's parsers took these, each read as something else or rounded
    # half to even where PostgreSQL and Spark round half up.
    ("decimal(12,2)", "1.005", Decimal("1.01")), ("decimal(12,2)", "-0.125", Decimal("-0.13")),
    ("decimal(12,2)", "0.125", Decimal("0.13")), ("decimal(12,2)", "1_000", None), ("decimal(12,2)", "١٢٣", None),
    ("decimal", " 2.5 ", Decimal("2.5")), ("decimal", "Infinity", None), ("decimal", "1e-39", None),
    ("decimal", "0e-50", Decimal("0E-38")), ("decimal", "1" * 39, None), ("double", "\u00a05", None),
    ("int", "1_000", None), ("int", "١٢٣", None), ("int", " +12 ", 12), ("bigint", "0x10", None),
    ("double", "1e400", None), ("double", "1e-400", None), ("double", "1_0", None), ("double", "-0", -0.0),
    ("double", "-Infinity", float("-inf")), ("double", "1e-300", 1e-300), ("double", "0e5", 0.0),
    ("date", "2026-W01-1", None), ("date", "20260101", None), ("date", "2026-02-28", date(2026, 2, 28)),
    ("timestamp", "2026-01-01T00:00:00.1234567", None), ("timestamp", "2026-01-01 05:06", datetime(
        2026, 1, 1, 5, 6, tzinfo=timezone.utc)), ("timestamp", "2026-01-01T00:00Z", datetime(2026, 1, 1, tzinfo=timezone.utc)),
])
def test_parameter_values_take_one_plain_form(type_, raw, value):
    spec = ParamSpec("p", type_)
    if value is None:
        with pytest.raises(ReportError, match=f"parameter p: {re.escape(repr(raw))} is not a valid"):
            spec.parse(raw)
    else:
        parsed = spec.parse(raw)
        assert parsed == value and str(parsed) == str(value)


@pytest.mark.parametrize("text, message", [
    ("-- report: r\n-- a plain comment\n-- param: n int\nSELECT 1", "the header line '-- param:' stands after"),
    ("-- param: s string = a\x00b\nSELECT 1", "parameter s: the value holds a NUL character"),
    ("-- param: n decimal(50,0)\nSELECT 1", "type 'decimal\\(50,0\\)' is not a decimal Spark holds"),
    ("-- param: n decimal(2,3)\nSELECT 1", "type 'decimal\\(2,3\\)' is not a decimal Spark holds"),
    ("-- param: n decimal(0,0)\nSELECT 1", "type 'decimal\\(0,0\\)' is not a decimal Spark holds"),
    ("-- sink: s3\nSELECT 1", "sink 's3' is not one of postgres, delta"),
    ("-- target: public.orders\nSELECT 1", "report tables live in the reports schema"),
    ("-- target: reports.\"x; drop\"\nSELECT 1", "is not allowed"),
    ("-- param: n integer\nSELECT 1", "type 'integer' is not one of"),
    ("-- param: n int = abc\nSELECT 1", "parameter n: 'abc' is not a valid int"),
    ("-- colour: red\nSELECT 1", "unknown header 'colour'"),
    ("-- refresh: incrementally\nSELECT 1", "refresh 'incrementally' is not one of full, incremental"),
    ("-- report: Bad-Name\nSELECT 1", "report name 'Bad-Name' is not allowed"),
])
def test_malformed_headers_are_refused(text, message):
    with pytest.raises(ReportError, match=message):
        parse_report(text, "r")


def test_targets_come_from_the_allow_list():
    reports = {"revenue": parse_report(REPORT, "revenue", "revenue.sql")}
    assert check_target("reports.revenue_by_day", reports["revenue"], reports) == "revenue_by_day"
    with pytest.raises(ReportError, match=r"writes reports.revenue_by_day \(or an adhoc_\* table when run ad hoc\), "
                                          "not other"):
        check_target("other", reports["revenue"], reports)
    # Run ad hoc (the ad-hoc DAG's form), a report file writes an adhoc_* table no report file declares.
    assert check_target("adhoc_revenue", reports["revenue"], reports) == "adhoc_revenue"
    other = {**reports, "taken": parse_report("-- target: adhoc_taken\nSELECT 1", "taken", "taken.sql")}
    with pytest.raises(ReportError, match="not allowed for an ad-hoc run"):
        check_target("adhoc_taken", reports["revenue"], other)
    adhoc = parse_report("SELECT 1 FROM orders", "adhoc")
    assert check_target("adhoc_mine", adhoc, reports) == "adhoc_mine"
    for refused in ("revenue_by_day", "mine", "adhoc_Mine", "adhoc_x; drop table y", "pg_catalog.adhoc_x", "adhoc_nl\n"):
        with pytest.raises(ReportError):
            check_target(refused, adhoc, reports)


def test_the_shipped_reports_parse():
    reports = load_reports(settings.REPORTS_DIR)
    assert {"demo_orders_by_status", "demo_top_customers"} <= set(reports)
    for spec in reports.values():
        spec.bind({})  # every shipped parameter has a valid default


def test_a_second_file_with_a_taken_report_name_is_left_out_naming_both(tmp_path: Path):
    (tmp_path / "a.sql").write_text("-- report: same\nSELECT 1")
    (tmp_path / "b.sql").write_text("-- report: same\nSELECT 2")
    files = read_report_files(tmp_path)
    assert files.reports["same"].sql == "SELECT 1"
    assert files.errors == {str(tmp_path / "b.sql"): f"defines report same, which {tmp_path / 'a.sql'} defines already"}


def test_one_malformed_report_file_breaks_only_its_own_report(tmp_path: Path):
    (tmp_path / "good.sql").write_text("-- schedule: @hourly\nSELECT 1 AS x FROM t")
    (tmp_path / "bad_header.sql").write_text("-- colour: red\nSELECT 1")
    (tmp_path / "latin1.sql").write_bytes("-- report: caf\xe9\nSELECT 1".encode("latin-1"))
    files = read_report_files(tmp_path)
    assert set(files.reports) == {"good"} and set(load_reports(tmp_path)) == {"good"}
    assert files.errors == {str(tmp_path / "bad_header.sql"): "unknown header 'colour' (known: report, target, sink, "
                                                               "schedule, start, refresh, param, description)",
                            str(tmp_path / "latin1.sql"): "is not UTF-8 text"}
    assert missing_report("latin1", tmp_path, files.reports) == f"report file {tmp_path / 'latin1.sql'} cannot be " \
                                                                 "served: is not UTF-8 text"
    assert missing_report("nope", tmp_path, files.reports) == f"no report named 'nope' under {tmp_path} (known: good)"


def test_a_start_date_makes_the_schedule_catch_up_and_a_bad_one_is_refused():
    from datetime import date

    spec = parse_report("-- schedule: @daily\n-- start: 2026-11-20\nSELECT 1 AS x FROM t", "r")
    assert spec.start == date(2026, 11, 20)
    assert parse_report("SELECT 1 AS x FROM t", "r").start is None
    with pytest.raises(ReportError, match="start 'yesterday' is not a date"):
        parse_report("-- start: yesterday\nSELECT 1 AS x FROM t", "r")


def test_a_parameter_given_twice_on_the_command_line_is_refused():
    from coldharbor.serve.serve_cli import _raw_params

    assert _raw_params(["a=1", "b= x=y "]) == {"a": "1", "b": " x=y "}
    with pytest.raises(ReportError, match="--param s is given twice: give each parameter one value"):
        _raw_params(["s=1", "s=2"])

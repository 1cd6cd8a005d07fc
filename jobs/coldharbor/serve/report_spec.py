"""Report definitions: a header of `-- key: value` lines, then one SELECT.

    -- report: orders_by_status          (defaults to the file name)
    -- target: reports.orders_by_status  (reports.<name>; Delta: the report's folder under the lake)
    -- sink: postgres                    (postgres | delta)
    -- schedule: @hourly                 (cron or preset; none = run on demand only)
    -- start: 2026-11-22                 (catch up every interval from this date; absent: forward only)
    -- param: min_amount decimal(12,2) = 0
    -- refresh: full                      (full | incremental: apply only what changed, coldharbor.serve.incremental)
    SELECT status, count(*) AS orders FROM demo_orders WHERE amount >= :min_amount GROUP BY status

Parameters are typed, and bound into the checked query as typed literals (`:name` markers,
coldharbor.serve.sql_params), never formatted into the SQL text.
Targets come from an allow-list: the targets the report files declare, plus `adhoc_*` names.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import InvalidOperation
from pathlib import Path

from coldharbor.runtime.errors import ReportError
from coldharbor.serve.param_values import DECIMAL, MAX_DECIMAL_PRECISION, PARSERS

log = logging.getLogger(__name__)

REPORTS_SCHEMA = "reports"
SINKS = ("postgres", "delta")
# Lower-case PostgreSQL-safe names only; no quoting is ever needed, so none can be abused.
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,47}")  # whole names only: fullmatch (a "$" takes a trailing newline)
ADHOC_PREFIX = "adhoc_"
_HEADER = re.compile(r"^--\s*([a-z_]+)\s*:\s*(.*?)\s*$")
_PARAM = re.compile(r"^([a-z][a-z0-9_]*)\s+([a-z_]+(?:\(\s*[0-9]+\s*,\s*[0-9]+\s*\))?)(?:\s*=\s*(.*))?$")
REFRESH_MODES = ("full", "incremental")
HEADER_KEYS = ("report", "target", "sink", "schedule", "description", "start", "refresh", "param")
PARAM_TYPES = ("string", "int", "bigint", "double", "decimal", "boolean", "date", "timestamp")


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: str                   # one of PARAM_TYPES; decimal(p,s) keeps its precision
    default: str | None = None  # as written in the header; None: the parameter is required

    def parse(self, raw: str) -> object:
        """The typed value of `raw`, or a ReportError naming the parameter."""
        if "\x00" in raw:
            raise ReportError(f"parameter {self.name}: the value holds a NUL character, which PostgreSQL text "
                              "(report tables, the run's record) cannot hold")
        try:
            return PARSERS[self.base_type](raw, self.type)
        except (ValueError, InvalidOperation) as exc:
            raise ReportError(f"parameter {self.name}: {raw!r} is not a valid {self.type}") from exc

    @property
    def base_type(self) -> str:
        return "decimal" if self.type.startswith("decimal") else self.type


class ParamValues(dict):
    """A report's parameter values by name (typed: int, Decimal, date...), and in `types` the type
    each was declared with (`int`, `decimal(12,2)`...), which its literal takes (sql_params)."""

    def __init__(self, values: Mapping[str, object], types: Mapping[str, str]):
        super().__init__(values)
        self.types = dict(types)


@dataclass(frozen=True)
class ReportSpec:
    name: str
    sql: str
    target: str                      # bare name inside the reports schema / the Delta reports folder
    sink: str = "postgres"
    schedule: str | None = None
    params: tuple[ParamSpec, ...] = field(default_factory=tuple)
    source: str | None = None        # file it came from; None for ad-hoc SQL
    start: date | None = None        # first interval a schedule catches up from (None: forward only)
    refresh: str = "full"            # full | incremental (REFRESH_MODES)

    def bind(self, raw: Mapping[str, str]) -> ParamValues:
        """Typed values for every declared parameter; unknown or missing ones are refused."""
        declared = {p.name: p for p in self.params}
        unknown = sorted(set(raw) - set(declared))
        if unknown:
            raise ReportError(f"report {self.name} has no parameter {', '.join(unknown)} "
                              f"(it declares: {', '.join(declared) or 'none'})")
        values = {}
        for name, param in declared.items():
            text = raw.get(name, param.default)
            if text is None:
                raise ReportError(f"report {self.name} needs a value for parameter {name} ({param.type})")
            values[name] = param.parse(text)
        return ParamValues(values, {p.name: p.type for p in self.params})


def check_name(kind: str, name: str) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise ReportError(f"{kind} {name!r} is not allowed: use lower-case letters, digits and _, "
                          "starting with a letter, at most 48 characters")
    return name


def target_name(target: str) -> str:
    """`reports.x` or `x` -> `x`, checked against the name pattern."""
    schema, _, name = target.rpartition(".")
    if schema and schema != REPORTS_SCHEMA:
        raise ReportError(f"target {target!r} is not allowed: report tables live in the {REPORTS_SCHEMA} schema")
    return check_name("target", name)


def parse_param(text: str) -> ParamSpec:
    match = _PARAM.match(text.strip())
    if not match:
        raise ReportError(f"parameter declaration {text!r} is not of the form 'name type [= default]'")
    name, type_, default = match[1], match[2].replace(" ", ""), match[3]
    base = "decimal" if type_.startswith("decimal") else type_
    if base not in PARAM_TYPES:
        raise ReportError(f"parameter {name}: type {type_!r} is not one of {', '.join(PARAM_TYPES)}")
    decimal = DECIMAL.match(type_)
    if decimal and not (1 <= int(decimal[1]) <= MAX_DECIMAL_PRECISION and 0 <= int(decimal[2]) <= int(decimal[1])):
        raise ReportError(f"parameter {name}: type {type_!r} is not a decimal Spark holds: decimal(p,s) takes "
                          f"1 <= p <= {MAX_DECIMAL_PRECISION} digits, s of them after the point")
    spec = ParamSpec(name, type_, default)
    if default is not None:
        spec.parse(default)
    return spec


def parse_report(text: str, default_name: str, source: str | None = None) -> ReportSpec:
    """A report file's text -> ReportSpec; ReportError naming the line that is wrong."""
    header: dict[str, str] = {}
    params: list[ParamSpec] = []
    body: list[str] = []
    for line in text.splitlines():
        match = _HEADER.match(line) if not body else None
        if match:
            key, value = match[1], match[2]
            if key == "param":
                params.append(parse_param(value))
            elif key in HEADER_KEYS:
                header[key] = value
            else:
                raise ReportError(f"{source or default_name}: unknown header '{key}' "
                                  "(known: report, target, sink, schedule, start, refresh, param, description)")
        elif line.strip() or body:
            late = _HEADER.match(line)
            if late and late[1] in HEADER_KEYS:
                raise ReportError(f"{source or default_name}: the header line '-- {late[1]}:' stands after the "
                                  "report's SQL (or a plain comment) began: header lines come first, one after another")
            body.append(line)
    name = check_name("report name", header.get("report", default_name))
    sink = header.get("sink", "postgres")
    if sink not in SINKS:
        raise ReportError(f"report {name}: sink {sink!r} is not one of {', '.join(SINKS)}")
    if len({p.name for p in params}) != len(params):
        raise ReportError(f"report {name}: a parameter is declared twice")
    schedule = header.get("schedule") or None
    refresh = header.get("refresh", "full")
    if refresh not in REFRESH_MODES:
        raise ReportError(f"report {name}: refresh {refresh!r} is not one of {', '.join(REFRESH_MODES)}")
    try:
        start = date.fromisoformat(header["start"]) if header.get("start") else None
    except ValueError:
        raise ReportError(f"report {name}: start {header['start']!r} is not a date (YYYY-MM-DD)") from None
    return ReportSpec(start=start, name=name, sql="\n".join(body).strip(), target=target_name(header.get("target", name)),
                      sink=sink, schedule=None if schedule == "none" else schedule, params=tuple(params),
                      source=source, refresh=refresh)


@dataclass(frozen=True)
class ReportFiles:
    """The report files of a folder: the well-formed ones by report name, and what is wrong with
    each of the others, by file."""

    reports: dict[str, ReportSpec]
    errors: dict[str, str]


def read_report_files(folder: Path) -> ReportFiles:
    """Every .sql file under `folder`, each parsed on its own: one malformed file (a bad header,
    not UTF-8, a report name another file took) is an error of that file only."""
    reports: dict[str, ReportSpec] = {}
    errors: dict[str, str] = {}
    for path in sorted(folder.glob("*.sql")):
        try:
            spec = parse_report(path.read_text(encoding="utf-8"), path.stem, str(path))
        except UnicodeDecodeError:
            errors[str(path)] = "is not UTF-8 text"
            continue
        except OSError as exc:
            errors[str(path)] = f"cannot be read: {exc.strerror or exc}"
            continue
        except ReportError as exc:
            errors[str(path)] = str(exc).removeprefix(f"{path}: ")
            continue
        if spec.name in reports:
            errors[str(path)] = f"defines report {spec.name}, which {reports[spec.name].source} defines already"
            continue
        reports[spec.name] = spec
    return ReportFiles(reports, errors)


def load_reports(folder: Path) -> dict[str, ReportSpec]:
    """Every well-formed report under `folder` (one per .sql file), by name; a malformed file is
    left out (logged), so it breaks only its own report."""
    files = read_report_files(folder)
    for path, error in files.errors.items():
        log.warning("report file %s is left out: %s", path, error)
    return files.reports


def missing_report(name: str, folder: Path, reports: Mapping[str, ReportSpec]) -> str:
    """Why no report `name` can be served: its file is malformed (and how), or there is none."""
    for path, error in read_report_files(folder).errors.items():
        if Path(path).stem == name:
            return f"report file {path} cannot be served: {error}"
    return f"no report named {name!r} under {folder} (known: {', '.join(sorted(reports)) or 'none'})"


def allowed_targets(reports: Mapping[str, ReportSpec]) -> set[str]:
    return {spec.target for spec in reports.values()}


def check_target(target: str, report: ReportSpec | None, reports: Mapping[str, ReportSpec]) -> str:
    """The allow-list: a report file writes its declared target, or an adhoc_* table when run ad
    hoc (with other parameters, as of another time); ad-hoc SQL writes adhoc_* only."""
    name = target_name(target)
    if report is not None and report.source is not None:
        if name != report.target and not name.startswith(ADHOC_PREFIX):
            raise ReportError(f"report {report.name} writes {REPORTS_SCHEMA}.{report.target} (or an "
                              f"{ADHOC_PREFIX}* table when run ad hoc), not {name}")
        if name == report.target:
            return name
    if not name.startswith(ADHOC_PREFIX) or name in allowed_targets(reports):
        raise ReportError(f"target {name!r} is not allowed for an ad-hoc run: use a name starting with "
                          f"{ADHOC_PREFIX!r} that no report file declares")
    return name

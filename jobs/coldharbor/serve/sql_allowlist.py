"""The report sandbox's allow-list (invariant 13): the only place that says what report SQL may use.

Plain data, applied by coldharbor.serve.sql_check (and incremental_shape). Anything not named here is refused before a JVM starts.

How the lists were built
------------------------
* Functions: start from Spark 4.2's built-in functions (`SHOW SYSTEM FUNCTIONS`) and keep the
  deterministic scalar, aggregate and window functions a report over registered tables needs:
  its answer must be a function of the data it reads. Left out on purpose, so refused by name:
  reflection (reflect, java_method, try_reflect), anything reading files or the task context
  (input_file_name, spark_partition_id, ...), the session and the clock (current_user, user,
  current_date, now, unix_timestamp, current_timezone, version, ...: a scheduled report is
  answered as of its interval, so time comes in as a date or timestamp parameter), randomness
  (rand, uuid, shuffle, ...), keys and secrets (aes_*, try_aes_decrypt, secret), raising errors,
  parsers of foreign formats (xpath, from_xml, from_csv, from_avro, parse_url, ...), order-
  dependent aggregates (first, last, any_value, collect_list, collect_set, mode, listagg,
  percentile_approx), generators that make data out of nothing (range, sequence, stack,
  array_repeat) and every table-valued function. One list for both shapes a call takes in the
  parsed tree: a call kept as written (exp.Anonymous) is checked by its name; one sqlglot models
  as a class (CAST, EXTRACT, DATEDIFF, CURRENT_USER, ...) by the name the generated SQL calls.
* Nodes: the sqlglot (Spark dialect) expression classes of one SELECT: WITH, joins, subqueries,
  set operations, window functions, VALUES, CASE, casts, literals, operators and lambdas. Each
  class lists the arguments it may carry; a clause sqlglot hangs on an allowed class (a hint,
  QUALIFY, TABLESAMPLE, time travel, DISTRIBUTE BY, ...) is refused by the argument's name.
  TABLESAMPLE is refused: Spark samples with a random seed, so the answer is not a function of
  the data. Function-like classes that are syntax rather than calls (CASE, CAST, AND, RLIKE)
  are listed here; every other function class is checked by its name.
"""

from __future__ import annotations

from sqlglot import exp

ANY_ARGS: frozenset[str] | None = None  # the class's arguments are operands, each checked as a node
_OPERANDS = frozenset({"this", "expression"})
_SET_OPERATION = frozenset({"this", "expression", "distinct", "with_", "order", "limit", "offset"})

# Node class -> the arguments (sqlglot arg names) it may carry with a value.
ALLOWED_NODES: dict[type[exp.Expression], frozenset[str] | None] = {
    # query structure
    exp.Select: frozenset({"with_", "expressions", "distinct", "from_", "joins", "laterals", "where", "group",
                           "having", "windows", "order", "limit", "offset"}),
    exp.Union: _SET_OPERATION,
    exp.Except: _SET_OPERATION,
    exp.Intersect: _SET_OPERATION,
    exp.Subquery: frozenset({"this", "alias", "order", "limit", "offset"}),
    exp.With: frozenset({"expressions"}),                    # not RECURSIVE
    exp.CTE: frozenset({"this", "alias"}),
    exp.From: frozenset({"this"}),
    exp.Join: frozenset({"this", "on", "using", "side", "kind", "method"}),
    exp.Table: frozenset({"this", "db", "catalog", "alias"}),  # resolved against the registry
    exp.TableAlias: frozenset({"this", "columns"}),
    exp.Values: frozenset({"expressions", "alias"}),
    exp.Lateral: frozenset({"this", "view", "outer", "alias"}),  # LATERAL VIEW explode(...), LATERAL (subquery)
    exp.Where: frozenset({"this"}),
    exp.Group: frozenset({"expressions", "grouping_sets", "cube", "rollup", "all"}),
    exp.Rollup: frozenset({"expressions"}),
    exp.Cube: frozenset({"expressions"}),
    exp.GroupingSets: frozenset({"expressions"}),
    exp.Having: frozenset({"this"}),
    exp.Order: frozenset({"expressions"}),
    exp.Ordered: frozenset({"this", "desc", "nulls_first"}),
    exp.Limit: frozenset({"expression"}),
    exp.Offset: frozenset({"expression"}),
    exp.Distinct: frozenset({"expressions"}),
    exp.Window: frozenset({"this", "partition_by", "order", "spec", "alias", "over"}),
    exp.WindowSpec: frozenset({"kind", "start", "start_side", "end", "end_side"}),
    exp.Filter: _OPERANDS,                                   # aggregate FILTER (WHERE ...)
    exp.IgnoreNulls: frozenset({"this"}),
    exp.RespectNulls: frozenset({"this"}),
    # names and values
    exp.Alias: frozenset({"this", "alias"}),
    exp.Aliases: frozenset({"this", "expressions"}),         # explode(m) AS (k, v)
    exp.Column: frozenset({"this", "table", "db", "catalog"}),
    exp.Dot: _OPERANDS,                                       # struct field access only (checked)
    exp.Star: frozenset({"except_"}),
    exp.Identifier: frozenset({"this", "quoted"}),
    exp.Literal: frozenset({"this", "is_string"}),
    exp.Null: ANY_ARGS,
    exp.Boolean: frozenset({"this"}),
    exp.HexString: frozenset({"this"}),
    exp.Placeholder: frozenset({"this"}),                    # :name only, bound by sql_params
    exp.Interval: frozenset({"this", "unit"}),
    exp.Var: frozenset({"this"}),                            # a time unit only (TIME_UNITS)
    exp.DataType: frozenset({"this", "expressions", "nested", "values", "kind"}),
    exp.DataTypeParam: frozenset({"this"}),
    exp.Tuple: frozenset({"expressions"}),
    exp.Paren: frozenset({"this"}),
    exp.Bracket: frozenset({"this", "expressions", "offset", "safe"}),
    exp.Lambda: frozenset({"this", "expressions"}),
    exp.PropertyEQ: _OPERANDS,                                # STRUCT(a AS x)
    exp.JSONPath: ANY_ARGS,                                  # the parsed path of get_json_object
    exp.JSONPathRoot: ANY_ARGS,
    exp.JSONPathKey: ANY_ARGS,
    exp.JSONPathSubscript: ANY_ARGS,
    exp.JSONPathWildcard: ANY_ARGS,
    # syntax that sqlglot models as a function class
    exp.Case: frozenset({"this", "ifs", "default"}),
    exp.If: frozenset({"this", "true", "false"}),
    exp.Cast: frozenset({"this", "to"}),
    exp.TryCast: frozenset({"this", "to", "safe"}),
    exp.And: _OPERANDS,
    exp.Or: _OPERANDS,
    exp.Not: frozenset({"this"}),
    exp.RegexpLike: _OPERANDS,
    # operators and predicates
    **{op: _OPERANDS for op in (
        exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
        exp.Add, exp.Sub, exp.Mul, exp.IntDiv, exp.Mod,
        exp.BitwiseAnd, exp.BitwiseOr, exp.BitwiseXor, exp.BitwiseLeftShift, exp.BitwiseRightShift,
        exp.Is, exp.Like, exp.ILike)},
    exp.Div: frozenset({"this", "expression", "typed", "safe"}),  # flags of Spark's division semantics
    exp.DPipe: frozenset({"this", "expression", "safe"}),
    exp.Neg: frozenset({"this"}),
    exp.BitwiseNot: frozenset({"this"}),
    exp.Between: frozenset({"this", "low", "high"}),
    exp.In: frozenset({"this", "expressions", "query"}),
    exp.Any: frozenset({"this"}),                            # LIKE ANY (...)
    exp.All: frozenset({"this"}),
}

# Arguments that name something hold identifiers only. (sqlglot reads Spark 4's variant path
# `meta:key` as an alias named by the parameter marker :key, for one.)
NAME_ARGS: dict[type[exp.Expression], frozenset[str]] = {
    exp.Alias: frozenset({"alias"}),
    exp.Aliases: frozenset({"expressions"}),
    exp.TableAlias: frozenset({"this", "columns"}),
    exp.Column: frozenset({"table", "db", "catalog"}),
    exp.Table: frozenset({"db", "catalog"}),
    exp.Lambda: frozenset({"expressions"}),
    exp.Window: frozenset({"alias"}),
    exp.Dot: frozenset({"expression"}),
}

# Spark function names (lower case) a report may call (ALLOWED_FUNCTIONS, below), in four kinds.
AGGREGATE_FUNCTIONS = frozenset({
    "count", "sum", "avg", "mean", "min", "max", "count_if", "try_sum", "try_avg",
    "stddev", "stddev_samp", "stddev_pop", "std", "variance", "var_samp", "var_pop",
    "corr", "covar_pop", "covar_samp", "skewness", "kurtosis", "percentile", "median",
    "approx_count_distinct", "bool_and", "bool_or", "every", "some", "max_by", "min_by",
    "bit_and", "bit_or", "bit_xor", "grouping", "grouping_id",
})
# Window functions: deterministic given the window's ORDER BY.
WINDOW_FUNCTIONS = frozenset({
    "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead",
    "first_value", "last_value", "nth_value",
})
# Generators: rows out of a column of the data (LATERAL VIEW or the select list).
GENERATOR_FUNCTIONS = frozenset({
    "explode", "explode_outer", "posexplode", "posexplode_outer", "inline", "inline_outer",
})
# Row functions: one value out of one row's values (an incremental report's WHERE and GROUP BY
# take only these, coldharbor.serve.incremental).
ROW_FUNCTIONS = frozenset({
    # conditional, null handling, casts (sqlglot writes some conversions as CAST)
    "cast", "coalesce", "nvl", "nvl2", "ifnull", "nullif", "if", "nanvl", "isnull", "isnotnull", "isnan",
    "equal_null", "zeroifnull", "nullifzero", "greatest", "least",
    # numeric
    "abs", "round", "bround", "ceil", "ceiling", "floor", "sqrt", "cbrt", "pow", "power", "exp", "expm1",
    "ln", "log", "log10", "log2", "log1p", "sign", "signum", "mod", "pmod", "negative", "positive",
    "pi", "e", "degrees", "radians", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh",
    "tanh", "hypot", "factorial", "rint", "width_bucket", "try_add", "try_subtract", "try_multiply",
    "try_divide", "try_mod", "bin", "hex", "unhex", "conv", "shiftleft", "shiftright",
    "shiftrightunsigned", "bit_count", "bit_get", "getbit", "format_number",
    # string
    "upper", "ucase", "lower", "lcase", "length", "len", "char_length", "character_length", "octet_length",
    "bit_length", "trim", "ltrim", "rtrim", "btrim", "substring", "substr", "substring_index", "left",
    "right", "concat", "concat_ws", "replace", "overlay", "translate", "regexp_replace", "regexp_extract",
    "regexp_extract_all", "regexp_like", "regexp_count", "regexp_substr", "regexp_instr", "rlike", "like",
    "ilike", "split", "split_part", "lpad", "rpad", "initcap", "reverse", "instr", "locate", "position",
    "repeat", "ascii", "chr", "char", "format_string", "printf", "startswith", "endswith", "contains",
    "soundex", "levenshtein", "elt", "space", "find_in_set", "mask", "to_char", "to_varchar", "to_number",
    "try_to_number", "md5", "sha", "sha1", "sha2", "crc32", "hash", "xxhash64", "base64", "unbase64",
    "encode", "decode",
    # date and time (time itself comes in as a parameter, never from the clock)
    "date_add", "date_sub", "dateadd", "date_diff", "datediff", "timestampadd", "timestampdiff",
    "add_months", "months_between", "date_trunc", "trunc", "year", "month", "day", "dayofmonth",
    "dayofweek", "dayofyear", "weekday", "weekofyear", "quarter", "hour", "minute", "second",
    "extract", "date_part", "datepart", "dayname", "monthname", "to_date", "try_to_date",
    "to_timestamp", "try_to_timestamp", "to_timestamp_ntz", "date_format", "last_day", "next_day",
    "make_date", "make_timestamp", "make_timestamp_ntz", "make_interval", "make_dt_interval",
    "make_ym_interval", "to_unix_timestamp", "from_unixtime", "unix_date", "unix_seconds", "unix_millis",
    "unix_micros", "timestamp_seconds", "timestamp_millis", "timestamp_micros", "date_from_unix_date",
    "from_utc_timestamp", "to_utc_timestamp",
    # arrays, maps, structs and the higher-order functions over them (their lambdas are checked too)
    "array", "array_contains", "array_distinct", "array_except", "array_intersect", "array_union",
    "array_join", "array_max", "array_min", "array_position", "array_remove",
    "array_sort", "sort_array", "array_size", "arrays_overlap", "arrays_zip", "array_append",
    "array_prepend", "array_compact", "cardinality", "size", "element_at", "try_element_at", "get",
    "slice", "flatten", "map", "map_keys", "map_values", "map_entries", "map_from_arrays",
    "map_from_entries", "map_concat", "map_contains_key", "str_to_map", "struct", "named_struct",
    "transform", "filter", "exists", "forall", "aggregate", "reduce", "zip_with", "map_filter",
    "transform_keys", "transform_values", "map_zip_with",
    # JSON text held in a column
    "get_json_object", "json_tuple", "from_json", "to_json", "schema_of_json", "json_array_length",
    "json_object_keys",
    "typeof",
})
# Functions only the guard's own rewrites call (sql_guard bounds the texts repeat, space, lpad and
# rpad build with raise_error); a report that calls one itself is refused.
GUARD_FUNCTIONS = frozenset({"raise_error"})
ALLOWED_FUNCTIONS = AGGREGATE_FUNCTIONS | WINDOW_FUNCTIONS | GENERATOR_FUNCTIONS | ROW_FUNCTIONS

# Names Spark calls as functions when written as a bare column (`SELECT user FROM t` is the user
# running Spark, `current_date` the clock): Spark's LiteralFunctionResolution, which also matches
# quoted names and compares them ignoring case. A bare column so named must be on ALLOWED_FUNCTIONS.
SPARK_PARENTHESIS_FREE_FUNCTIONS = frozenset({
    "current_date", "current_timestamp", "current_time", "current_user", "user", "session_user",
    "grouping__id",
})

# The words that may stand as a bare keyword (exp.Var): units of intervals and date arithmetic.
TIME_UNITS = frozenset({
    "year", "years", "quarter", "quarters", "month", "months", "week", "weeks", "day", "days",
    "dayofyear", "hour", "hours", "minute", "minutes", "second", "seconds", "millisecond",
    "milliseconds", "microsecond", "microseconds", "nanosecond", "nanoseconds",
    "dow", "doy", "dayofweek", "yearofweek",
})

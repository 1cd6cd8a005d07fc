"""A registered table's names as the jobs take and print them: `--table` in either spelling
(`schema.table` as written, or as SQL writes it), identifiers quoted as PostgreSQL quotes them, and
the lake folder a name may be (known-safe characters only, never outside the lake root)."""

from __future__ import annotations

import re
import string

from coldharbor.runtime.errors import ConfigError, one_line


def lake_path(schema_name: str, table_name: str, lake_location: str | None, lake_root: str) -> str:
    """A registered table's lake folder (RegisteredTable.lake_path), for callers with its catalog row."""
    if lake_location:
        return lake_location
    for part in (schema_name, table_name):
        problem = lake_folder_problem(part)
        if problem:
            raise ConfigError(
                f"{quote_ident(schema_name)}.{quote_ident(table_name)} has no lake folder of its own name: {problem}; "
                f"a folder name holds letters, digits, spaces and {LAKE_FOLDER_PUNCTUATION.strip()} only, not "
                "starting with '.': an administrator registers it again with a p_lake_location")
    return f"{lake_root}/{schema_name}/{table_name}"


# What a schema or table name may hold to be its own lake folder. Known safe in a local path, an
# s3a key, a Hadoop Path and a delta-rs URL alike; everything else ('/', '\\', '%', '#', '?', ':',
# glob characters, control characters...) is refused rather than escaped, so a name can never
# leave the lake root or land in another table's folder ('../public/orders'), and the JVM and the
# Python reader always agree on the folder ('p%41q' is 'pAq' to a URL parser). Not '|' or '^'
# (delta-rs refuses them in a URL), not '@' (Delta reads 'orders@v3' as orders at version 3), and
# not the schema _coldharbor (Coldharbor's own files under the lake root).
LAKE_FOLDER_PUNCTUATION = " _-$'\"`;,<>()!&+=~."


OWN_FOLDER = "_coldharbor"


def lake_folder_problem(name: str) -> str | None:
    """Why `name` cannot be a lake folder of its own, or None."""
    if not name or name.startswith("."):
        return f"{quote_ident(name)} is empty or starts with '.'"
    if name == OWN_FOLDER:
        return f"{name} is Coldharbor's own folder"
    unsafe = next((c for c in name if not (c.isalnum() or c in LAKE_FOLDER_PUNCTUATION)), None)
    if unsafe is not None:
        return f"{quote_ident(name)} holds {one_line(repr(unsafe))}"
    return None


_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]*")


def quote_ident(name: str) -> str:
    """An identifier as PostgreSQL's quote_ident writes it, with control characters escaped."""
    if _PLAIN_IDENTIFIER.fullmatch(name):
        return name
    return one_line('"' + name.replace('"', '""') + '"')


def split_name(name: str) -> tuple[str, str]:
    """'schema.table' (or 'table', meaning public) into its two parts, as written."""
    if not name.strip():
        raise ConfigError("the table name is empty: name a registered table as schema.table")
    parts = name.split(".")
    if len(parts) == 1:
        return "public", parts[0]
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1]
    raise ConfigError(f"table name {one_line(repr(name))} is not of the form schema.table")


# One part of a name as SQL writes it: "quoted" (a doubled quote inside) or an unquoted identifier.
_SQL_PART = re.compile(r'"((?:[^"]|"")+)"|([^\W\d]\w*(?:\$\w*)*)')


# PostgreSQL folds unquoted identifiers to lower case in ASCII only (in a UTF-8 database).
_FOLD = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def sql_name(name: str) -> tuple[str, str] | None:
    """'schema.table' as SQL (and the jobs' messages, `quoted_name`) writes it -- `app."Weird Tbl"`:
    quoted parts as they are, unquoted ones folded to lower case -- or None when it is not so written."""
    parts, at = [], 0
    while True:
        match = _SQL_PART.match(name, at)
        if match is None:
            return None
        quoted, plain = match.groups()
        parts.append(quoted.replace('""', '"') if quoted is not None else plain.translate(_FOLD))
        at = match.end()
        if at == len(name):
            break
        if name[at] != "." or len(parts) == 2:
            return None
        at += 1
    return ("public", parts[0]) if len(parts) == 1 else (parts[0], parts[1])


def name_candidates(name: str) -> list[tuple[str, str]]:
    """The (schema, table) a job's --table may mean: as written, split at its dot (`app.Weird Tbl`),
    and as SQL writes it (`app."Weird Tbl"`, the spelling the jobs' messages print)."""
    candidates = [candidate for candidate in (sql_name(name),) if candidate is not None]
    try:
        candidates.insert(0, split_name(name))
    except ConfigError:
        if not candidates:
            raise
    return list(dict.fromkeys(candidates))

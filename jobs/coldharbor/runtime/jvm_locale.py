"""The locale of the JVMs Coldharbor starts: a JVM names files in its locale's encoding
(sun.jnu.encoding), so under LC_ALL=C a lake folder named "tü" would be written as "t?", which
another table's folder is too. Every JVM Coldharbor starts gets a UTF-8 locale this machine has
(`jvm_environment`); a session over a JVM started elsewhere is checked before it writes a folder
whose name is not ASCII (`require_utf8_file_names`)."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping

from coldharbor.runtime.errors import ConfigError

# A JVM names files in its locale's encoding (sun.jnu.encoding): under LC_ALL=C, or a UTF-8
# locale the machine lacks, it is ASCII and a table folder named "tü" is written as "t?", which
# another table's folder ("tö") is too.
JVM_LOCALE = "C.UTF-8"


def jvm_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a JVM Coldharbor starts (a classic session's, the Connect server's, spark-submit's):
    its own locale when that is a UTF-8 one this machine has, else LC_ALL=C.UTF-8."""
    env = dict(env)
    current = env.get("LC_ALL") or env.get("LC_CTYPE") or env.get("LANG") or ""
    if not (_names_utf8(current) and _usable_locale(current)):
        env["LC_ALL"] = JVM_LOCALE
    return env


def _names_utf8(name: str) -> bool:
    return bool(re.search(r"\.utf-?8(@|$)", name, re.IGNORECASE))


def _usable_locale(name: str) -> bool:
    import locale

    with _LOCALE_LOCK:
        previous = locale.setlocale(locale.LC_CTYPE)
        try:
            locale.setlocale(locale.LC_CTYPE, name)
        except locale.Error:
            return False
        finally:
            locale.setlocale(locale.LC_CTYPE, previous)
    return True


_LOCALE_LOCK = threading.Lock()


def require_utf8_file_names(spark, path: str) -> None:
    """ConfigError unless Spark's JVM writes `path`, which is not plain ASCII, under its own name:
    a JVM started outside Coldharbor (spark-submit from a shell with LC_ALL=C, a cluster's
    executors) may encode file names in ASCII. Asked in a task, where the files are written."""
    if path.isascii():
        return
    encoding = spark.sql("SELECT reflect('java.lang.System', 'getProperty', 'sun.jnu.encoding') AS e").first()[0]
    if (encoding or "").replace("-", "").upper() != "UTF8":
        raise ConfigError(
            f"Spark's JVM encodes file names as {encoding}, so the lake folder {path} would be written under "
            "another name (each character outside ASCII becomes '?'); start Spark (spark-submit, the Connect "
            f"server, the executors) with a UTF-8 locale, e.g. LC_ALL={JVM_LOCALE}")

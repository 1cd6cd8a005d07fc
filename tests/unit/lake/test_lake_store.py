"""The lake's own files and the Delta log's values as the jobs read them from Python, on local disk."""

from __future__ import annotations

import threading
from datetime import date, datetime, timezone
from decimal import Decimal

import pytest
from coldharbor.lake import lake_store


@pytest.mark.parametrize("value, text", [
    (None, None), (True, "true"), (17, "17"), ("eu'x/=%", "eu'x/=%"), (date(2024, 2, 29), "2024-02-29"),
    (Decimal("0E-6"), "0.000000"), (datetime(2024, 1, 1, 10, 0, 0, 123456, tzinfo=timezone.utc),
                                    "2024-01-01T10:00:00.123456Z"),
    (datetime(2024, 1, 1, 10, 0), "2024-01-01 10:00:00.000000"),
])
def test_partition_values_read_from_the_log_become_text_spark_casts_back(value, text):
    assert lake_store.partition_text(value) == text


def test_lake_store_errors_are_one_line_without_terminal_colours():
    chained = "Generic S3 error\n  \x1b[31m↳\x1b[0m Error performing list request\n   \x1b[31m↳\x1b[0m Connection refused"
    assert lake_store.message(OSError(chained)) == "Generic S3 error: Connection refused"


def test_writers_replacing_one_file_at_once_never_fail_nor_leave_it_partial(tmp_path):
    """Reports running at the same time each refresh the registry copy: every write lands whole,
    none fails because another moved its staged file away."""
    path = str(tmp_path / "_coldharbor" / "registry.json")
    texts = [f"{{\"writer\": {n}, \"pad\": \"{'x' * 5000}\"}}" for n in range(8)]
    failures: list[BaseException] = []

    def write(text: str) -> None:
        try:
            for _ in range(25):
                lake_store.write_text(path, text)
                assert lake_store.read_text(path) in texts
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    assert lake_store.read_text(path) in texts
    assert sorted(p.name for p in (tmp_path / "_coldharbor").iterdir()) == ["registry.json"]

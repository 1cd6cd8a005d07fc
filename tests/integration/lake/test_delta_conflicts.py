"""Delta's commit conflicts reach the jobs as delta.exceptions classes (issue 24: caught by class,
not by message text), in-process and over Spark Connect: a replaceWhere overwrite held inside its
tasks while another writer appends rows its predicate covers fails with ConcurrentAppendException,
which compaction counts as a lost attempt (`delta.CONFLICTS`)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from coldharbor.lake import delta
from coldharbor.maintenance.compaction import _is_conflict
from coldharbor.runtime.faults import pause_inside_tasks
from delta.exceptions import ConcurrentAppendException


def conflict_of(spark, path: str, folder: Path) -> BaseException:
    """The error of an overwrite of rows id <= 2 that another writer's append of id 1 overtook."""
    spark.range(1, 5).selectExpr("id", "'first' AS v").repartition(1).write.format("delta").save(path)
    caught: list[BaseException] = []

    def overwrite() -> None:
        rows = spark.read.format("delta").load(path).filter("id <= 2").selectExpr("id", "'rewritten' AS v")
        try:
            (pause_inside_tasks(rows, "overwrite", str(folder)).write.format("delta").mode("overwrite")
             .option("replaceWhere", "id <= 2").save(path))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            caught.append(exc)

    writer = threading.Thread(target=overwrite)
    writer.start()
    deadline = time.monotonic() + 120
    while not (folder / "overwrite.reached").exists():
        assert time.monotonic() < deadline and writer.is_alive(), caught
        time.sleep(0.05)
    spark.createDataFrame([(1, "appended")], "id long, v string").write.format("delta").mode("append").save(path)
    (folder / "overwrite.resume").touch()
    writer.join(120)
    assert not writer.is_alive() and len(caught) == 1
    return caught[0]


@pytest.mark.integration
@pytest.mark.parametrize("engine", ["in-process", "connect"])
def test_a_commit_conflict_is_a_delta_exceptions_class_on_either_engine(engine, request, tmp_path):
    if engine == "connect":
        request.getfixturevalue("on_connect")
        from coldharbor.runtime.spark import get_session

        spark = get_session("coldharbor-test-conflicts")
    else:
        spark = request.getfixturevalue("spark")
    folder = tmp_path / "pause"
    folder.mkdir()
    exc = conflict_of(spark, str(tmp_path / "lake"), folder)
    assert isinstance(exc, ConcurrentAppendException), repr(exc)[:2000]
    assert isinstance(exc, delta.CONFLICTS) and _is_conflict(exc)
    assert not _is_conflict(ValueError("ConcurrentAppendException in a message is not a conflict"))

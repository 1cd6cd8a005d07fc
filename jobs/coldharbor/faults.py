"""Named points inside the jobs where tests inject a real crash (SIGKILL) or a pause.

COLDHARBOR_CRASH_AT=<point>  kills the process at that point.
COLDHARBOR_PAUSE_AT=<point>  with COLDHARBOR_PAUSE_DIR=<dir>: writes <dir>/<point>.reached and
                             waits for <dir>/<point>.resume, so a test can interleave two processes.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

CRASH_ENV = "COLDHARBOR_CRASH_AT"
PAUSE_ENV = "COLDHARBOR_PAUSE_AT"
PAUSE_DIR_ENV = "COLDHARBOR_PAUSE_DIR"
PAUSE_TIMEOUT_S = 300

Hook = Callable[[str], None]


def from_environment(point: str) -> None:
    """The default hook: crash or pause at `point` when the environment asks for it."""
    if os.environ.get(CRASH_ENV) == point:
        log.warning("fault injection: killing the process at %s", point)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(PAUSE_ENV) == point:
        folder = Path(os.environ[PAUSE_DIR_ENV])
        (folder / f"{point}.reached").write_text(str(os.getpid()))
        deadline = time.monotonic() + PAUSE_TIMEOUT_S
        while not (folder / f"{point}.resume").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"paused at {point} for {PAUSE_TIMEOUT_S}s without a resume")
            time.sleep(0.05)


def armed(point: str) -> bool:
    """Whether the environment asks for a crash at `point` (for points a hook call cannot reach)."""
    return os.environ.get(CRASH_ENV) == point


@contextmanager
def kill_during(point: str, after_s: float = 0.3) -> Iterator[None]:
    """When armed, SIGKILLs the process `after_s` into the block (a JVM call the Python side cannot
    hook into, such as VACUUM deleting files), or at its end if it finishes sooner: either way the
    process dies inside the operation, never after the job moves on."""
    if not armed(point):
        yield
        return
    timer = threading.Timer(after_s, from_environment, args=(point,))
    timer.daemon = True
    timer.start()
    yield
    from_environment(point)


def crash_inside_tasks(rows, point: str):
    """`rows`, whose first row computed by a Spark task kills the driver JVM with SIGKILL: a crash
    in the middle of a distributed write, with the tasks' files half written. spark-submit only
    (the JVM is the job's process; under a test's own session it would be the test's)."""
    from pyspark.sql import functions as F

    @F.udf("boolean")
    def _kill(_):
        import sys

        print(f"fault injection: killing the process at {point} (inside a Spark task)", file=sys.stderr, flush=True)
        pid = os.getppid()  # the Python worker's ancestors: pyspark's daemon, then the JVM
        while pid > 1:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() == "java":
                    os.kill(pid, signal.SIGKILL)
                    time.sleep(60)
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        return True

    return rows.filter(_kill.asNondeterministic()(F.lit(1)))

"""Named points inside the jobs where tests inject a real crash (SIGKILL) or a pause.

COLDHARBOR_CRASH_AT=<point>  kills the process at that point.
COLDHARBOR_PAUSE_AT=<point>  with COLDHARBOR_PAUSE_DIR=<dir>: writes <dir>/<point>.reached and
                             waits for <dir>/<point>.resume, so a test can interleave two processes.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
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


def inside_tasks(rows, point: str):
    """`rows`, with the crash or the pause the environment asks for at `point` put inside the Spark
    tasks that compute them (the middle of a distributed write); unchanged otherwise."""
    if armed(point):
        return crash_inside_tasks(rows, point)
    if os.environ.get(PAUSE_ENV) == point:
        return pause_inside_tasks(rows, point, os.environ[PAUSE_DIR_ENV])
    return rows


def pause_inside_tasks(rows, point: str, folder: str):
    """`rows`, whose tasks each write <folder>/<point>.reached at their first row and wait for
    <folder>/<point>.resume: a test can stop a write midway, its files half written (to kill the
    Spark Connect server under it). Self-contained, as the server's Python workers run it."""
    from pyspark.sql import functions as F

    timeout_s = PAUSE_TIMEOUT_S

    @F.udf("boolean")
    def _pause(_):
        import os
        import time

        reached, resume = os.path.join(folder, f"{point}.reached"), os.path.join(folder, f"{point}.resume")
        if not os.path.exists(resume):
            with open(reached, "w") as marker:
                marker.write(str(os.getpid()))
            deadline = time.monotonic() + timeout_s
            while not os.path.exists(resume):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"paused at {point} for {timeout_s}s without a resume")
                time.sleep(0.05)
        return True

    return rows.filter(_pause.asNondeterministic()(F.lit(1)))


def crash_inside_tasks(rows, point: str):
    """`rows`, whose first row computed by a Spark task kills the job with SIGKILL: a crash in the
    middle of a distributed write, with the tasks' files half written.

    Under spark-submit the job is the driver JVM, an ancestor of the task's Python worker: it dies
    and the write with it. On a Spark Connect session the task runs in the server, which is not
    the job's to kill: the task kills the job's client process instead (tests run both on one
    machine) and goes on, so the write ends without its client, as Spark Connect lets any operation
    whose client died run to its end (it may commit). A JVM is never the target over Connect. With
    COLDHARBOR_PAUSE_AT=<point> as well, the task then holds that orphaned write as a pause does."""
    from pyspark.sql import functions as F
    from pyspark.sql.utils import is_remote

    if is_remote():
        hold = os.environ[PAUSE_DIR_ENV] if os.environ.get(PAUSE_ENV) == point else None
        return rows.filter(_client_killer(point, os.getpid(), hold)(F.lit(1)))
    return rows.filter(_driver_killer(point)(F.lit(1)))


def _driver_killer(point: str):
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

    return _kill.asNondeterministic()


def _client_killer(point: str, client_pid: int, hold: str | None = None):
    """The UDF that SIGKILLs the Connect client `client_pid`, once, if it is still the process it
    was when the plan was built (a pid reused since is left alone), then lets its row through, after
    waiting in folder `hold` for <point>.resume if one is given. Self-contained: the server's Python
    workers need not import coldharbor."""
    from pyspark.sql import functions as F

    def start_time(pid: int) -> str | None:
        # Clock ticks since boot while the process runs, None once it is gone or a zombie.
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return None if fields[0] in ("Z", "X") else fields[19]

    client_started = start_time(client_pid)
    timeout_s = PAUSE_TIMEOUT_S

    @F.udf("boolean")
    def _kill(_):
        import os
        import signal
        import sys
        import time

        if client_started is not None and start_time(client_pid) == client_started:
            print(f"fault injection: killing the client (pid {client_pid}) at {point} (inside a Spark task)",
                  file=sys.stderr, flush=True)
            try:
                os.kill(client_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # another task of the write killed it first
            deadline = time.monotonic() + 10
            while start_time(client_pid) == client_started and time.monotonic() < deadline:
                time.sleep(0.05)  # the write goes on once its client is dead
            if hold is not None:
                with open(os.path.join(hold, f"{point}.reached"), "w") as marker:
                    marker.write(str(os.getpid()))
                deadline = time.monotonic() + timeout_s
                while not os.path.exists(os.path.join(hold, f"{point}.resume")) and time.monotonic() < deadline:
                    time.sleep(0.05)
        return True

    return _kill.asNondeterministic()

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
from collections.abc import Callable
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

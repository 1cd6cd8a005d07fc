"""Runs every benchmark under bench/ and prints one table, also written to bench/results/<date>.txt."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

from bench import (
    change_feed,
    engine,
    entities,
    exact_history,
    health_page,
    incremental,
    initial_load,
    lake_first,
    maintenance,
    orchestration,
    read_path,
    report_refusal,
    report_sink,
    write_path,
)
from bench.common import render

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    rows = (write_path.run() + entities.run() + read_path.run() + maintenance.run() + orchestration.cycle()
            + initial_load.run() + report_refusal.run() + report_sink.run() + change_feed.run() + exact_history.run()
            + health_page.run() + incremental.run() + lake_first.run()
            + engine.run(quick=False, cycles=500))
    table = render(rows)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{datetime.now(timezone.utc):%Y-%m-%d}.txt"
    out.write_text(table + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

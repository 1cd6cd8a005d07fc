"""The jobs' exit codes are one table (runtime.job_main), which the Airflow operator reads to say
what a failed run's code means; no job defines a code of its own elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import coldharbor
from coldharbor.runtime import job_main
from coldharbor.runtime.job_main import EXIT_DIFFERENT, EXIT_GAVE_UP, EXIT_REFUSED, EXIT_UNFORESEEN, exit_meaning

PACKAGE = Path(coldharbor.__file__).resolve().parent


def test_no_module_but_job_main_defines_an_exit_code():
    defined = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                defined += [f"{path.relative_to(PACKAGE)}:{t.id}" for t in node.targets
                            if isinstance(t, ast.Name) and t.id.startswith("EXIT_")]
    assert defined and all(d.startswith("runtime/job_main.py:") for d in defined), defined


def test_every_exit_code_has_a_meaning_for_the_operator_to_say():
    codes = {value for name, value in vars(job_main).items() if name.startswith("EXIT_") and isinstance(value, int)}
    assert codes == {1, 2, 3, 4}
    for code in codes:
        assert exit_meaning("cdc_export.py", code) != "Spark or the job failed", code
    assert exit_meaning("compact.py", EXIT_GAVE_UP).startswith("compaction gave up")
    assert exit_meaning("cdc_export.py", EXIT_REFUSED).startswith("refused or a tier was unreachable")
    # verify's exit 1 is a finding (the lake differs), and its unforeseen errors exit 2
    assert exit_meaning("verify.py", EXIT_DIFFERENT).startswith("the lake view differs")
    assert exit_meaning("verify", EXIT_REFUSED).startswith("refused, a tier was unreachable, or an error")
    assert exit_meaning("resync.py", EXIT_UNFORESEEN).startswith("an error no check foresaw")
    assert exit_meaning("cdc_export.py", 137) == "Spark or the job failed"

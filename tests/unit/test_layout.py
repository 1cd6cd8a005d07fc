"""The package's layout (issue 24): subpackages by stage, imports that only go down the stages,
each subpackage saying what it owns, tests that mirror the tree, thin entrypoints."""

from __future__ import annotations

import ast
from pathlib import Path

import coldharbor

PACKAGE = Path(coldharbor.__file__).resolve().parent
PROJECT = PACKAGE.parents[1]
# The stages, lowest first: a module may import from its own stage and the ones before it.
STAGES = ["runtime", "capture", "lake", "export", "serve", "maintenance", "embedded"]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `coldharbor.` import in `path`, at any depth (function-level ones too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "coldharbor":
            found += [(node.lineno, node.module)] if node.module != "coldharbor" else \
                [(node.lineno, f"coldharbor.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "coldharbor"]
    return found


def test_every_module_sits_in_a_stage_and_every_stage_is_listed():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(STAGES)


def test_imports_go_down_the_stages_never_up():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) < 2:
            continue
        own = STAGES.index(parts[0])
        for line, module in imported_modules(path):
            stage = module.split(".")[1] if module.count(".") else None
            if stage not in STAGES:
                wrong.append(f"{'/'.join(parts)}:{line} imports {module}, which is in no stage")
            elif STAGES.index(stage) > own:
                wrong.append(f"{'/'.join(parts)}:{line} imports {module} (a later stage than {parts[0]})")
    assert wrong == []


def test_each_subpackage_says_what_it_owns_naming_each_of_its_modules():
    for stage in STAGES:
        doc = ast.get_docstring(ast.parse((PACKAGE / stage / "__init__.py").read_text())) or ""
        modules = sorted(p.stem for p in (PACKAGE / stage).glob("*.py") if p.stem != "__init__")
        assert modules, stage
        assert [m for m in modules if f"`{m}`" not in doc] == [], f"coldharbor.{stage}'s docstring"
    top = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text())) or ""
    assert [s for s in STAGES if f"\n    {s} " not in top] == []


def test_tests_mirror_the_layout():
    for kind in ("unit", "integration"):
        folders = [p for p in (PROJECT / "tests" / kind).iterdir() if p.is_dir() and p.name != "__pycache__"]
        assert folders, kind
        assert [p.name for p in folders if p.name not in STAGES] == []
        assert [p.name for p in folders if not (p / "__init__.py").exists()] == []
    assert sorted(p.name for p in (PROJECT / "tests" / "integration").glob("test_*.py")) == []


def test_entrypoints_stay_thin():
    """jobs/<job>.py only hands its arguments to one main() of the package."""
    for path in sorted((PROJECT / "jobs").glob("*.py")):
        tree = ast.parse(path.read_text())
        mains = [m for _, m in imported_modules(path)]
        assert len(mains) == 1 and mains[0].split(".")[1] in STAGES, path.name
        assert len(tree.body) <= 4, path.name  # docstring, import sys, the import of main, the call


def test_the_readme_map_names_modules_and_tests_that_exist():
    """README's "Where each invariant lives": every module and test it names is in the tree."""
    import re

    readme = (PROJECT / "README.md").read_text()
    section = readme[readme.index("### Where each invariant lives"):]
    section = section[:section.index("\n\n", section.index("|---|"))]
    rows = [line for line in section.splitlines() if re.match(r"\| \d+ ", line)]
    assert [int(r.split()[1]) for r in rows] == list(range(1, 16))
    missing = []
    for row in rows:
        for name in re.findall(r"`([^`]+\.(?:py|sql)(?:::\w+)?)`", row):
            path, _, test = name.partition("::")
            if "/" in path:
                found = [c for c in (PACKAGE / path, PROJECT / "tests" / path, PROJECT / path) if c.is_file()]
            else:  # a file the row named with its folder before: one file of that name only
                found = list((PROJECT / "tests").rglob(path)) + list(PACKAGE.rglob(path))
            if len(found) != 1 or (test and f"def {test}(" not in found[0].read_text()):
                missing.append(name)
    assert missing == []


def test_one_dag_per_file_each_with_its_docstring_and_the_exports_asset_defined_once():
    assets = []
    for path in sorted((PROJECT / "dags").glob("*.py")):
        tree = ast.parse(path.read_text())
        dags = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                and any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "dag" for d in n.decorator_list)]
        assert len(dags) <= 1, (path.name, dags)
        if dags and path.name != "coldharbor_reports.py":  # that one builds a DAG per report file
            assert path.stem == dags[0] and (ast.get_docstring(tree) or "").startswith(f"{dags[0]}:"), path.name
        assets += [path.name for n in ast.walk(tree)
                   if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Asset"]
    assert assets == ["coldharbor_common.py"]


def test_every_job_s_main_goes_through_the_one_run_job():
    """Logging, the one line of a failure and the exit code are job_main.run_job's, for every job."""
    helper = ast.parse((PACKAGE / "capture" / "table_job.py").read_text())
    [table_job_main] = [n for n in helper.body if isinstance(n, ast.FunctionDef) and n.name == "table_job_main"]
    assert "run_job" in [n.func.id for n in ast.walk(table_job_main)
                         if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    modules = {m for path in (PROJECT / "jobs").glob("*.py") for _, m in imported_modules(path)}
    modules.add("coldharbor.capture.migrate")
    assert len(modules) == 9
    for module in sorted(modules):
        tree = ast.parse((PACKAGE.parent / (module.replace(".", "/") + ".py")).read_text())
        [main] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        calls = [n.func.id for n in ast.walk(main) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
        # table_job_main is run_job around one_table, for the jobs over one table
        assert "run_job" in calls or "table_job_main" in calls, module


def test_every_spark_job_has_the_one_shape():
    """Each job behind an entrypoint of jobs/: `parse_args(argv)` -> a frozen config dataclass,
    `run(spark, conn, config, ...)` -> its exit code (anything after config has a default), and
    `main(argv)`, so a newcomer reads every job the same way and a test can call `run` directly."""
    import dataclasses
    import importlib
    import inspect

    modules = sorted({m for path in (PROJECT / "jobs").glob("*.py") for _, m in imported_modules(path)})
    assert len(modules) == 8
    for module in modules:
        job = importlib.import_module(module)
        config_type = getattr(job, inspect.signature(job.parse_args).return_annotation)
        assert dataclasses.is_dataclass(config_type) and config_type.__dataclass_params__.frozen, module
        run = inspect.signature(job.run)
        assert list(run.parameters)[:3] == ["spark", "conn", "config"], module
        assert run.parameters["config"].annotation == config_type.__name__, module
        assert all(p.default is not inspect.Parameter.empty for p in list(run.parameters.values())[3:]), module
        assert run.return_annotation == "int", module
        assert list(inspect.signature(job.main).parameters) == ["argv"], module

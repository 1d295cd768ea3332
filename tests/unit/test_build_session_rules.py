"""The build path's house rules (issue 54), kept: every task of the build area takes the Session, the build's
library takes it instead of echo/runner parameters, only the build executor makes a runner of its own, and
tasks.py holds no build-family body. The allow-lists name why and may only shrink."""

from __future__ import annotations

import ast
from pathlib import Path

from invoke import Task

from sparkforge.cli import build, diff, engine, probe, rebuild, size
from sparkforge.recipe.loader import REPO_ROOT

PACKAGE = REPO_ROOT / "sparkforge"
LIBRARY = [
    p
    for pkg in ("imagebuild", "preflight", "verify", "probe", "audit")
    for p in (PACKAGE / pkg).rglob("*.py")
]
# (file, function): why it still takes the parameter
THREADED = {
    (
        "preflight/catalog.py",
        "run_catalog",
        "echo",
    ): "cli/community.py (another owner) passes its echo positionally",
}
# files that may construct a Runner: why
OWN_RUNNER = {
    "imagebuild/execute.py": "run_stage: the one runner with the build's log folder (session.with_runner)"
}


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def test_the_build_library_takes_the_session_not_echo_or_runner() -> None:
    found = {
        (str(path.relative_to(PACKAGE)), fn.name, arg.arg)
        for path in LIBRARY
        for fn in _functions(path)
        for arg in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)
        if arg.arg in ("echo", "runner")
    }
    assert found == set(THREADED), "take `session: Session` first instead (sparkforge/context.py)"


def test_only_the_build_executor_makes_a_runner() -> None:
    found = {
        str(path.relative_to(PACKAGE))
        for path in LIBRARY
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Runner"
    }
    assert found == set(OWN_RUNNER), "use session.runner (or session.with_runner in the executor)"


def test_every_build_area_task_takes_the_session() -> None:
    tasks = [
        t
        for module in (build, diff, engine, probe, rebuild, size)
        for t in vars(module).values()
        if isinstance(t, Task)
    ]
    assert tasks and all(hasattr(t.body, "families") for t in tasks), [
        t.name for t in tasks if not hasattr(t.body, "families")
    ]


def test_tasks_py_holds_no_build_family_body() -> None:
    defined = {
        node.name
        for node in ast.parse((REPO_ROOT / "tasks.py").read_text()).body
        if isinstance(node, ast.FunctionDef)
    }
    assert defined <= {"recipes", "show", "render"}, defined

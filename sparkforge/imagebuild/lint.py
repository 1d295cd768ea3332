"""Project lint: ruff on the code, deptry (every import declared, directly), pip-audit of the locked set,
hadolint on every recipe's rendered Dockerfile, workflow linters (actionlint, zizmor, and our check of what
may reach the GPU runner: sparkforge/registry/workflowcheck.py)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from sparkforge.boundary import walk_tree
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.errors import SparkforgeError
from sparkforge.imagebuild.projectlock import audit_lock
from sparkforge.imagebuild.render import render_context
from sparkforge.recipe.loader import REPO_ROOT, list_recipe_names, load_recipe
from sparkforge.recipe.plan import PROJECT_SOURCE
from sparkforge.registry.workflowcheck import check_files

# Every ignored hadolint rule, with the reason; passed as --ignore.
HADOLINT_IGNORED: dict[str, str] = {
    # ensure-python installs distribution packages only when a base lacks them; their versions follow the
    # digest-pinned base image's distribution release, so pinning apt versions would add nothing but breakage.
    "DL3008": "apt packages follow the digest-pinned base",
}
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
INSTALL_FIX = "fix: bash .ci/install (the venv from uv.lock), then run lint from that venv"


def deptry_argv(root: Path = REPO_ROOT) -> tuple[str, ...]:
    """deptry over the package and the host-side tests (its settings: pyproject's [tool.deptry]).

    The tests import their sibling modules by bare name (pytest puts each test folder on sys.path, and
    test_fp8_contract.py adds sparkforge/verify/inimage/): every module under tests/, benchmarks/ and the in-image
    suite is first-party.
    """
    local = sorted(
        {
            p.stem
            for folder in ("tests", "benchmarks", "sparkforge/verify/inimage")
            for p in walk_tree(root / folder, folder, max_entries=100_000)
            if p.suffix == ".py"
        }
    )
    # root ".": pyproject's exclude patterns match paths relative to it (run with cwd=root).
    argv = [sys.executable, "-m", "deptry", ".", "--no-ansi", "--known-first-party", "sparkforge"]
    for name in ["tests", *local]:
        argv += ["--known-first-party", name]
    return tuple(argv)


def hadolint_argv(dockerfile: Path) -> tuple[str, ...]:
    argv = ["hadolint", "--failure-threshold", "info"]
    for rule in HADOLINT_IGNORED:
        argv += ["--ignore", rule]
    return (*argv, str(dockerfile))


def run_lint(session: Session) -> None:
    """Fail with every problem found; each tool's output is shown."""
    runner, echo = session.runner, session.echo
    failures: list[str] = []

    def step(command: Command, name: str) -> None:
        result = runner.run(command, name, check=False)
        if result.returncode != 0:
            failures.append(name)

    step(Command.of(sys.executable, "-m", "ruff", "check", str(REPO_ROOT)), "ruff-check")
    step(Command.of(sys.executable, "-m", "ruff", "format", "--check", str(REPO_ROOT)), "ruff-format")
    step(Command(deptry_argv(), cwd=REPO_ROOT), "deptry")
    audited = audit_lock(session)
    if audited is False:
        failures.append("pip-audit")
    if not shutil.which("hadolint"):
        raise SparkforgeError(f"hadolint is not installed; {INSTALL_FIX}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in list_recipe_names():
            context = render_context(load_recipe(name), Path(tmp))
            step(Command(hadolint_argv(context.dockerfile)), f"hadolint-{name}")
    if WORKFLOWS.is_dir():
        for tool in ("actionlint", "zizmor"):
            if not shutil.which(tool):
                raise SparkforgeError(f"{tool} is not installed; {INSTALL_FIX}")
        workflows = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
        step(Command(("actionlint", *workflows), cwd=REPO_ROOT), "actionlint")
        step(Command.of("zizmor", "--offline", str(WORKFLOWS)), "zizmor")
        problems = check_files(WORKFLOWS, PROJECT_SOURCE.removeprefix("https://github.com/"))
        for problem in problems:
            echo(f"workflow-trust: {problem}")
        if problems:
            failures.append("workflow-trust")
    if failures:
        raise SparkforgeError(f"lint failed: {', '.join(failures)} (output above)")
    echo("lint: all checks passed" + (" (pip-audit: not checked: offline)" if audited is None else ""))


def run_tests(session: Session, *, slow: bool = False, k: str = "") -> None:
    """The test suite, the same command as README and CI (`slow`: the slow real-world tests too)."""
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        *(["-m", "slow or not slow"] if slow else []),
        *(["-k", k] if k else []),
    ]
    session.runner.run(Command(tuple(argv)), "pytest")

"""A fast start: loading tasks.py (what every `invoke` does, --list and --help included) imports the CLI layer
and the ground floor only; each task imports the library it needs when it runs. And the install compiles
bytecode, so no command pays for compiling (Invoke turns writing .pyc off). Timings: benchmarks/startup.md."""

from __future__ import annotations

import subprocess
import sys

from sparkforge.recipe.loader import REPO_ROOT

# What loading tasks.py may import of sparkforge: the Invoke layer and the ground floor it stands on.
GROUND = {"sparkforge", "sparkforge.boundary", "sparkforge.commands", "sparkforge.console", "sparkforge.context",
          "sparkforge.errors", "sparkforge.extensions"}  # fmt: skip
HEAVY = ("pydantic", "requests", "urllib3", "jinja2", "rich", "docker", "sparkforge.recipe", "sparkforge.run")


def loaded_by_tasks() -> set[str]:
    code = "import sys, tasks; print('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return set(done.stdout.split())


def test_loading_tasks_imports_the_cli_layer_and_the_ground_floor_only() -> None:
    modules = loaded_by_tasks()
    ours = {m for m in modules if m.split(".")[0] == "sparkforge"}
    beyond = sorted(m for m in ours - GROUND if not m.startswith("sparkforge.cli"))
    assert not beyond, f"loading tasks.py imports library modules (import them inside the task): {beyond}"
    heavy = sorted(m for m in modules if m.startswith(HEAVY))
    assert not heavy, f"loading tasks.py imports {heavy[:8]}: every invoke --list pays for them"


def test_help_that_names_a_registry_still_shows_its_rows() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "--help", "conform"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "--checks=CHECKS" in done.stdout and "determinism:" in done.stdout  # the registry, read when shown


def test_the_install_compiles_bytecode() -> None:
    script = (REPO_ROOT / ".ci" / "install").read_text()
    assert "--compile-bytecode" in script  # the locked dependencies
    assert 'compileall -q -j 0 "$root/sparkforge" "$root/tasks.py"' in script  # the editable project itself

"""House round 4's extension rule, kept by a drill: in a copy of this checkout, add a global flag, a conform row, a
bench suite, an in-image verify check, a preflight check, a doctor stage and a recipe field, each as its own
module plus one line in its registry (the schema alone for a field); regenerate the docs as a contributor does
(`invoke docs.tables`, `python -m sparkforge.cli.options`); then every surface a user reads names the new
things, and the unit tests that read those registries pass unedited. A registry a test spells by hand, a name
list copied at import time or a surface that is not generated fails here."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each addition: (registry module, the anchor its one line goes before, the line; the new module's path and text).
ADDITIONS = {
    "preflight check": (
        "sparkforge/preflight/checks.py",
        ("\n    ],\n    PreflightError,", 'Entry("drill", "the drill\'s preflight row", check_drill),'),
        "sparkforge/preflight/drillcheck.py",
        "def check_drill(check, up):\n    check.status, check.reason = 'passed', 'the drill ran'\n",
        "from sparkforge.preflight.drillcheck import check_drill",
    ),
    "conform row": (
        "sparkforge/run/conform/rows.py",
        ("\n    ],\n", 'Entry("drill", "the drill\'s conform row", drill_row),'),
        "sparkforge/run/conform/drillrow.py",
        "def drill_row(run):\n    return None\n",
        "from sparkforge.run.conform.drillrow import drill_row",
    ),
    "bench suite": (
        "sparkforge/run/bench/suites.py",
        (
            "\n    ],\n",
            'Entry("drill", "the drill\'s suite", partial(Suite, client="vllm bench serve", input_len=8, '
            "output_len=8, depths=(0,), concurrencies=(1,), num_prompts=1)),",
        ),
        "",
        "",
        "",
    ),
    "verify check": (
        "sparkforge/verify/inimage/checklist.py",
        ("\n)  # fmt: skip", '("drill", "checks_drill", "check_drill", "the drill\'s in-image check"),'),
        "sparkforge/verify/inimage/checks_drill.py",
        "def check_drill(lock):\n    return 'passed', 'the drill ran', {}\n",
        "",
    ),
    "doctor stage": (
        "sparkforge/run/cluster/doctor.py",
        (  # a cheap stage goes before the expensive ones (--quick stops there)
            '\n        Entry(\n            "nccl-library",',
            'Entry("drill", "the drill\'s doctor stage", DoctorStage(drill_stage)),',
        ),
        "sparkforge/run/cluster/drillstage.py",
        "def drill_stage(check, plan, found):\n    check.status = 'passed'\n",
        "from sparkforge.run.cluster.drillstage import drill_stage",
    ),
    "global flag": (
        "sparkforge/cli/families.py",
        (
            '"print only results, warnings and errors (no progress lines)"),',
            'Option("drill_flag", False, "the drill\'s global flag"),',
        ),
        "",
        "",
        "",
    ),
    "recipe field": (
        "sparkforge/recipe/schema.py",
        (
            "\n\n\nclass Models(StrictModel):",
            '    drill: bool = Field(False, exclude_if=lambda v: not v, description="the drill\'s field")',
        ),
        "",
        "",
        "",
    ),
}
# The unit tests that read these registries (run unedited in the copy).
READERS = (
    "tests/unit/test_docs_tables.py",
    "tests/unit/test_extensions.py",
    "tests/unit/test_evidence.py",
    "tests/unit/test_doctor_flow.py",
    "tests/unit/test_option_fuzz.py",
    "tests/unit/test_families.py",
    "tests/unit/test_bench_inputs.py",
    "tests/unit/test_conform_inputs.py",
    "tests/unit/test_conform_rows.py",
    "tests/unit/test_recipe_fields.py",
    "tests/unit/test_house_round4.py",
    "tests/unit/test_structure.py",
)


def _insert(text: str, anchor: str, line: str, where: str) -> str:
    """`line` added before the first `anchor` (after it, for the global flag's one-line tuple)."""
    at = text.find(anchor)
    assert at >= 0, f"{where}: the drill's anchor {anchor!r} is gone; point the drill at the registry's end"
    if anchor.startswith("\n"):
        indent = "        " if "Entry(" in line else "    "
        return text[:at] + "\n" + (indent + line if not line.startswith("    ") else line) + text[at:]
    end = at + len(anchor)
    return text[:end] + " " + line + text[end:]


def _add_import(text: str, line: str) -> str:
    marker = "from __future__ import annotations\n"
    return text.replace(marker, marker + "\n" + line + "\n", 1) if line else text


def _copy(tmp: Path) -> Path:
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    copy = tmp / "checkout"
    for rel in filter(None, files):
        source = ROOT / rel
        if source.is_file() and not source.is_symlink():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / rel)
    return copy


def _added(copy: Path) -> dict[str, int]:
    """Apply every addition; return the lines each registry module gained (its import and its line)."""
    gained = {}
    for name, (registry, (anchor, line), module, body, importing) in ADDITIONS.items():
        path = copy / registry
        before = path.read_text()
        after = _add_import(_insert(before, anchor, line, registry), importing)
        ast.parse(after)  # the edit is Python
        path.write_text(after)
        gained[name] = _code_lines(after) - _code_lines(before)
        if module:
            (copy / module).write_text(body)
    return gained


def _code_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def _run(copy: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(copy)
    return subprocess.run(
        [sys.executable, *argv], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def drilled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    copy = _copy(tmp_path_factory.mktemp("drill"))
    gained = _added(copy)
    where = _run(copy, "-c", "import sparkforge; print(sparkforge.__file__)")
    assert where.stdout.strip() == str(copy / "sparkforge" / "__init__.py"), where
    for argv in (["-m", "invoke", "docs.tables"], ["-m", "sparkforge.cli.options"]):
        done = _run(copy, *argv)
        assert done.returncode == 0, done.stdout + done.stderr
    return copy, gained


def test_each_addition_is_its_module_and_at_most_its_import_and_one_line(
    drilled: tuple[Path, dict[str, int]],
) -> None:
    _, gained = drilled
    assert {name: n for name, n in gained.items() if n > 2} == {}, gained


def test_every_surface_names_the_new_things(drilled: tuple[Path, dict[str, int]]) -> None:
    copy, _ = drilled
    rows = {"preflight": "preflight row", "conform": "conform row", "bench": "suite"}
    for task, what in rows.items():  # the row as its registry writes it into the option's help: `name: help`
        done = _run(copy, "-m", "invoke", "--help", task)
        text = " ".join(done.stdout.split())  # Invoke wraps the help column
        assert done.returncode == 0 and f"drill: the drill's {what}" in text, (
            task,
            text[-3000:],
            done.stderr,
        )
    for task in ("build", "serve", "cluster.up", "docs.tables"):
        done = _run(copy, "-m", "invoke", "--help", task)
        assert "--drill-flag" in done.stdout, (task, done.stdout[-2000:], done.stderr)
    checks, run, reference = (
        (copy / "docs" / page).read_text() for page in ("checks.md", "run.md", "reference.md")
    )
    assert "the drill's preflight row" in checks and "the drill's in-image check" in checks
    for line in ("the drill's conform row", "the drill's suite", "the drill's doctor stage"):
        assert line in run, line
    assert "runtime.drill" in reference and "the drill's field" in reference


def test_the_tests_that_read_the_registries_pass_unedited(drilled: tuple[Path, dict[str, int]]) -> None:
    copy, _ = drilled
    readers = [r for r in READERS if (copy / r).is_file()]
    assert readers == list(READERS), f"a reader moved: {sorted(set(READERS) - set(readers))}"
    # The fuzzer's hostile values (55 s) go to valued options; the drill adds a boolean flag: its other tests run.
    fuzz = "not test_every_hostile_value_to_every_option_is_refused_before_anything_runs"
    done = _run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-k", fuzz, *readers, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def spelled(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines where a literal list, tuple or set of strings spells exactly `names` (a registry copied by hand)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set))
        and len(node.elts) >= 2
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
        and {e.value for e in node.elts} == names  # type: ignore[attr-defined]
    ]


def test_no_test_spells_a_registrys_names() -> None:
    from sparkforge.cli.docs import registry_pages

    registries = {table.stage: set(table.names()) for table, _ in registry_pages() if hasattr(table, "names")}
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for stage, names in registries.items():
            found += [f"{path.relative_to(ROOT)}:{line} ({stage})" for line in spelled(tree, names)]
    assert found == [], f"assert against the registry (its .names(), its entries), not a copy: {found}"
    assert spelled(ast.parse("x = ('b', 'a')\ny = ['a']"), {"a", "b"}) == [1]  # the check sees a copy

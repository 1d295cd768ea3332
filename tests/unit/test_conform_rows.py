"""Conform's rows are declared once (sparkforge/run/conform/rows.py): the profile schema's names, `--checks`, the
task's help and the table in docs/run.md all follow the registry, and a stale copy fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkforge.cli.conform import conform
from sparkforge.errors import RunError
from sparkforge.recipe.conformspec import ConformSettings
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.profile import load_profile
from sparkforge.run.conform.rows import ROWS
from sparkforge.run.conform.session import parse_checks, profile_checks

DOCS = REPO_ROOT / "docs" / "run.md"


def test_the_profile_names_rows_the_registry_judges_before_anything_starts(tmp_path: Path) -> None:
    """The schema spells no row: it takes names as words; conform checks them against the registry, naming the
    profile file, line and key, and runs the named rows in the registry's order (none named: the defaults)."""
    base = (REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe-conform.yaml").read_text()
    first, *_, last = ROWS.names()
    assert "  checks: [" in base
    for checks, expected in ((f"[{last}, {first}]", (first, last)), ("[]", ROWS.defaults())):
        path = tmp_path / "p" / "cpu-tiny-qwen35moe-conform.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(_with_checks(base, checks))
        assert profile_checks(load_profile(path)) == expected
    path.write_text(_with_checks(base, f"[{first}, speed]"))
    line = 1 + _with_checks(base, "x").splitlines().index("  checks: x")
    with pytest.raises(RunError) as info:
        profile_checks(load_profile(path))
    assert str(info.value).startswith(f"{path}:{line}: conform.checks: unknown conform row 'speed'")
    assert "nothing was started" in str(info.value) and all(n in str(info.value) for n in ROWS.names())
    with pytest.raises(ValueError, match="checks"):
        ConformSettings.model_validate({"checks": ["Not A Row; rm"]})  # still words only


def _with_checks(text: str, checks: str) -> str:
    return "\n".join(
        f"  checks: {checks}" if line.startswith("  checks: [") else line for line in text.splitlines()
    )


def test_checks_are_parsed_by_the_registry_in_its_order_and_an_unknown_one_names_every_row() -> None:
    first, *_, last = ROWS.names()
    assert parse_checks(f"{last}, {first}") == (first, last)
    with pytest.raises(RunError, match="unknown conform row 'speed'") as info:
        parse_checks(f"{first},speed")
    assert all(name in str(info.value) for name in ROWS.names())


def test_the_task_help_lists_every_row_with_its_line() -> None:
    text = str(conform.help["checks"])  # a LazyHelp: the registry read when help is shown
    for row in ROWS:
        assert f"{row.name}: {row.help}" in text


def test_the_docs_table_is_the_registrys() -> None:
    page = DOCS.read_text()
    assert ROWS.render_into(page) == page, (
        f"{DOCS}: the conform rows table is stale; fix: replace the block between {ROWS.marker()[0]} and its end "
        f"marker with:\n{ROWS.markdown_table()}"
    )


@pytest.mark.parametrize(
    "path",
    sorted([*(REPO_ROOT / "profiles").glob("*.yaml"), *(REPO_ROOT / "tests" / "profiles").glob("*.yaml")]),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_every_shipped_profile_names_only_registered_rows(path: Path) -> None:
    """A misspelled row in a shipped profile fails here, not first in the engine tier."""
    assert set(profile_checks(load_profile(path))) <= set(ROWS.names())


def test_conform_refuses_a_profile_naming_an_unknown_row_even_with_checks_given(tmp_path: Path) -> None:
    """`--checks` picks rows for this run; the profile's own list is still judged, before anything starts."""
    import subprocess
    import sys

    base = (REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe-conform.yaml").read_text()
    path = tmp_path / "cpu-tiny-qwen35moe-conform.yaml"
    path.write_text(_with_checks(base, f"[{ROWS.names()[0]}, speed]"))
    argv = [sys.executable, "-m", "invoke", "conform", "--recipe", "tests/recipes/ci-cpu-twin.yaml"]
    argv += ["--profile", str(path), "--model-dir", str(REPO_ROOT / "tests/fixtures/tiny-qwen35moe")]
    argv += ["--gpus", "none", "--checks", ROWS.names()[0], "--dry"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-1500:] + done.stderr[-1500:]
    assert "conform.checks: unknown conform row 'speed'" in done.stderr and "Traceback" not in done.stderr
    assert "row 1/" not in done.stdout  # no row listed: refused first

"""The CI budget for slow engine tests (tests/engine/ci_budget.py), through a real pytest run of test files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "engine"


def _run(tmp_path: Path, deadline: float | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ENGINE)!r})
        import ci_budget

        def pytest_configure(config):
            config.addinivalue_line("markers", "slow: long")

        def pytest_collection_modifyitems(config, items):
            ci_budget.apply(config, items)
        """)
    )
    (tmp_path / "test_a.py").write_text(
        "import pytest\npytestmark = pytest.mark.slow(cost_s=100)\n"
        "def test_one(): pass\ndef test_two(): pass\n"
    )
    (tmp_path / "test_b.py").write_text(
        "import pytest\n@pytest.mark.slow(cost_s=500)\ndef test_long(): pass\n"
        "@pytest.mark.slow(cost_s=20)\ndef test_short(): pass\ndef test_fast(): pass\n"
    )
    (tmp_path / "test_c.py").write_text("import pytest\n@pytest.mark.slow(cost_s=50)\ndef test_c(): pass\n")
    env = {k: v for k, v in os.environ.items() if k != "SPARKFORGE_CI_DEADLINE"}
    if deadline is not None:
        env["SPARKFORGE_CI_DEADLINE"] = str(deadline)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-m", "slow or not slow",
         "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip


def test_slow_modules_run_while_their_cost_fits_and_the_rest_are_named(tmp_path: Path) -> None:
    proc = _run(tmp_path, time.time() + 300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # test_a (a module mark: 100 s once) fits; test_b's two slow tests cost 520 s together: left out together,
    # its fast test still runs; test_c (50 s) fits in what test_a left.
    assert "4 passed, 2 deselected" in out, out
    assert "not run (CI budget): test_b.py::test_long: costs ~520 s" in out
    assert "not run (CI budget): test_b.py::test_short" in out and "CI budget): test_a.py" not in out


def test_without_a_deadline_every_slow_test_runs(tmp_path: Path) -> None:
    proc = _run(tmp_path, None)
    assert "6 passed" in proc.stdout and "CI budget" not in proc.stdout, proc.stdout


def test_a_past_deadline_runs_only_the_fast_tests(tmp_path: Path) -> None:
    proc = _run(tmp_path, time.time() - 1)
    assert "1 passed, 5 deselected" in proc.stdout, proc.stdout


def test_with_a_deadline_the_slow_modules_run_by_rank(tmp_path: Path) -> None:
    # test_d's rank puts it before test_a (no rank: last); the budget (150 s) then fits test_d (120 s) only,
    # although test_a (100 s) comes first in collection order and would have fitted alone.
    (tmp_path / "test_d.py").write_text(
        "import pytest\npytestmark = pytest.mark.slow(cost_s=120, rank=1)\ndef test_d(): pass\n"
    )
    proc = _run(tmp_path, time.time() + 150)
    out = proc.stdout + proc.stderr
    assert "not run (CI budget): test_a.py::test_one: costs ~100 s" in out, out
    assert "CI budget): test_d.py" not in out, out
    # test_b's fast test, then test_d, then test_c (50 s) no longer fits after test_d's 120 s.
    assert "2 passed" in out and "not run (CI budget): test_c.py::test_c" in out, out

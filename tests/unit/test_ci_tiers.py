"""CI's engine tiers (tests/engine/ci_budget.py, ci_record.py, ci_report.py), through real pytest runs of test files
and the real engine test collection."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "tests" / "engine"
VARS = ("SPARKFORGE_CI_DEADLINE", "SPARKFORGE_CI_LIMIT", "SPARKFORGE_CI_RUN", "SPARKFORGE_CI_HISTORY",
        "SPARKFORGE_CI_MUST_RUN", "SPARKFORGE_CI_RECORD", "SPARKFORGE_CI_INVENTORY")  # fmt: skip

# Stated costs: must (a must-run test, 100 s), a (module mark, 100 s), b (500 s + 20 s, and one fast test), c (50 s).
FILES = {
    "test_must.py": "import pytest\n@pytest.mark.must_run\n@pytest.mark.slow(cost_s=100, rank=1)\n"
    "def test_proof(): pass\n",
    "test_a.py": "import pytest\npytestmark = pytest.mark.slow(cost_s=100)\ndef test_one(): pass\ndef test_two(): pass\n",
    "test_b.py": "import pytest\n@pytest.mark.slow(cost_s=500)\ndef test_long(): pass\n"
    "@pytest.mark.slow(cost_s=20)\ndef test_short(): pass\ndef test_fast(): pass\n",
    "test_c.py": "import pytest\n@pytest.mark.slow(cost_s=50)\ndef test_c(): pass\n",
}


def _run(tmp_path: Path, **env_vars: str) -> str:
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ENGINE)!r})
        import ci_budget, ci_record

        def pytest_configure(config):
            config.addinivalue_line("markers", "slow: long")
            config.addinivalue_line("markers", "must_run: a proof")
            ci_record.register(config)

        def pytest_collection_modifyitems(config, items):
            ci_budget.apply(config, items)
        """)
    )
    for name, text in FILES.items():
        if not (tmp_path / name).exists():
            (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in VARS} | env_vars
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-m", "slow or not slow",
         "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    return proc.stdout + proc.stderr


def _budget(seconds: float, limit: float | None = None, run: int = 0) -> dict[str, str]:
    now = time.time()
    return {"SPARKFORGE_CI_DEADLINE": str(now + seconds), "SPARKFORGE_CI_LIMIT": str(now + (limit or seconds)),
            "SPARKFORGE_CI_RUN": str(run)}  # fmt: skip


def test_without_a_budget_every_slow_test_runs(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert "7 passed" in out and "CI plan" not in out, out


def test_the_must_run_tier_runs_even_past_the_hard_limit_and_says_so(tmp_path: Path) -> None:
    out = _run(tmp_path, **_budget(-10))
    # test_b's fast test and the must-run test; every rotating module is named with why it did not run.
    assert "2 passed, 5 deselected" in out, out
    assert "the must-run tier is forecast past the hard limit" in out, out
    assert "runs (must-run): test_must.py: ~100 s, every run" in out, out
    assert re.search(r"not run \(rotating\): test_b.py: ~520 s", out), out


def test_the_due_slot_runs_and_the_others_wait_their_turn(tmp_path: Path) -> None:
    # Slots of at most 900 s: test_b (520) + test_a (100) + test_c (50) fit one slot: due in every run.
    out = _run(tmp_path, **_budget(150, limit=10_000, run=3))
    assert "7 passed" in out and "its rotation slot (1 of 1) is due" in out, out


def test_rotation_is_by_run_number_and_fills_the_budget_with_the_longest_unrun(tmp_path: Path) -> None:
    # A 900-s module makes a second slot: run 0 is due slot 1 (the big module), run 1 slot 2 (the others).
    (tmp_path / "test_big.py").write_text(
        "import pytest\npytestmark = pytest.mark.slow(cost_s=900)\ndef test_big(): pass\n"
    )
    out0 = _run(tmp_path, **_budget(300, limit=10_000, run=0))
    assert "runs (rotating): test_big.py: ~900 s, its rotation slot (1 of 2) is due" in out0, out0
    assert "not run (rotating): test_b.py: ~520 s, slot 2 of 2, due in 1 run(s)" in out0, out0
    out1 = _run(tmp_path, **_budget(300, limit=10_000, run=1))
    assert "not run (rotating): test_big.py: ~900 s, slot 1 of 2, due in 1 run(s)" in out1, out1
    assert "runs (rotating): test_b.py" in out1 and "runs (rotating): test_c.py" in out1, out1
    # Not due, but the budget has room: the module that ran longest ago on this machine goes first.
    history = tmp_path / "history.json"
    history.write_text(
        json.dumps({"tests": {"test_c.py::test_c": {"ran_at": 1.0}, "test_a.py::test_one": {"ran_at": 9e9}}})
    )
    # 1,100 s: the must-run test and the due slot take 1,000; test_b (never here, 520 s) does not fit the rest.
    out = _run(tmp_path, **_budget(1100, limit=10_000, run=0), SPARKFORGE_CI_HISTORY=str(history))
    assert "runs (rotating): test_c.py: ~50 s" in out and "not run (rotating): test_a.py" in out, out


def test_dedicated_must_run_checks_refuse_a_skippable_or_unnamed_proof(tmp_path: Path) -> None:
    out = _run(tmp_path, **_budget(600), SPARKFORGE_CI_MUST_RUN="test_must.py::test_proof test_c.py::test_c")
    assert "named in .ci/run but not marked must_run (or not collected): test_c.py::test_c" in out, out
    (tmp_path / "test_must.py").write_text(
        "import pytest\n@pytest.mark.must_run\n@pytest.mark.skipif(True, reason='x')\n@pytest.mark.slow(cost_s=1)\n"
        "def test_proof(): pass\n"
    )
    out = _run(tmp_path, **_budget(600), SPARKFORGE_CI_MUST_RUN="test_must.py::test_proof")
    assert "a must-run test may not be skippable (@skipif): test_must.py::test_proof" in out, out


def _engine_inventory(tmp_path: Path) -> dict[str, dict]:
    inventory = tmp_path / "inventory.json"
    env = {k: v for k, v in os.environ.items() if k not in VARS} | {"SPARKFORGE_CI_INVENTORY": str(inventory)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", "-m", "slow or not slow",
         "tests/engine"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(inventory.read_text())["tests"]


def test_ci_run_names_exactly_the_must_run_tests_and_none_is_skippable(tmp_path: Path) -> None:
    script = (ROOT / ".ci" / "run").read_text()
    named = re.search(r"^MUST_RUN=\(\n(.*?)^\)", script, re.S | re.M)
    assert named, ".ci/run has no MUST_RUN list"
    listed = set(named.group(1).split())
    inventory = _engine_inventory(tmp_path)
    assert {n for n, f in inventory.items() if f["tier"] == "must-run"} == listed
    # The tier the issue asks for: a served answer, conform (reference and known answers), a planted fault, PP=2 on
    # two nodes, the doctor naming the address, bench.
    assert {n.split("::")[0].rsplit("/", 1)[-1] for n in listed} >= {
        "test_serve_real.py", "test_conform_real.py", "test_cluster_real.py", "test_bench_real.py"}  # fmt: skip
    # Nothing in the source makes one of them skippable (ci_budget.check_named refuses it at CI time too).
    for nodeid in listed:
        path, name = nodeid.split("::")
        text = (ROOT / path).read_text()
        head = text[: text.index(f"def {name}(")].rsplit("\n\n", 1)[-1]
        assert "skip" not in head and "xfail" not in head, nodeid


def test_the_report_fails_a_failed_or_late_must_run_tier_and_keeps_the_history(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"tests": {
        "t.py::proof": {"tier": "must-run", "cost_s": 100}, "t.py::core": {"tier": "core", "cost_s": None},
        "r.py::rot": {"tier": "rotating", "cost_s": 50}}}))  # fmt: skip
    started = time.time() - 3600
    record = tmp_path / "slow.json"
    history = tmp_path / "h" / "history.json"
    history.parent.mkdir()
    history.write_text(json.dumps({"tests": {"r.py::rot": {"ran_at": 1.7e9, "outcome": "passed"}}}))

    def report(outcome: str, ended_min: float) -> tuple[int, str]:
        record.write_text(json.dumps({"tests": {
            "t.py::proof": {"outcome": outcome, "seconds": 90.0, "ended_at": started + ended_min * 60},
            "t.py::core": {"outcome": "passed", "seconds": 2.0, "ended_at": started + 60}},
            "decisions": [{"module": "r.py", "tier": "rotating", "runs": False, "why": "not due", "cost_s": 50,
                           "runs_in": 2}]}))  # fmt: skip
        proc = subprocess.run(
            [sys.executable, str(ENGINE / "ci_report.py"), "--inventory", str(inventory), "--record", str(record),
             "--history", str(history), "--commit", "abc", "--started", str(started), "--limit-min", "75",
             "--out", str(tmp_path / "build" / "ci-summary")], capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return proc.returncode, proc.stdout

    code, out = report("passed", 40)
    assert code == 0 and "set-up + unit + core + must-run: 40.0 min (within the 45-minute goal" in out, out
    assert re.search(
        r"\| r.py::rot +\| rotating \| not this run \|.*\| 2023-11-14 22:13 \(passed\) \|", out
    ), out
    assert "not run (rotating): r.py: ~50 s, not due" in out
    summary = json.loads((tmp_path / "build" / "ci-summary.json").read_text())
    assert summary["ok"] is True and (tmp_path / "build" / "ci-summary.md").read_text().startswith(
        "## CI engine"
    )
    assert json.loads(history.read_text())["tests"]["t.py::proof"]["commit"] == "abc"
    code, out = report("passed", 80)
    assert (
        code == 1
        and "the must-run tier did not fit: set-up, unit, core and must-run ended at 80.0 min" in out
    )
    code, out = report("failed", 40)
    assert code == 1 and "must-run test did not pass: t.py::proof (failed)" in out

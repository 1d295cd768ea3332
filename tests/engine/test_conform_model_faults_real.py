"""Faults INSIDE the model, caught by conform for real (issue 60's second deliverable): the CPU twin serves a faulty
copy of the trained tiny Qwen3.5-MoE (tests/engine/model_faults.py: the output layer at half scale, every expert's
output at half scale, experts 0 and 1 swapped in the router, the RoPE base x100, a chat template that writes
another role tag, a tokenizer with two words' ids swapped), while the `reference` row's transformers reads the
clean folder (--reference-model-dir).

Each fault must fail at least one of the two rows that look at the model's answers (`known-answers`: 120 probes
as chats; `reference`: every served position scored teacher-forced against the clean weights); which row caught
which fault is printed and recorded (benchmarks/conform.md, docs/run.md's table). The chat template leaves the
weights and the completions path as they are: `reference` must pass it (no false alarm). The output layer at
half scale changes no greedy token: known-answers passes it 120/120 and only the logprob values show it.
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conform_fixtures import CONFORM_PROFILE, conform, launch_args
from model_faults import FAULTS, plant
from real_fixtures import REAL_TIMINGS, cpu_twin, trained_model  # noqa: F401
from test_serve_real import invoke

# CI budget (tests/engine/ci_budget.py): one faulty server start, known-answers and the reference each, ~300 s on a
# quiet machine (6.5 min under load 6-8 beside unit tests, benchmarks/conform.md).
pytestmark = pytest.mark.engine
# What each fault must fail (at least): the rows measured to catch it on this model.
MUST_FAIL = {
    "lm_head x0.5": {"reference"},
    "experts x0.5": {"reference"},
    "routing swapped": {"reference"},
    "rope_theta x100": {"known-answers"},
    "chat template": {"known-answers"},
    "tokenizer swapped": {"known-answers"},
}
CAUGHT: dict[str, dict[str, str]] = {}


def _caught(fault: str, cpu_twin: str, trained_model: Path, tmp_path: Path) -> dict[str, dict]:
    """conform's known-answers and reference rows on the faulty copy (the reference reading the clean folder); the
    rows, after asserting that the rows meant to catch the fault failed."""
    served = plant(trained_model, tmp_path / "served", fault)
    report = tmp_path / "conform.json"
    try:
        code, out, seconds = conform(
            CONFORM_PROFILE, *launch_args(cpu_twin, served, tmp_path / "cache"),
            "--reference-model-dir", str(trained_model), "--checks", "known-answers,reference",
            "--json", str(report),
        )  # fmt: skip
    finally:
        invoke("serve.down", "--profile", Path(CONFORM_PROFILE).stem)
    REAL_TIMINGS[f"conform_model_fault_{fault.replace(' ', '_')}_s"] = round(seconds, 1)
    rows = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    CAUGHT[fault] = {name: row["status"] for name, row in rows.items()}
    print(fault, json.dumps({n: (r["status"], r["reason"][:400]) for n, r in rows.items()}, indent=1))
    print("caught so far:", json.dumps(CAUGHT))
    assert code == 1, out[-3000:]
    failed = {name for name, row in rows.items() if row["status"] == "failed"}
    assert MUST_FAIL[fault] <= failed, (fault, failed)
    if "reference" in failed:
        # Named where and by how much, against the clean weights the reference read.
        row = rows["reference"]
        assert "fails at token" in row["reason"] and "tolerance" in row["reason"], row["reason"]
        assert str(trained_model) in out
    return rows


@pytest.mark.must_run
@pytest.mark.slow(
    cost_s=300, rank=3, reason="one faulty server start, known-answers and the reference (~300 s)"
)
def test_an_output_layer_at_half_scale_changes_no_answer_and_is_caught_by_reference_alone(
    cpu_twin: str, trained_model: Path, tmp_path: Path
) -> None:
    rows = _caught("lm_head x0.5", cpu_twin, trained_model, tmp_path)
    # The greedy answers are unchanged: a row that compares answers or tokens passes it.
    assert rows["known-answers"]["status"] == "passed", rows["known-answers"]["reason"]
    assert "120/120 right" in rows["known-answers"]["reason"]


@pytest.mark.slow(
    cost_s=1250,
    rank=60,
    reason="five faulty copies served in the twin, each with known-answers and the reference (~250 s each)",
)
@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "lm_head x0.5"])
def test_a_fault_inside_the_model_is_caught_by_a_row_reading_the_answers(
    fault: str, cpu_twin: str, trained_model: Path, tmp_path: Path
) -> None:
    rows = _caught(fault, cpu_twin, trained_model, tmp_path)
    if fault == "chat template":
        # The weights are the clean ones: the reference (completions, the same ids) must not raise a false alarm.
        assert rows["reference"]["status"] == "passed", rows["reference"]["reason"]

"""The committed tiny model (tests/fixtures/tiny-qwen35moe) is what its trainer makes: retrained in the CPU twin
from the same seed and steps, the new model learns everything the served tests rely on (its accuracy.json) and
gives the committed model's answers, greedy, to every prompt it was trained on (conform's 120 known-answer probes,
held-out progressions, the tool-call and thinking turns; tests/engine/tiny_model_compare.py)."""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import tiny_fixture
from cluster import DOCKER, sh
from real_fixtures import REAL_TIMINGS, check_trained, cpu_twin, train  # noqa: F401

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow(
        cost_s=900, rank=8, reason="the tiny model retrained in the twin (13.2 min under load 2-5)"
    ),
]
COMPARE = Path(__file__).with_name("tiny_model_compare.py")


def test_retraining_reproduces_the_committed_models_answers(cpu_twin: str) -> None:
    from sparkforge.context import cache_path

    # Kept in the cache, not a temporary folder: when the fixture is stale, this is the folder to commit.
    out = cache_path("tiny-models", f"retrained-{tiny_fixture.trained_model_key()}")
    start = time.monotonic()
    if not (out / "accuracy.json").is_file():
        train(cpu_twin, out)
    REAL_TIMINGS["tiny_retrain_s"] = round(time.monotonic() - start, 1)
    facts = check_trained(out)
    print(
        f"retrained in {REAL_TIMINGS['tiny_retrain_s']} s: {out} (commit it: tiny_fixture.py --write {out})"
    )
    stale = tiny_fixture.problems()
    assert not stale, "\n".join(stale)
    committed = json.loads((tiny_fixture.FIXTURE / "accuracy.json").read_text())
    for fact in ("greedy_bf16_transformers", "turns_exact_bf16", "known_answers_bf16"):
        assert facts[fact] == committed[fact], (fact, facts[fact], committed[fact])
    trainer = tiny_fixture.TRAINER
    result = sh(
        DOCKER, "run", "--rm", "--network", "none", "--entrypoint", "python3",
        "--volume", f"{trainer}:/opt/tests/engine/{trainer.name}:ro",
        "--volume", f"{COMPARE}:/opt/tests/engine/{COMPARE.name}:ro",
        "--volume", f"{tiny_fixture.PROBES}:/opt/sparkforge/run/conform/probes.py:ro",
        "--volume", f"{tiny_fixture.FIXTURE}:/committed:ro", "--volume", f"{out}:/retrained:ro",
        cpu_twin, f"/opt/tests/engine/{COMPARE.name}", "/committed", "/retrained", timeout=1200,
    )  # fmt: skip
    compared = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"answers compared: {compared['same']}/{compared['total']} the same")
    assert compared["total"] == 130 and compared["same"] == compared["total"], compared

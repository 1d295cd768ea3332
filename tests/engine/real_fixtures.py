"""Session fixtures for the real-vLLM tests: the CPU twin image (built by sparkforge, cached) and the tiny model.

The twin (tests/recipes/ci-cpu-twin.yaml) is built through the same pipeline as every recipe; BuildKit's cache
makes a rebuild on a reused machine seconds. The tiny Qwen3.5-MoE checkpoint every served test uses (serve,
bench, cluster, conform) is TRAINED (to count: every answer is right or wrong) INSIDE the twin image (it has
torch and transformers) into sparkforge's cache, keyed by the content of what makes it, so this host needs
neither; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import tiny_fixture
from cluster import DOCKER, sh
from cluster_fixtures import build_test_image
from tiny_fixture import MTP_STEPS, TRAIN_STEPS, trained_model_key

from sparkforge.recipe.loader import REPO_ROOT

TWIN_RECIPE = str(REPO_ROOT / "tests" / "recipes" / "ci-cpu-twin.yaml")
TINY_PROFILE = str(REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe.yaml")
# Not under sparkforge-test/: the engine conftest of any concurrent pytest session removes those tags at its end.
TWIN_REF = "sparkforge-run-test/cpu-twin:vllm"
TRAINER = tiny_fixture.TRAINER
# conform's known answers, which the tiny model learns
PROBES = tiny_fixture.PROBES
REAL_TIMINGS: dict[str, float] = {}  # printed by the tests, recorded in benchmarks/serve-real.md


@pytest.fixture(scope="session")
def cpu_twin(
    base_amd64: str, canary_secrets: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> str:
    """The CPU twin image, built by sparkforge's own pipeline (a cached rebuild when it exists)."""
    log_root = tmp_path_factory.mktemp("twin-build") / "logs"
    start = time.monotonic()
    # --network host, as `invoke build --network host`: RUN steps need no bridge
    build_test_image(TWIN_RECIPE, TWIN_REF, base_amd64, canary_secrets, log_root, network="host")
    REAL_TIMINGS["twin_build_s"] = round(time.monotonic() - start, 1)
    yield TWIN_REF
    sh(DOCKER, "rmi", TWIN_REF, check=False)  # the tag only: the layers stay with the recipe's candidate


def train(cpu_twin: str, out: Path) -> None:
    """Train the tiny model in the twin into `out` (atomic: a concurrent session sees the whole model or none)."""
    work = out.with_name(f".{out.name}.{os.getpid()}.part")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    name = f"sparkforge-train-{os.getpid()}"
    try:
        sh(
            DOCKER, "run", "--rm", "--name", name, "--network", "none", "--entrypoint", "python3",
            # The trainer finds probes.py where it lies in the repository, relative to itself.
            "--volume", f"{TRAINER}:/opt/tests/engine/{TRAINER.name}:ro",
            "--volume", f"{PROBES}:/opt/sparkforge/run/conform/probes.py:ro", "--volume", f"{work}:/out",
            cpu_twin, f"/opt/tests/engine/{TRAINER.name}", "/out", str(TRAIN_STEPS), str(MTP_STEPS), timeout=5400,
        )  # fmt: skip
    finally:
        sh(DOCKER, "rm", "--force", name, check=False)  # a timed-out client leaves its container running
    sh("chmod", "-R", "a+rX", str(work))
    if not out.exists():
        work.rename(out)
    shutil.rmtree(work, ignore_errors=True)


def check_trained(out: Path) -> dict:
    """What the model learnt, in bf16 transformers (its accuracy.json): the progression, both turns and every known
    answer of conform's row, exact; the drafter's token agrees with the model's on most positions."""
    facts = json.loads((out / "accuracy.json").read_text())
    assert facts["greedy_bf16_transformers"]["accuracy"] == 1.0, facts
    assert facts["turns_exact_bf16"] == {"tool_call": True, "thought": True}, facts
    assert facts["known_answers_bf16"]["right"] == facts["known_answers_bf16"]["probes"] == 120, facts
    assert facts["mtp_agreement_bf16"]["rate"] > 0.5, facts
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    return facts


@pytest.fixture(scope="session")
def trained_model(cpu_twin: str) -> Path:
    """The tiny Qwen3.5-MoE TRAINED (fixed seed) to count, to answer conform's known-answer probes, to call a tool
    and to think, its MTP drafter distilled, with a local tokenizer. The committed fixture
    (tests/fixtures/tiny-qwen35moe, tests/engine/tiny_fixture.py) when it is current and its sums verify, copied
    into sparkforge's cache; otherwise made by the twin image and cached by content key (2,000 + 1,000 steps,
    13.2 min on this 2-core machine under load 2-5, benchmarks/conform.md), the reason printed."""
    from sparkforge.context import cache_path

    out = cache_path("tiny-models", trained_model_key())
    start = time.monotonic()
    if not (out / "accuracy.json").is_file():
        stale = tiny_fixture.problems()
        if not stale:
            work = out.with_name(f".{out.name}.{os.getpid()}.part")
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(tiny_fixture.FIXTURE, work)
            if not out.exists():
                work.rename(out)
            shutil.rmtree(work, ignore_errors=True)
            REAL_TIMINGS["tiny_model_from"] = "the committed fixture"
        else:
            print("the committed tiny model cannot be used, training it (~13 min):\n  " + "\n  ".join(stale))
            train(cpu_twin, out)
            REAL_TIMINGS["tiny_model_from"] = "trained now"
    REAL_TIMINGS["tiny_model_s"] = round(time.monotonic() - start, 1)
    facts = check_trained(out)
    REAL_TIMINGS["tiny_model_train_s"] = facts["train_s"]
    REAL_TIMINGS["tiny_model_mtp_train_s"] = facts["mtp_train_s"]
    return out

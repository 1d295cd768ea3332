"""Session fixtures for the real-vLLM tests: the CPU twin image (built by sparkforge, cached) and the tiny model.

The twin (tests/recipes/ci-cpu-twin.yaml) is built through the same pipeline as every recipe; BuildKit's cache
makes a rebuild on a reused machine seconds. The tiny Qwen3.5-MoE checkpoint every served test uses (serve,
bench, cluster, conform) is TRAINED (to count: every answer is right or wrong) INSIDE the twin image (it has
torch and transformers) into sparkforge's cache, keyed by the content of what makes it, so this host needs
neither; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from cluster import DOCKER, sh
from cluster_fixtures import build_test_image

from sparkforge.recipe.loader import REPO_ROOT

TWIN_RECIPE = str(REPO_ROOT / "tests" / "recipes" / "ci-cpu-twin.yaml")
TINY_PROFILE = str(REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe.yaml")
# Not under sparkforge-test/: the engine conftest of any concurrent pytest session removes those tags at its end.
TWIN_REF = "sparkforge-run-test/cpu-twin:vllm"
TRAINER = Path(__file__).with_name("tiny_trained_qwen35moe.py")
# conform's known answers, which the tiny model learns
PROBES = REPO_ROOT / "sparkforge" / "run" / "conform" / "probes.py"
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


# 2,000 steps: 120/120 known answers on the CPU (1,500 reached it on a GPU; benchmarks/conform.md, "Known
# answers"); then 1,000 steps distilling the MTP drafter from the frozen model.
TRAIN_STEPS, MTP_STEPS = 2000, 1000


def trained_model_key() -> str:
    """The trained model's content key: the maker (task, config, seed, steps), the probes it learns and the twin
    recipe (torch)."""
    made = TRAINER.read_bytes() + PROBES.read_bytes() + Path(TWIN_RECIPE).read_bytes()
    return hashlib.sha256(made + f"{TRAIN_STEPS} {MTP_STEPS}".encode()).hexdigest()[:24]


@pytest.fixture(scope="session")
def trained_model(cpu_twin: str) -> Path:
    """The tiny Qwen3.5-MoE TRAINED (fixed seed) to count, to answer conform's known-answer probes, to call a tool
    and to think, its MTP drafter distilled, with a local tokenizer: made by the twin image and cached by content
    hash (sparkforge's cache: a second session reuses it; CI's fresh machine trains it once: 2,000 + 1,000
    steps, 13.2 min measured on this 2-core machine under load 2-5, benchmarks/conform.md)."""
    from sparkforge.context import cache_path

    out = cache_path("tiny-models", trained_model_key())
    start = time.monotonic()
    if not (out / "accuracy.json").is_file():
        work = out.with_name(f".{out.name}.{os.getpid()}.part")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        sh(
            DOCKER, "run", "--rm", "--network", "none", "--entrypoint", "python3",
            # The trainer finds probes.py where it lies in the repository, relative to itself.
            "--volume", f"{TRAINER}:/opt/tests/engine/{TRAINER.name}:ro",
            "--volume", f"{PROBES}:/opt/sparkforge/run/conform/probes.py:ro", "--volume", f"{work}:/out",
            cpu_twin, f"/opt/tests/engine/{TRAINER.name}", "/out", str(TRAIN_STEPS), str(MTP_STEPS), timeout=2400,
        )  # fmt: skip
        sh("chmod", "-R", "a+rX", str(work))
        if not out.exists():
            work.rename(out)  # atomic: a concurrent session sees the whole model or none
        shutil.rmtree(work, ignore_errors=True)
    REAL_TIMINGS["tiny_model_s"] = round(time.monotonic() - start, 1)
    facts = json.loads((out / "accuracy.json").read_text())
    REAL_TIMINGS["tiny_model_train_s"] = facts["train_s"]
    REAL_TIMINGS["tiny_model_mtp_train_s"] = facts["mtp_train_s"]
    # What it learnt, in bf16 transformers: the progression, both turns and every known answer of conform's row,
    # exact; the drafter's token agrees with the model's on most positions (what vLLM then accepts).
    assert facts["greedy_bf16_transformers"]["accuracy"] == 1.0, facts
    assert facts["turns_exact_bf16"] == {"tool_call": True, "thought": True}, facts
    assert facts["known_answers_bf16"]["right"] == facts["known_answers_bf16"]["probes"] == 120, facts
    assert facts["mtp_agreement_bf16"]["rate"] > 0.5, facts
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    return out

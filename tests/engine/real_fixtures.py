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


TRAIN_STEPS = 400


def trained_model_key() -> str:
    """The trained model's content key: the maker (task, config, seed, steps) and the twin recipe (torch)."""
    digest = hashlib.sha256(TRAINER.read_bytes() + Path(TWIN_RECIPE).read_bytes() + str(TRAIN_STEPS).encode())
    return digest.hexdigest()[:24]


@pytest.fixture(scope="session")
def trained_model(cpu_twin: str) -> Path:
    """The tiny Qwen3.5-MoE TRAINED to count (fixed seed) with a local tokenizer, made by the twin image and cached
    by content hash (sparkforge's cache: a second session reuses it; CI's fresh machine trains it, ~3-4 min)."""
    from sparkforge.context import cache_path

    out = cache_path("tiny-models", trained_model_key())
    start = time.monotonic()
    if not (out / "accuracy.json").is_file():
        work = out.with_name(f".{out.name}.{os.getpid()}.part")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        sh(
            DOCKER, "run", "--rm", "--network", "none", "--entrypoint", "python3",
            "--volume", f"{TRAINER}:/opt/tiny_trained_qwen35moe.py:ro", "--volume", f"{work}:/out",
            cpu_twin, "/opt/tiny_trained_qwen35moe.py", "/out", str(TRAIN_STEPS), timeout=1800,
        )  # fmt: skip
        sh("chmod", "-R", "a+rX", str(work))
        if not out.exists():
            work.rename(out)  # atomic: a concurrent session sees the whole model or none
        shutil.rmtree(work, ignore_errors=True)
    REAL_TIMINGS["tiny_model_s"] = round(time.monotonic() - start, 1)
    facts = json.loads((out / "accuracy.json").read_text())
    REAL_TIMINGS["tiny_model_train_s"] = facts["train_s"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    return out

"""The `reference` row for real: vLLM's CPU platform in the twin against Hugging Face transformers of the same
image on the same trained tiny Qwen3.5-MoE (hf_reference.py in a container of its own, after conform stopped its
servers), which scores every served continuation teacher-forced, judged on logprob values (run/conform/teacher.py).

- Clean: the session's clean conform run (conform_fixtures.clean_conform, no extra server start) passes
  `reference`, every position within the tolerance (measured: at most 1e-4 nats), and carries what vLLM logged it
  selected at start.
- A fault identical in every mode, planted INSIDE the real vLLM (tests/engine/planted_faults.py's CorruptAfter,
  loaded by vLLM's own --logits-processors: every greedy decode says "user" from token 40 on): streaming,
  concurrency, prefix caching and determinism cannot see it (they compare the server with itself; determinism
  runs here and passes); `reference` fails, naming prompt 0, token 40, the text before it, both continuations
  and both top-5 lists. One server start.
(Faults inside the model: test_conform_model_faults_real.py.)
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cluster import DOCKER, sh
from conform_fixtures import CONFORM_PROFILE, conform, faulty_image, launch_args
from real_fixtures import REAL_TIMINGS, cpu_twin, trained_model  # noqa: F401

from sparkforge.recipe.allowlist import opt_in_reason

# CI budget (tests/engine/ci_budget.py): the clean row rides on the session's clean conform run (406 s with the
# trained model cached, +~13 min training on a fresh machine; shared with test_conform_real, which runs first at the
# same rank); the fault costs one server start and one reference run (benchmarks/conform.md, ci.md).
pytestmark = pytest.mark.engine
FAULTY = "sparkforge-run-test/cpu-twin:reference-fault"
FAULT_PROFILE, FAULT_PORT = "cpu-tiny-qwen35moe-reference-fault", "18483"


def _rows(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"]}


@pytest.mark.slow(
    cost_s=450, rank=2, reason="the clean conform run and the reference container (406 s), if not made"
)
def test_reference_passes_on_the_trained_model_within_the_tolerance(
    clean_conform: tuple[dict, Path],
) -> None:
    doc, _ = clean_conform
    row = _rows(doc)["reference"]
    print(json.dumps(row, indent=1)[:4000])
    assert row["status"] == "passed", row["reason"]
    details = row["details"]
    assert details["class"] == "Qwen3_5MoeForConditionalGeneration" and details["transformers"] == "5.19.0"
    # 6 prompts of 48 tokens, the 2000-word prompt's 48 and the long continuation's 1024 (conform.reference.
    # long_tokens): every position scored, none outside the rule (the CPU's own noise between vLLM's bf16 decode and
    # transformers' float32 pass: 1e-4 nats measured, benchmarks/conform.md).
    scored = 7 * 48 + 1024
    assert details["prompts"] == 8 and details["tokens"] == scored and details["misses"] == []
    assert details["deltas"]["positions"] == scored and details["deltas"]["max"] <= 0.01, details["deltas"]
    assert "teacher-forced" in row["reason"] and "after the servers stopped" in row["reason"]
    assert "need not fit in memory twice" in details["sequential"]
    REAL_TIMINGS["conform_reference_s"] = round(row["duration_s"], 1)
    # Which kernels produced the answers: what vLLM logged at start, beside the prediction (none on a CPU recipe).
    kernels = doc["kernels"]
    assert kernels["selected_at_start"]["moe.bf16"]["selected"] == "CPU", (
        kernels
    )  # "Using CPU Unquantized MoE ..."
    assert kernels["predicted"] is None and "CPU recipe" in kernels["prediction"]


def _faulty_profile(tmp_path: Path) -> Path:
    """The conform profile (same name) with CorruptAfter loaded by vLLM's --logits-processors."""
    doc = yaml.safe_load(Path(CONFORM_PROFILE).read_text())
    doc["args"]["logits-processors"] = ["sparkforge_faults:CorruptAfter"]
    doc["allow"] = {
        "logits-processors": opt_in_reason(
            "the test's own planted fault (tests/engine/planted_faults.py)", doc["args"]["logits-processors"]
        )
    }
    path = tmp_path / f"{FAULT_PROFILE}.yaml"  # its own name and port: never the shared clean run's container
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _port(args: list[str]) -> list[str]:
    return [FAULT_PORT if previous == "--port" else a for previous, a in zip(["", *args], args, strict=False)]


@pytest.mark.slow(
    cost_s=300, rank=2, reason="its own faulty twin server and a reference decode (439 s under load)"
)
def test_a_fault_identical_in_every_mode_is_caught_by_reference_alone(
    cpu_twin: str, trained_model: Path, tmp_path: Path
) -> None:
    faulty_image(cpu_twin, tmp_path / "faulty-image", FAULTY)
    report = tmp_path / "fault.json"
    try:
        code, out, seconds = conform(
            str(_faulty_profile(tmp_path)), *_port(launch_args(FAULTY, trained_model, tmp_path / "cache")),
            "--checks", "determinism,reference", "--json", str(report),
        )  # fmt: skip
    finally:
        sh(DOCKER, "rmi", FAULTY, check=False)
    REAL_TIMINGS["conform_reference_fault_s"] = round(seconds, 1)
    rows = _rows(json.loads(report.read_text()))
    print(json.dumps({n: (r["status"], r["reason"][:300]) for n, r in rows.items()}, indent=1))
    assert code == 1 and "conform failed (reference)" in out, out[-4000:]
    # The server agrees with itself: a row comparing it with itself passes on the fault.
    assert rows["determinism"]["status"] == "passed", rows["determinism"]["reason"]
    row = rows["reference"]
    assert row["status"] == "failed" and row["details"]["position"] == 40, row["reason"]
    reason = row["reason"]
    # The first position outside the rule: where, the text before it, the served token with both logprobs, both
    # top-5 lists. Prompt "0 1" continues 2 3 4 ...: token k is the number k + 2 (its id: the number + 4).
    before = " ".join(str(k + 2) for k in range(32, 40))
    assert reason.startswith(f"prompt 0 fails at token 40 after '{before}'"), reason
    assert "vLLM served 'user' [104]" in reason and "transformers' ['42'=46" in reason, reason
    # vLLM reports the raw logprobs (before the logits processor that forced the token): the served token's own value
    # agrees, and the near-tie rule is what refuses it (transformers' top-1 lies 15.8 nats above it).
    assert "nats above the served token (a near tie is at most 0.212)" in reason, reason
    # The seven prompts of the set and the long continuation (conform.reference.long_tokens): garbled from token 40.
    assert "8 of 8 prompts outside the rule" in reason, reason

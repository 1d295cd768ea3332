"""Mode-specific faults planted INSIDE the real vLLM (tests/engine/planted_faults.py through vLLM's own
`--logits-processors`, in the twin plus one layer), each caught by the row meant for it while the rows it must
not touch pass, and a server variant that crashes at start failing the report (never a skip).

One `invoke conform` on the trained tiny model, prefix caching off as profiled: greedy decodes corrupted only
while more than one request is batched (equivalence:concurrency), only in a server with prefix caching on
(equivalence:prefix-caching, whose variant turns it on), and the engine core dying at start-up when chunked
prefill is off (equivalence:chunked-prefill: `failed` with vLLM's last lines). determinism, long-decode and
streaming pass: one request at a time, prefix caching off, the faults are silent. Three server starts.
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conform_fixtures import CONFORM_PROFILE, conform_faulty, faulty_image, write_profile
from real_fixtures import REAL_TIMINGS, cpu_twin, trained_model  # noqa: F401

from sparkforge.recipe.allowlist import opt_in_reason

# In CI (not slow): three server starts, one of them crashing (benchmarks/conform.md).
# CI budget (tests/engine/ci_budget.py): cost on a fresh CI machine once the twin is built; benchmarks/ci.md.
pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow(cost_s=700, reason="three twin servers, one crashing at start (~1,372 s under load)"),
]
PROFILE = "cpu-tiny-qwen35moe-conform"


def _profile(tmp_path: Path) -> Path:
    doc = yaml.safe_load(Path(CONFORM_PROFILE).read_text())
    doc["args"]["logits-processors"] = [
        "sparkforge_faults:BatchedOnly",
        "sparkforge_faults:PrefixCachingOnly",
        "sparkforge_faults:CrashWithoutChunkedPrefill",
    ]
    doc["allow"] = {
        "logits-processors": opt_in_reason(
            "the test's own planted faults (tests/engine/planted_faults.py)", doc["args"]["logits-processors"]
        )
    }
    doc["args"]["enable-prefix-caching"] = False
    # The whole long prompt in one prefill step: vLLM 0.32's CPU platform kills its engine core on a SEEDED
    # request prefilled in chunks (test_conform_real.py's faulty profile says why).
    doc["args"]["max-num-batched-tokens"] = doc["args"]["max-model-len"]
    doc["conform"]["checks"] = ["determinism", "long-decode", "equivalence"]
    return write_profile(doc, PROFILE, tmp_path)


def test_mode_specific_faults_are_each_caught_by_their_row_and_a_crash_at_start_fails(
    cpu_twin: str, trained_model: Path, tmp_path: Path
) -> None:
    code, out, seconds, doc = conform_faulty(
        lambda where: faulty_image(cpu_twin, where), _profile(tmp_path), trained_model, tmp_path
    )
    REAL_TIMINGS["conform_mode_faults_s"] = round(seconds, 1)
    assert doc, out[-5000:]
    rows = {c["name"]: c for c in doc["checks"]}
    assert code == 1 and doc["status"] == "failed", out[-5000:]
    # Silent where they must be: one request at a time, prefix caching off as profiled.
    for name in ("determinism", "long-decode", "equivalence:streaming"):
        assert rows[name]["status"] == "passed", rows[name]
    assert rows["long-decode"]["details"]["right"] == 4096
    # Batched: the first divergence is at token 2 of a concurrent answer.
    assert rows["equivalence:concurrency"]["status"] == "failed"
    assert rows["equivalence:concurrency"]["details"]["position"] == 2, rows["equivalence:concurrency"]
    # Prefix caching on (the variant): wrong from token 5.
    assert rows["equivalence:prefix-caching"]["status"] == "failed"
    assert rows["equivalence:prefix-caching"]["details"]["position"] == 5, rows["equivalence:prefix-caching"]
    # The crash at start: failed, quoting vLLM's last lines, not a skip.
    crashed = rows["equivalence:chunked-prefill"]
    assert crashed["status"] == "failed" and "did not start" in crashed["reason"], crashed
    assert "exited with code" in crashed["reason"] and "last lines" in crashed["reason"], crashed
    assert rows["equivalence:speculative"]["status"] == "skipped"
    assert [s["config"] for s in doc["servers"]] == ["as profiled", "prefix caching on"]

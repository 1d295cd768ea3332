"""A fault that acts only with speculative decoding, planted INSIDE the real vLLM: drafts off by one token id and
every draft accepted unverified (tests/engine/planted_spec_fault.py, in the twin plus one layer; vLLM refuses
`--logits-processors` with speculative decoding, so it wraps vLLM's own `rejection_sample`). The distilled drafter
agrees with the model, so accepting its drafts alone changed nothing (the test failed on main for that reason:
672 of 672 drafts accepted, identical output); shifted, every draft disagrees with the target's choice, so the
greedy answers change exactly where it drafts.

One `invoke conform` of the MTP profile (tests/profiles/cpu-tiny-qwen35moe-conform-mtp.yaml, copied, rows cut to
`equivalence` and `speculative-acceptance`) on the faulty image: `equivalence:speculative` (the same prompts on a
server without speculative decoding) fails naming the first divergence; every other row on the faulty drafting
servers passes (streaming and 4 concurrent requests against its own reference pass, chunked prefill off with the
drafter still on), so the fault is mode-specific and only the row meant for it catches it. The
`speculative-acceptance` row passes too: accepting every draft reads as acceptance 1.0 in vLLM's counters,
which is why acceptance proves nothing about answers. Three server starts (as profiled, chunked prefill off,
speculative off; prefix caching on is the known-bad MTP combination, not started).
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conform_fixtures import conform_faulty, spec_faulty_image, write_profile
from real_fixtures import REAL_TIMINGS, cpu_twin, trained_model  # noqa: F401

from sparkforge.recipe.loader import REPO_ROOT

# CI budget (tests/engine/ci_budget.py): cost on a fresh CI machine once the twin is built; benchmarks/ci.md.
pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow(
        cost_s=250, rank=2, reason="three twin servers, two drafting with the planted fault (200 s, load ~2)"
    ),
]
MTP_PROFILE = REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe-conform-mtp.yaml"
PROFILE = "cpu-tiny-qwen35moe-conform-spec-fault"


def _profile(tmp_path: Path) -> Path:
    doc = yaml.safe_load(MTP_PROFILE.read_text())
    doc["description"] = (
        "the MTP conform profile on the image whose rejection sampler accepts every draft (test)"
    )
    doc["conform"]["checks"] = ["equivalence", "speculative-acceptance"]
    return write_profile(doc, PROFILE, tmp_path)


def test_accepting_every_draft_is_caught_by_speculative_equivalence_alone(
    cpu_twin: str, trained_model: Path, tmp_path: Path
) -> None:
    code, out, seconds, doc = conform_faulty(
        lambda where: spec_faulty_image(cpu_twin, where), _profile(tmp_path), trained_model, tmp_path
    )
    REAL_TIMINGS["conform_spec_fault_s"] = round(seconds, 1)
    rows = {c["name"]: c for c in doc.get("checks", [])}
    assert rows, out[-5000:]
    assert code == 1 and doc["status"] == "failed", out[-5000:]
    # Caught by the row meant for it, naming the first divergence (speculative on vs off).
    spec = rows["equivalence:speculative"]
    assert spec["status"] == "failed", spec
    assert "speculative on" in spec["reason"] and "NOT accepted" in spec["reason"], spec["reason"]
    assert spec["details"]["position"] >= 1, spec  # the first token comes from the prefill, before any draft
    # Silent everywhere else it runs with the drafter: the comparisons on the faulty servers pass.
    for name in ("equivalence:streaming", "equivalence:concurrency", "equivalence:chunked-prefill"):
        assert rows[name]["status"] == "passed", rows[name]
    assert rows["equivalence:prefix-caching"]["status"] == "skipped"  # the known-bad MTP combination
    # Every draft accepted: vLLM's counters read acceptance 1.0 on each drafting server.
    servers = {s["config"]: s for s in doc["servers"]}
    assert list(servers) == ["as profiled", "chunked prefill off", "speculative decoding off"], servers
    for config in ("as profiled", "chunked prefill off"):
        counted = servers[config]["spec_decode"]
        assert counted["draft_tokens"] > 0 and counted["accepted_tokens"] == counted["draft_tokens"], counted
        assert counted["acceptance"] == 1.0
    assert "spec_decode" not in servers["speculative decoding off"]
    accepted = rows["speculative-acceptance"]
    assert accepted["status"] == "passed" and accepted["details"]["acceptance"] == 1.0, accepted

"""A fault in the served cache of a hybrid model, caught by conform for real (issue 60's second deliverable): a
derived twin image (tests/engine/planted_state_fault.py) loses the linear-attention layers' recurrent state at every
384-token boundary of a sequence, as a hybrid cache that fails to carry the state into a sequence's next block
would, while it serves the clean trained tiny Qwen3.5-MoE. The 120 short probes never reach a boundary and pass;
the reference's long continuation (conform.reference.long_tokens) and the long decode do, and fail there.

(A fault in the full-attention blocks past the first, planted the same way, moved no logprob of this model past
0.0002 nats: it counts through its linear-attention layers; benchmarks/conform.md.)
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

from pathlib import Path

import pytest
from conform_fixtures import CONFORM_PROFILE, conform_faulty, state_faulty_image
from real_fixtures import REAL_TIMINGS, cpu_twin, trained_model  # noqa: F401

pytestmark = pytest.mark.engine
BOUNDARY = 384  # vLLM's attention block on this hybrid model ("Setting attention block size to 384 tokens")


@pytest.mark.slow(
    cost_s=300,
    rank=61,
    reason="a derived twin image whose linear-attention state is lost every 384 tokens; known-answers, the "
    "reference with its long continuation and the 4096-token long decode (~240 s)",
)
def test_a_recurrent_state_lost_at_a_block_boundary_is_caught_by_the_long_rows(
    cpu_twin: str, trained_model: Path, tmp_path: Path
) -> None:
    code, out, seconds, doc = conform_faulty(
        lambda where: state_faulty_image(cpu_twin, where), Path(CONFORM_PROFILE), trained_model, tmp_path,
        "--reference-model-dir", str(trained_model), "--checks", "known-answers,reference,long-decode",
    )  # fmt: skip
    REAL_TIMINGS["conform_state_fault_s"] = round(seconds, 1)
    rows = {c["name"]: c for c in doc["checks"]}
    assert code == 1, out[-3000:]
    # The probes are short: no boundary, no change.
    assert rows["known-answers"]["status"] == "passed", rows["known-answers"]["reason"]
    # The reference's long continuation (the eighth prompt) fails at the first boundary, named with its values.
    reference = rows["reference"]
    assert reference["status"] == "failed", reference["reason"]
    assert reference["details"]["prompt"] == 7, reference["reason"]
    assert BOUNDARY - 16 <= reference["details"]["position"] <= BOUNDARY, reference["reason"]
    assert "1 of 8 prompts outside the rule" in reference["reason"], reference["reason"]
    # The long decode leaves the known progression at a boundary too.
    assert rows["long-decode"]["status"] == "failed", rows["long-decode"]["reason"]
    assert "not-the-answer" in rows["long-decode"]["reason"], rows["long-decode"]["reason"]

"""A fault in the server's KV cache, caught by conform for real (issue 60's second deliverable): a derived twin image
(tests/engine/planted_kv_fault.py) where, past the first block of each sequence, the attention reads a stale block
back, serving the clean trained tiny Qwen3.5-MoE. The model counts on through its linear-attention layers, so no
greedy token changes; the `reference` row's long continuation (conform.reference.long_tokens) scores the values
at long positions and catches it past the first block.
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

from pathlib import Path

import pytest
from real_fixtures import cpu_twin, trained_model  # noqa: F401
from test_conform_model_faults_real import _caught

pytestmark = pytest.mark.engine


@pytest.mark.slow(
    cost_s=420,
    rank=61,
    reason="a derived twin image whose KV cache reads stale past the first block; known-answers, the reference "
    "(with its long continuation) and the 4096-token long decode",
)
def test_a_kv_cache_read_back_stale_past_the_first_block_is_caught_by_the_long_reference(
    cpu_twin: str, trained_model: Path, tmp_path: Path
) -> None:
    rows = _caught("kv cache stale", cpu_twin, trained_model, tmp_path, "known-answers,reference,long-decode")
    # The tiny model counts on through its linear-attention layers: no greedy token changes, the probes and the
    # long decode pass. Only the values at long positions move, in the reference's long continuation (the prompt
    # set's eighth), past the first block (384 tokens on this hybrid model).
    assert rows["long-decode"]["status"] == "passed", rows["long-decode"]["reason"]
    details = rows["reference"]["details"]
    assert details["prompt"] == 7 and details["position"] > 300, rows["reference"]["reason"]

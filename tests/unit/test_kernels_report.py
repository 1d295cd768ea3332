"""The kernel report on real fatbinaries (nvcc 13) and vLLM's recorded selection: verdicts per layer, JIT checks,
the selection check, Markdown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from audit_fixtures import nvcc_available
from release_fixtures import release_tree

from sparkforge.audit.scan import audit_target
from sparkforge.verify.kernels_report import coverage_summary, kernel_report, selected_by_layer, to_markdown

pytestmark = pytest.mark.skipif(not nvcc_available(), reason="nvcc 13 not found")

GOLDEN = Path(__file__).parent / "golden" / "selection-vllm-0.33.0-sm121-qwen35-fp8.json"
JIT = [
    {"name": "jit.toolchain", "status": "passed", "reason": "ptxas knows sm_121"},
    {"name": "jit.triton", "status": "passed", "reason": ""},
    {"name": "jit.flashinfer", "status": "failed", "reason": "nvcc missing"},
    {"name": "labels", "status": "passed", "reason": ""},
]


def _report(release: str, tmp_path: Path, checks=None, selection=None, started=None) -> dict:
    audit = audit_target(release_tree(release, tmp_path / release), gpu="sm_121", require=[])
    return kernel_report(
        audit, recipe="r", verify_checks=checks, selection=selection, started=started
    ).to_dict()


def test_without_a_selection_the_report_is_the_audit_and_says_so(tmp_path: Path) -> None:
    data = _report("family", tmp_path, JIT)
    assert {lib["path"].rsplit("/", 1)[1]: lib["verdict"] for lib in data["libraries"]} == {
        "_C.abi3.so": "native",
        "_moe_C.abi3.so": "family",
    }
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["selection"]["status"] == "skipped" and data["layers"] == [] and data["backends"] == []
    assert checks["jit.flashinfer"]["status"] == "failed" and data["status"] == "failed"
    text = to_markdown(data)
    assert "Not run (no model config" in text and "| jit.flashinfer | failed | nvcc missing |" in text
    assert coverage_summary(data)["by_verdict"]["family"] == 1


@pytest.mark.skipif(not GOLDEN.is_file(), reason="golden selection not recorded")
def test_the_selection_is_judged_against_the_libraries_and_the_jits(tmp_path: Path) -> None:
    answer = json.loads(GOLDEN.read_text())
    data = _report("family", tmp_path, JIT, selection=answer)
    layers = {r["layer"]: r for r in data["layers"]}
    assert set(layers) >= {"full_attention", "linear_attention", "vision_encoder", "moe.fp8_block", "sampler"}
    moe = layers["moe.fp8_block"]
    # the checkpoint's MoE: vLLM's own answer; its code is judged (_moe_C here is family-only)
    assert moe["checkpoint"] and moe["selected"] == next(
        lay["selected"] for lay in answer["layers"] if lay["layer"] == "moe.fp8_block"
    )
    assert all(n["verdict"] in ("native", "family", "jit", "none", "missing") for n in moe["needs"])
    cutlass = next(b for b in data["backends"] if b["name"] == "moe.fp8_block: VLLM_CUTLASS")
    assert not cutlass["usable"] and not cutlass["vllm_accepts"] and cutlass["reasons"]
    selection_check = next(c for c in data["checks"] if c["name"] == "selection")
    assert selection_check["reason"].startswith(f"vLLM {answer['vllm']} on sm_121: ")
    assert selected_by_layer(data)["moe.fp8_block"].startswith(moe["selected"])
    text = to_markdown(data)
    assert "## What vLLM selects on sm_121" in text and "| moe.fp8_block * |" in text
    assert "CudaPlatform.get_device_capability" in text


@pytest.mark.skipif(not GOLDEN.is_file(), reason="golden selection not recorded")
def test_what_vllm_logged_at_start_stands_beside_the_prediction(tmp_path: Path) -> None:
    answer = json.loads(GOLDEN.read_text())
    moe = next(lay["selected"] for lay in answer["layers"] if lay["layer"] == "moe.fp8_block")
    other = "MARLIN" if moe != "MARLIN" else "TRITON"
    started = {"moe.fp8_block": {"selected": other, "line": f"Using {other} Fp8 MoE backend out of ..."}}
    data = _report("native", tmp_path, JIT, selection=answer, started=started)
    assert data["warnings"] == [
        f"moe.fp8_block: predicted {moe}, selected at start {other} (log: Using {other} Fp8 MoE backend out of ...)"
    ]
    assert "selected at start |" in to_markdown(
        data
    ) and f"WARNING: moe.fp8_block: predicted {moe}" in to_markdown(data)

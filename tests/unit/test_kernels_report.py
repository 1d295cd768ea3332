"""The kernel report on real fatbinaries: library verdicts, the backend rule, the JIT checks, Markdown."""

from __future__ import annotations

from pathlib import Path

import pytest
from audit_fixtures import nvcc_available
from release_fixtures import release_tree

from sparkforge.audit.scan import audit_target
from sparkforge.verify.kernels_report import coverage_summary, kernel_report, to_markdown

pytestmark = pytest.mark.skipif(not nvcc_available(), reason="nvcc 13 not found")

JIT = [
    {"name": "jit.toolchain", "status": "passed", "reason": "ptxas knows sm_121"},
    {"name": "jit.triton", "status": "passed", "reason": ""},
    {"name": "jit.flashinfer", "status": "failed", "reason": "nvcc missing"},
    {"name": "labels", "status": "passed", "reason": ""},
]


def _report(release: str, tmp_path: Path, checks=None) -> dict:
    audit = audit_target(release_tree(release, tmp_path / release), gpu="sm_121", require=[])
    return kernel_report(audit, recipe="r", verify_checks=checks).to_dict()


def _backend(data: dict, name: str) -> dict:
    return next(b for b in data["backends"] if b["name"] == name)


def test_backends_follow_the_libraries_and_the_jit_checks(tmp_path: Path) -> None:
    native = _report("native", tmp_path, JIT)
    family = _report("family", tmp_path, JIT)
    assert {lib["path"].rsplit("/", 1)[1]: lib["verdict"] for lib in family["libraries"]} == {
        "_C.abi3.so": "native",
        "_moe_C.abi3.so": "family",
    }
    assert _backend(native, "fused_moe (Triton)")["verdict"] == "jit"  # worst of native _moe_C, Triton JIT
    moe = _backend(family, "marlin / CUTLASS MoE (vLLM _moe_C, _C)")
    assert moe["verdict"] == "family" and moe["usable"]
    assert _backend(family, "FLASHINFER")["verdict"] == "none"  # its JIT check failed
    assert _backend(family, "FLASH_ATTN (FA2)")["verdict"] == "missing"  # not in this image
    assert [c["name"] for c in family["checks"]][-4:] == [
        "jit.toolchain",
        "jit.triton",
        "jit.flashinfer",
        "backends",
    ]
    assert family["status"] == "failed"  # the failed JIT check fails the report


def test_without_a_verify_report_the_compilers_are_unchecked(tmp_path: Path) -> None:
    data = _report("native", tmp_path)
    assert data["jit"] is None and _backend(data, "TRITON_ATTN")["verdict"] == "unchecked"
    assert not _backend(data, "TRITON_ATTN")["usable"]
    assert coverage_summary(data)["by_verdict"]["native"] == 2
    text = to_markdown(data)
    assert "| TRITON_ATTN | attention | unchecked | no |" in text
    assert "Not checked (no verify report given)." in text and "Rule: " in text

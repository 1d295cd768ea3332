"""vLLM's selection as the kernel report reads it: bad input, the serve-log parser, the per-layer rows.

The selection document is what sparkforge/verify/inimage/vllm_selection.py printed in the CI image (vLLM 0.33.0, capability
12.1 injected, the Qwen3.5-35B-A3B-FP8 checkpoint config), kept under golden/; tests/engine/test_kernels_vllm.py
re-runs it against the image and fails when vLLM's answer changes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from audit_fixtures import Fixture, build_fixtures, nvcc_available

from sparkforge.recipe.profile import PROFILES_DIR
from sparkforge.verify import kernels_report, selection, started
from sparkforge.verify.kernels_run import selection_input

GOLDEN = Path(__file__).parent / "golden" / "selection-vllm-0.33.0-sm121-qwen35-fp8.json"
# vLLM 0.33.0's own log lines at start, as its format strings print them (vllm/platforms/cuda.py,
# qwen_gdn_linear_attn.py, oracle/fp8.py, kernels/linear/__init__.py, topk_topp_sampler.py).
LOG = """\
(EngineCore pid=77) INFO 12-01 13:00:01 [cuda.py:512] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].
(EngineCore pid=77) INFO 12-01 13:00:01 [cuda.py:570] Using backend AttentionBackendEnum.FLASH_ATTN for vit attention
(EngineCore pid=77) INFO 12-01 13:00:02 [qwen_gdn_linear_attn.py:300] Using FlashInfer GDN prefill kernel (requested=auto, head_k_dim=128).
(EngineCore pid=77) INFO 12-01 13:00:02 [fp8.py:536] Using TRITON Fp8 MoE backend out of potential backends: ['FLASHINFER_TRTLLM', 'TRITON'].
(EngineCore pid=77) INFO 12-01 13:00:02 [nvfp4.py:270] Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend out of potential backends: ['FLASHINFER_TRTLLM', 'FLASHINFER_CUTLASS'].
(EngineCore pid=77) INFO 12-01 13:00:02 [unquantized.py:294] Using FlashInfer CUTLASS Unquantized MoE backend out of potential backends: ['FlashInfer TRTLLM', 'FlashInfer CUTLASS'].
(EngineCore pid=77) INFO 12-01 13:00:02 [__init__.py:777] Selected CutlassFp8BlockScaledMMKernel for model.layers.0.mlp.shared_expert.gate_up_proj
(EngineCore pid=77) WARNING 12-01 13:00:03 [topk_topp_sampler.py:156] FlashInfer top-p/top-k sampling unavailable: nvcc not found; falling back. Set VLLM_USE_FLASHINFER_SAMPLER=0 to silence.
"""


def test_capability_must_be_sm_xy() -> None:
    assert selection.capability("sm_121") == "sm_121" and selection.capability("sm_120f") == "sm_120f"
    for bad in ("121", "sm121", "sm_1210", "sm_121x", "compute_121"):
        with pytest.raises(selection.SelectionError, match=r"sm_XY\[a\|f\].*fix:"):
            selection.capability(bad)


def test_a_config_that_is_not_json_is_one_paragraph(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("model_type: qwen3_5_moe\n")
    with pytest.raises(selection.SelectionError, match=r"not JSON .*fix: pass the checkpoint's config.json"):
        selection.read_model_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(selection.SelectionError, match=r"without 'architectures'.*fix:"):
        selection.read_model_config(bad)
    with pytest.raises(selection.SelectionError, match=r"cannot read it.*fix:"):
        selection.read_model_config(tmp_path / "missing.json")


def test_profiles_find_their_checkpoint_config(tmp_path: Path) -> None:
    ask = selection_input("qwen35-35b-a3b-fp8", "", "")
    assert ask is not None and ask.config["quantization_config"]["weight_block_size"] == [128, 128]
    assert ask.config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    nvfp4 = selection_input("qwen35-35b-a3b-nvfp4", "", "")
    assert nvfp4 is not None and nvfp4.config["quantization_config"]["quant_algo"] == "NVFP4"
    assert selection_input("", "", "") is None
    assert selection_input("qwen35-122b-a10b-fp8-tp2", "", "") is not None  # shipped since the memory plan
    # keyed by the model, not the file name: a renamed copy reads the same config; another model has none
    renamed = tmp_path / "a-renamed-copy.yaml"
    renamed.write_text((PROFILES_DIR / "qwen35-35b-a3b-fp8.yaml").read_text())
    copied = selection_input(str(renamed), "", "")
    assert copied is not None and copied.config == ask.config
    lonely = tmp_path / "a-profile-without-checkpoint.yaml"
    lonely.write_text(renamed.read_text().replace("Qwen/Qwen3.5-35B-A3B-FP8", "someone/Other-7B"))
    with pytest.raises(selection.SelectionError, match=r"no checkpoint config for someone/Other-7B .*fix:"):
        selection_input(str(lonely), "", "")


def test_the_serve_log_names_what_vllm_selected_at_start() -> None:
    seen = started.started_backends(LOG)
    assert {k: v["selected"] for k, v in seen.items()} == {
        "full_attention": "FLASH_ATTN",
        "vision_encoder": "FLASH_ATTN",
        "linear_attention": "flashinfer",
        "moe.fp8_block": "TRITON",
        "moe.nvfp4": "FLASHINFER_CUTLASS",
        "moe.bf16": "FlashInfer CUTLASS",
        "linear.fp8_block": "CutlassFp8BlockScaledMMKernel",
        "sampler": "forward_native",
    }
    rows = [
        {"layer": "moe.fp8_block", "selected": "MARLIN"},
        {"layer": "full_attention", "selected": "FLASH_ATTN"},
    ]
    warnings = started.compare(rows, seen)
    assert len(warnings) == 1 and warnings[0].startswith(
        "moe.fp8_block: predicted MARLIN, selected at start TRITON"
    )


@pytest.mark.skipif(not GOLDEN.is_file(), reason="golden selection not recorded")
def test_rows_judge_the_selected_code_and_name_the_fallback() -> None:
    answer = json.loads(GOLDEN.read_text())
    libraries = [
        {"path": "vllm/_C_stable_libtorch.abi3.so", "verdict": "native"},
        {"path": "vllm/_moe_C_stable_libtorch.abi3.so", "verdict": "native"},
        {"path": "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "verdict": "jit"},
        {"path": "torch/lib/libtorch_cuda.so", "verdict": "family"},
    ]
    jit = {"jit.toolchain": {"status": "passed"}, "jit.triton": {"status": "passed"},
           "jit.flashinfer": {"status": "failed"}}  # fmt: skip
    rows = {r["layer"]: r for r in kernels_report.layer_rows(answer, libraries, jit)}
    moe = rows["moe.fp8_block"]
    cutlass = next(c for c in moe["candidates"] if c["name"] == "VLLM_CUTLASS")
    assert not cutlass["usable"] and not cutlass["runs"]  # vLLM: grouped GEMM off for capability >= 11.0
    gdn = rows["linear_attention"]
    assert {c["name"] for c in gdn["candidates"]} >= {"triton"}
    assert gdn["fallback"] == "triton" or gdn["selected"] == "triton"
    assert rows["full_attention"]["selected"] == answer["layers"][0]["selected"]
    flat = kernels_report.backend_verdicts(list(rows.values()))
    assert any(b["name"] == "moe.fp8_block: VLLM_CUTLASS" and not b["usable"] for b in flat)


def _wheel(path: Path, library: Path, sources: dict[str, bytes]) -> Path:
    """A wheel as pip writes one: the files, then a RECORD with each file's urlsafe-base64 sha256."""
    import base64
    import hashlib
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        lines = []
        for name, data in {**sources, "vllm/_C.abi3.so": library.read_bytes()}.items():
            archive.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{name},sha256={digest},{len(data)}")
        archive.writestr("vllm-0.33.0.dist-info/RECORD", "\n".join(lines) + "\n")
    return path


@pytest.mark.skipif(not nvcc_available(), reason="nvcc 13 not found")
def test_a_wheel_audit_is_cached_by_its_zip_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkforge.verify import kernels_run

    monkeypatch.setenv("SPARKFORGE_CACHE", str(tmp_path / "cache"))
    library = build_fixtures([Fixture("wheel-sm_120f", ("compute_120f:sm_120f",), output="so")])[
        "wheel-sm_120f"
    ]
    wheel = _wheel(tmp_path / "vllm-0.33.0-py3-none-any.whl", library, {"vllm/platforms/cuda.py": b"# a\n"})
    first = kernels_run._audit_path(wheel, "sm_121", ["vllm/_C*.so"]).to_dict()
    assert len(list((tmp_path / "cache" / "kernels" / "audit").glob("*.json"))) == 1
    second = kernels_run._audit_path(wheel, "sm_121", ["vllm/_C*.so"]).to_dict()
    assert second["libraries"] == first["libraries"] and second["libraries"][0]["verdict"] == "family"
    assert [c["status"] for c in second["checks"]] == [c["status"] for c in first["checks"]]
    changed = _wheel(tmp_path / "other.whl", library, {"vllm/platforms/cuda.py": b"# b\n"})
    assert kernels_run.zip_digest(changed) != kernels_run.zip_digest(wheel)
    # the wheel's Python files against a runner's: one differs, one is the same
    digests = selection.wheel_python_digests(wheel)
    assert list(digests) == ["vllm/platforms/cuda.py"]
    assert selection.wheel_matches_runner(wheel, digests) == []
    assert selection.wheel_matches_runner(changed, digests) == ["vllm/platforms/cuda.py"]


# What the vLLM 0.33.0 in the CI image answered for quant_method 'sparkforge_fp3' (tests/engine/test_kernels_vllm.py,
# slow, asks it again): ModelConfig's own refusal, two lines.
REFUSAL = {
    "error": "config",
    "vllm": "0.33.0",
    "message": "ValidationError: 1 validation error for ModelConfig\n  Value error, Unknown quantization method: "
    "sparkforge_fp3. Must be one of ['awq', 'auto_awq', 'fp8', 'fbgemm_fp8', 'fp_quant', 'modelopt', 'modelopt_fp4']",
}


def test_vllm_refusing_the_quantization_is_one_paragraph() -> None:
    config = {"architectures": ["X"], "quantization_config": {"quant_method": "sparkforge_fp3"}}
    with pytest.raises(selection.SelectionError) as caught:
        selection._refuse(REFUSAL, "img", config, {})
    text = str(caught.value)
    assert "\n" not in text and text.startswith(
        "the quantization 'sparkforge_fp3' of the checkpoint is refused"
    )
    assert "Unknown quantization method: sparkforge_fp3" in text and "fix:" in text
    with pytest.raises(selection.SelectionError, match=r"^the quantization 'nvfp9' of the checkpoint"):
        selection._refuse(REFUSAL, "img", config, {"quantization": "nvfp9"})

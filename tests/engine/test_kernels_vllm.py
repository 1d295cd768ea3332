"""vLLM's own kernel selection in the CI image (vLLM 0.33.0 x86_64, no GPU), capability 12.1 injected.

Pins vLLM 0.33.0's answer for the Qwen3.5-35B-A3B-FP8 checkpoint on sm_121 (golden file, written by
`SPARKFORGE_UPDATE_GOLDEN=1`), the vLLM source lines the report cites, and the refusals of bad input.
One selection run in the shared CI image (session fixture vllm_image) serves every check here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sparkforge import engine
from sparkforge.verify import selection
from sparkforge.verify.kernels_run import selection_input

GOLDEN = Path(__file__).parent.parent / "unit" / "golden" / "selection-vllm-0.33.0-sm121-qwen35-fp8.json"
SITE = "/opt/venv/lib/python3.11/site-packages"
# vLLM 0.33.0 source lines the report and docs/kernels.md cite (file, text).
PINNED = (
    ("vllm/_custom_ops.py", "if cuda_device_capability < 90 or cuda_device_capability >= 110:"),
    ("vllm/platforms/cuda.py", "major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)"),
    ("vllm/platforms/cuda.py", "CudaPlatform = NvmlCudaPlatform if nvml_available else NonNvmlCudaPlatform"),
    ("vllm/model_executor/layers/fused_moe/experts/cutlass_moe.py", "return cutlass_group_gemm_supported()"),
    ("vllm/model_executor/layers/quantization/fp8.py", "allow_vllm_cutlass=False,"),
    ("vllm/model_executor/layers/fused_moe/oracle/nvfp4.py", "FLASHINFER_B12X is intentionally excluded"),
    # the log lines sparkforge/verify/started.py reads at serve time
    ("vllm/platforms/cuda.py", '"Using %s attention backend out of potential backends: %s."'),
    ("vllm/platforms/cuda.py", 'f"Using backend {vit_attn_backend} for vit attention"'),
    (
        "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py",
        '"Using %s GDN prefill kernel (requested',
    ),
    ("vllm/model_executor/layers/fused_moe/oracle/fp8.py", 'f"Using {backend.value} Fp8 MoE backend out "'),
    (
        "vllm/model_executor/layers/fused_moe/oracle/nvfp4.py",
        "f\"Using '{backend.value}' NvFp4 MoE backend out \"",
    ),
    (
        "vllm/model_executor/layers/fused_moe/oracle/unquantized.py",
        'f"Using {backend.value} Unquantized MoE backend out "',
    ),
    ("vllm/model_executor/kernels/linear/__init__.py", '"Using %s for NVFP4 GEMM"'),
    ("vllm/model_executor/kernels/linear/__init__.py", '"Selected %s for %s"'),
    ("vllm/v1/sample/ops/topk_topp_sampler.py", '"Using FlashInfer for top-p & top-k sampling."'),
)


@pytest.fixture(scope="module")
def answer(vllm_image: str) -> dict[str, Any]:
    ask = selection_input("qwen35-35b-a3b-fp8", "", "")
    assert ask is not None
    return selection.run_selection(vllm_image, "sm_121", ask.config, ask.args, digests=True, use_cache=False)


def _layer(answer: dict[str, Any], name: str) -> dict[str, Any]:
    return next(layer for layer in answer["layers"] if layer["layer"] == name)


def test_vllm_selects_for_sm121_and_cutlass_grouped_moe_is_out(answer: dict[str, Any]) -> None:
    assert answer["vllm"] == "0.33.0" and answer["capability"] == [12, 1]
    assert answer["platform_class"] in ("NonNvmlCudaPlatform", "NvmlCudaPlatform")
    assert (
        answer["checkpoint_kind"] == "fp8_block"
        and answer["architecture"] == "Qwen3_5MoeForConditionalGeneration"
    )
    errors = {layer["layer"]: layer.get("error") for layer in answer["layers"] if layer.get("error")}
    assert errors == {}
    moe = _layer(answer, "moe.fp8_block")
    cutlass = next(c for c in moe["candidates"] if c["name"] == "VLLM_CUTLASS")
    assert not cutlass["usable"] and cutlass["reasons"]
    assert moe["selected"] != "VLLM_CUTLASS"
    gdn = _layer(answer, "linear_attention")
    assert "triton" in {c["name"] for c in gdn["candidates"]}
    assert _layer(answer, "full_attention")["selected"] in {"FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"}
    assert answer["python_digests"]["vllm/platforms/cuda.py"]
    if os.environ.get("SPARKFORGE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps({k: v for k, v in answer.items() if k != "python_digests"}, indent=1,
                                     sort_keys=True) + "\n")  # fmt: skip
    golden = json.loads(GOLDEN.read_text())
    assert {lay["layer"]: lay["selected"] for lay in answer["layers"]} == {
        lay["layer"]: lay["selected"] for lay in golden["layers"]
    }


def test_the_cited_vllm_lines_are_in_the_image(vllm_image: str) -> None:
    for path, text in PINNED:
        source = engine.read_image_file(vllm_image, f"{SITE}/{path}")
        assert source is not None and text in source.decode(), (path, text)
    # the one list the selection script mirrors: select_nvfp4_moe_backend's local AVAILABLE_BACKENDS
    import re
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sparkforge" / "verify" / "inimage"))
    from vllm_selection import NVFP4_MOE_ORDER

    source = (
        engine.read_image_file(vllm_image, f"{SITE}/vllm/model_executor/layers/fused_moe/oracle/nvfp4.py")
        or b""
    ).decode()
    block = source.split("intentionally excluded from auto-selection", 1)[1].split("]", 1)[0]
    assert tuple(re.findall(r"NvFp4MoeBackend\.(\w+)", block)) == NVFP4_MOE_ORDER


@pytest.mark.slow(
    cost_s=120, reason="a second vLLM start in the image"
)  # a second vLLM start in the image (~80 s); tests/unit/test_kernels_selection.py reads its answer
def test_a_quantization_this_vllm_does_not_know_is_one_paragraph(vllm_image: str) -> None:
    ask = selection_input("qwen35-35b-a3b-fp8", "", "")
    assert ask is not None
    config = {**ask.config, "quantization_config": {"quant_method": "sparkforge_fp3"}}
    with pytest.raises(
        selection.SelectionError, match=r"quantization 'sparkforge_fp3' .*refused by the vLLM 0\.33\.0.*fix:"
    ):
        selection.run_selection(vllm_image, "sm_121", config, {})


def test_b12x_compiles_a_kernel_for_sm121a_without_a_gpu(vllm_image: str, tmp_path: Path) -> None:
    """jit.b12x in the CI image with vLLM's b12x extra added (b12x==1.5.1 from PyPI, --no-deps: its other
    requirements are vLLM's own), against a lock naming the component."""
    import subprocess
    import sys

    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "b12x==1.5.1", "-d", str(wheels)],
                   check=True, capture_output=True)  # fmt: skip
    lock = json.loads(engine.read_image_file(vllm_image, "/opt/sparkforge/lock.json") or b"{}")
    lock["components"]["b12x"] = {"package": "b12x", "version": "1.5.1", "source": "wheel"}
    (wheels / "lock.json").write_text(json.dumps(lock))
    suite = Path(__file__).resolve().parents[2] / "sparkforge" / "verify" / "inimage"
    result = engine.run_container(
        vllm_image,
        [
            "-c",
            "pip install -q --no-deps /w/b12x-1.5.1-py3-none-any.whl && python3 /s/checks_b12x.py --lock /w/lock.json",
        ],
        entrypoint=["/bin/bash"],
        timeout_s=600,
        volumes={str(wheels): "/w", str(suite): "/s"},
    )
    check = json.loads(result.stdout.strip().splitlines()[-1])
    assert check["status"] == "passed", check
    assert check["details"]["arch"] == "sm_121a" and check["details"]["cute_compiles"] >= 1

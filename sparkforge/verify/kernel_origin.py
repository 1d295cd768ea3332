"""Where the code of a kernel vLLM selected comes from, and how sparkforge checks that it can run on the GPU.

vLLM decides which kernel runs (sparkforge/verify/inimage/vllm_selection.py asks it); this table only says where each named
kernel's device code lives: a compiled library of the image (judged by the audit's verdict for the target) or a
compiler that builds it at serve time (judged by the in-image JIT check of that compiler). The names are vLLM
0.33.0's backend enum values and kernel class names; the paths are the extension modules their Python calls
(e.g. CutlassFp8BlockScaledMMKernel -> ops.cutlass_scaled_mm -> torch.ops._C from vllm/_C_stable_libtorch).
A name not in the table is reported as 'unknown origin', never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

C = "vllm/_C*.so"
MOE_C = "vllm/_moe_C*.so"
TORCH = "torch/lib/libtorch_cuda.so"


@dataclass(frozen=True)
class Origin:
    """Libraries (globs below site-packages) and serve-time compilers (in-image JIT checks) a kernel needs."""

    libraries: tuple[str, ...] = ()
    compilers: tuple[str, ...] = ()
    note: str = ""

    @property
    def kind(self) -> str:
        if self.libraries and self.compilers:
            return "library+jit"
        return "library" if self.libraries else "jit" if self.compilers else "unknown"


TRITON = Origin(compilers=("jit.triton",), note="Triton kernels compiled at first use")
FLASHINFER = Origin(compilers=("jit.toolchain", "jit.flashinfer"), note="FlashInfer JIT (nvcc at first use)")
CUTE_DSL = Origin(compilers=("jit.toolchain",), note="CuTe DSL (nvidia-cutlass-dsl) compiled at first use")
B12X = Origin(compilers=("jit.b12x",), note="b12x CuTe DSL kernels JIT-compiled for sm_121a")
DEEP_GEMM = Origin(compilers=("jit.toolchain",), note="DeepGEMM JIT")

ORIGINS: dict[str, Origin] = {
    # attention (AttentionBackendEnum names; FLASH_ATTN is split by vLLM's get_flash_attn_version)
    "FLASH_ATTN/FA2": Origin(("vllm/vllm_flash_attn/_vllm_fa2_C*.so",)),
    "FLASH_ATTN/FA3": Origin(("vllm/vllm_flash_attn/_vllm_fa3_C*.so",)),
    "FLASH_ATTN/FA4": CUTE_DSL,
    "FLASHINFER": FLASHINFER,
    "TRITON_ATTN": TRITON,
    "FLEX_ATTENTION": TRITON,
    "TRITON_MLA": TRITON,
    "TORCH_SDPA": Origin((TORCH,)),
    "TURBOQUANT": TRITON,
    # gated-delta-net prefill (_resolve_gdn_prefill_backend's answers); decode is Triton/FLA either way
    "flashinfer": FLASHINFER,
    "triton": TRITON,
    "cutedsl": CUTE_DSL,
    # MoE (Fp8MoeBackend / NvFp4MoeBackend / UnquantizedMoeBackend values)
    "TRITON": Origin((MOE_C,), ("jit.triton",), "Triton fused_moe; routing/align ops from _moe_C"),
    "BATCHED_TRITON": Origin((MOE_C,), ("jit.triton",)),
    "MARLIN": Origin((MOE_C,), note="Marlin MoE kernels compiled into _moe_C"),
    "VLLM_CUTLASS": Origin((C,), note="CUTLASS grouped GEMM in _C"),
    "BATCHED_VLLM_CUTLASS": Origin((C,)),
    "FLASHINFER_CUTLASS": FLASHINFER,
    "FLASHINFER_TRTLLM": FLASHINFER,
    "FLASHINFER_CUTEDSL": CUTE_DSL,
    "FLASHINFER_CUTEDSL_BATCHED": CUTE_DSL,
    "FLASHINFER_B12X": B12X,
    "B12X": B12X,
    "DEEPGEMM": DEEP_GEMM,
    "BATCHED_DEEPGEMM": DEEP_GEMM,
    "EMULATION": Origin((TORCH,), ("jit.triton",), "dequantize to BF16, then the unquantized path"),
    "HUMMING": Origin(compilers=("jit.toolchain",), note="humming-kernels, compiled at first use"),
    "FlashInfer CUTLASS": FLASHINFER,  # UnquantizedMoeBackend values
    "FlashInfer TRTLLM": FLASHINFER,
    # linear kernels (class names from vllm.model_executor.kernels.linear)
    "CutlassFp8BlockScaledMMKernel": Origin((C,)),
    "CutlassFP8ScaledMMLinearKernel": Origin((C,)),
    "TritonFp8BlockScaledMMKernel": TRITON,
    "MarlinFP8ScaledMMLinearKernel": Origin((C,)),
    "DeepGemmFp8BlockScaledMMKernel": DEEP_GEMM,
    "FlashInferFp8DeepGEMMDynamicBlockScaledKernel": FLASHINFER,
    "FlashInferFP8ScaledMMLinearKernel": FLASHINFER,
    "B12xFp8BlockScaledMMKernel": B12X,
    "B12xTensorFP8ScaledMMLinearKernel": B12X,
    "BlockWiseTorchFP8ScaledMMLinearKernel": Origin((TORCH,)),
    "HummingFP8ScaledMMLinearKernel": Origin(compilers=("jit.toolchain",), note="humming-kernels JIT"),
    "HummingNvFp4LinearKernel": Origin(compilers=("jit.toolchain",), note="humming-kernels JIT"),
    "FlashInferCuteDslNvFp4W4A16LinearKernel": CUTE_DSL,
    "FbgemmNvFp4LinearKernel": Origin(note="fbgemm_gpu (not installed by vLLM)"),
    "CutlassNvFp4LinearKernel": Origin((C,), note="CUTLASS FP4 GEMM (nvfp4_scaled_mm_sm120) in _C"),
    "MarlinNvFp4LinearKernel": Origin((C,)),
    "FlashInferCutlassNvFp4LinearKernel": FLASHINFER,
    "FlashInferCuteDslNvFp4LinearKernel": CUTE_DSL,
    "FlashInferTrtllmNvFp4LinearKernel": FLASHINFER,
    "FlashInferCudnnNvFp4LinearKernel": FLASHINFER,
    "FlashInferB12xNvFp4LinearKernel": B12X,
    "B12xNvFp4LinearKernel": B12X,
    "B12xNvFp4W4A16LinearKernel": B12X,
    "EmulationNvFp4LinearKernel": Origin((TORCH,)),
    "TorchNvFp4LinearKernel": Origin((TORCH,)),
    # sampler (TopKTopPSampler's forward)
    "forward_cuda": FLASHINFER,
    "forward_native": Origin((TORCH,)),
}


def origin_of(name: str, detail: str = "") -> Origin:
    """The origin of a kernel vLLM named (`detail`: e.g. FA2 for FLASH_ATTN)."""
    return ORIGINS.get(f"{name}/{detail}" if detail else name) or ORIGINS.get(name) or Origin()


def selection_libraries(selection: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Every library glob a kernel of vLLM's answer (selected or candidate, as the report judges them) needs."""
    globs: set[str] = set()
    for layer in (selection or {}).get("layers") or []:
        selected, detail = layer.get("selected"), str(layer.get("detail") or "")
        if selected:
            globs.update(origin_of(str(selected), detail).libraries)
        for cand in layer.get("candidates") or []:
            name = str(cand.get("name"))
            globs.update(origin_of(name, detail if name == selected else "").libraries)
    return tuple(sorted(globs))


def report_scope(require: Sequence[str], selection: Mapping[str, Any] | None) -> tuple[str, ...] | None:
    """The libraries a kernel report's verdicts depend on: the required ones and those of vLLM's kernels.

    None (open every library) when there is nothing to limit to: no required glob and no selection."""
    if not require and selection is None:
        return None
    return tuple(sorted({*require, *selection_libraries(selection)}))

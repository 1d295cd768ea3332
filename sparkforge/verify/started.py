"""What vLLM says it selected when a profile starts (its log), set beside what the kernel report predicted.

The patterns are vLLM 0.33.0's own log lines (vllm/platforms/cuda.py get_attn_backend_cls and
get_vit_attn_backend, qwen_gdn_linear_attn._log_gdn_backend_decision, the MoE oracles' _make_log_backend,
kernels/linear init_fp8_linear_kernel / init_nvfp4_linear_kernel, topk_topp_sampler); tests pin them to the
wheel's sources. Layer names are the kernel report's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from sparkforge.boundary import bounded_lines, linear_regex

GDN_NAMES = {"FlashInfer": "flashinfer", "CuteDSL": "cutedsl", "AITER FlyDSL": "aiter_flydsl",
             "Triton/FLA": "triton", "SYCL": "sycl"}  # fmt: skip
MOE_KINDS = {"Fp8": "moe.fp8_block", "NvFp4": "moe.nvfp4", "Unquantized": "moe.bf16"}
PATTERNS: tuple[tuple[str, str], ...] = (
    ("full_attention", r"Using (\w+) attention backend out of potential backends"),
    ("full_attention", r"Using AttentionBackendEnum\.(\w+) backend\."),
    ("vision_encoder", r"Using backend AttentionBackendEnum\.(\w+) for vit attention"),
    (
        "linear_attention",
        r"Using (FlashInfer|CuteDSL|AITER FlyDSL|Triton/FLA|SYCL) GDN prefill kernel",
    ),
    (
        "moe",
        r"Using '?(\w[\w ]*?)'? (Fp8|NvFp4|Unquantized) MoE backend out of potential backends",
    ),
    ("linear.fp8_block", r"Selected (\w+Fp8\w*|\w+FP8\w*) for "),
    ("linear.nvfp4", r"Using (\w+) for NVFP4 GEMM"),
    ("sampler", r"Using FlashInfer for top-p & top-k sampling()"),
    ("sampler", r"FlashInfer top-p/top-k sampling unavailable()"),
)


@functools.cache
def _compiled() -> tuple[tuple[str, Any], ...]:
    # RE2: a log is untrusted text; the moe pattern's lazy repeat backtracks quadratically in `re` on a long line
    return tuple((layer, linear_regex(pattern)) for layer, pattern in PATTERNS)


def started_backends(log: str) -> dict[str, dict[str, Any]]:
    """layer -> {"selected": name, "line": the log line} for every selection vLLM logged (first one wins)."""
    out: dict[str, dict[str, Any]] = {}
    for line in bounded_lines(log):
        for layer, pattern in _compiled():
            match = pattern.search(line)
            if not match:
                continue
            name = match.group(1)
            if layer == "linear_attention":
                name = GDN_NAMES[name]
            elif layer == "moe":
                layer = MOE_KINDS[match.group(2)]
            elif layer == "sampler":
                name = "forward_cuda" if "Using FlashInfer" in line else "forward_native"
            out.setdefault(layer, {"selected": name, "line": line.strip()[-300:]})
    return out


def compare(layers: Sequence[Mapping[str, Any]], started: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Warnings, one per layer where what vLLM logged at start differs from the prediction (both named)."""
    warnings = []
    for layer in layers:
        seen = started.get(str(layer["layer"]))
        if seen and layer.get("selected") and seen["selected"] != layer["selected"]:
            warnings.append(
                f"{layer['layer']}: predicted {layer['selected']}, selected at start {seen['selected']} "
                f"(log: {seen['line'][-160:]})"
            )
    return warnings

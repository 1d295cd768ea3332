#!/usr/bin/env python3
"""vLLM's own kernel selection for a GPU this machine does not have; runs inside an image, needs no GPU.

Input (a JSON file, argv[1]): {"capability": "sm_121", "config": <the checkpoint's config.json>, "args": {...}}.
Output: one line `SPARKFORGE-SELECTION:<json>` on stdout.

Where the capability is injected: vLLM reads it in one place, `CudaPlatform.get_device_capability`
(vllm/platforms/cuda.py: NVML or torch.cuda); every capability gate goes through it. The script replaces that
classmethod and makes the CUDA platform `vllm.platforms.current_platform`. Device reads outside it, set the same
way: the sampler's SM count (`num_compute_units`, GB10: 48), FlashInfer's JIT target (FLASHINFER_CUDA_ARCH_LIST),
b12x's `get_compute_capability`. Every choice is made by vLLM's functions; each reason is vLLM's own answer.
docs/kernels.md says more.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

MARKER = "SPARKFORGE-SELECTION:"
NVFP4_MOE_ORDER = ("FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED", "FLASHINFER_CUTLASS",
                   "VLLM_CUTLASS", "MARLIN", "HUMMING", "EMULATION")  # fmt: skip


def capability_of(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"sm_(\d+)(\d)[af]?", text)
    if match is None:
        raise ValueError(f"capability {text!r} is not sm_XY[a|f]")
    return int(match.group(1)), int(match.group(2))


def inject(capability: tuple[int, int], sms: int) -> Any:
    """The CUDA platform with `capability` (and `sms` multiprocessors), installed as vLLM's current platform."""
    import vllm.platforms as platforms
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    cap = DeviceCapability(major=capability[0], minor=capability[1])
    cls = cuda.CudaPlatform
    cls.get_device_capability = classmethod(lambda _cls, device_id=0: cap)  # the one read
    # The sampler also asks for the SM count (FlashInfer's top-k needs > 16): GB10 has 48.
    cls.num_compute_units = classmethod(lambda _cls, device_id=0: sms)
    import torch

    torch.accelerator.current_device_index = lambda: 0  # the argument the sampler passes to num_compute_units
    try:  # b12x (vLLM's b12x extra) gates its kernels on its own read: b12x/_lib/gating.py get_compute_capability
        from b12x._lib import gating

        gating.get_compute_capability = lambda device=None: capability
    except ImportError:
        pass
    # FlashInfer finds its JIT target from the GPU, or from this variable (its documented GPU-less setting).
    os.environ.setdefault(
        "FLASHINFER_CUDA_ARCH_LIST", f"{capability[0]}.{capability[1]}{'a' if capability[0] >= 9 else ''}"
    )
    platforms.current_platform = cls()
    return platforms.current_platform


def vllm_config(config: dict[str, Any], args: dict[str, Any]) -> Any:
    """vLLM's VllmConfig for the checkpoint's config.json (written to a folder: vLLM reads it like a model)."""
    from vllm.config import ModelConfig, VllmConfig

    folder = Path(tempfile.mkdtemp(prefix="sparkforge-model-"))
    (folder / "config.json").write_text(json.dumps(config))
    kwargs: dict[str, Any] = {"model": str(folder), "skip_tokenizer_init": True}
    for key in ("dtype", "quantization", "max_model_len"):
        if args.get(key.replace("_", "-")) is not None:
            kwargs[key] = args[key.replace("_", "-")]
    model = ModelConfig(**kwargs)
    return VllmConfig(model_config=model)


def _attention(platform: Any, head_size: int, dtype: Any, kv_cache_dtype: str | None) -> dict[str, Any]:
    from vllm.v1.attention.selector import AttentionSelectorConfig, get_attn_backend

    chosen = get_attn_backend(head_size, dtype, kv_cache_dtype)
    selector = AttentionSelectorConfig(
        head_size=head_size, dtype=dtype, kv_cache_dtype=kv_cache_dtype, block_size=None
    )
    valid, invalid = platform.get_valid_backends(platform.get_device_capability(), selector)
    candidates = [
        {"name": c.backend.name, "priority": c.priority, "usable": True, "reasons": []} for c in valid
    ]
    candidates += [
        {"name": b.name, "priority": p, "usable": False, "reasons": list(r)} for b, (p, r) in invalid.items()
    ]
    candidates.sort(key=lambda c: c["priority"])
    name = chosen.get_name()
    out = {"selected": name, "class": f"{chosen.__module__}.{chosen.__qualname__}", "candidates": candidates}
    if name == "FLASH_ATTN":
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

        out["detail"] = f"FA{get_flash_attn_version(head_size=head_size)}"
    return out


def _gdn(vcfg: Any) -> dict[str, Any]:
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn

    requested, active = gdn._resolve_gdn_prefill_backend(vcfg)
    return {
        "selected": active,
        "requested": requested,
        "class": "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn._resolve_gdn_prefill_backend",
        "candidates": [{"name": active, "priority": 0, "usable": True, "reasons": []}]
        + ([] if active == "triton" else [{"name": "triton", "priority": 1, "usable": True, "reasons": []}]),
    }


def _vision(platform: Any, head_size: int, dtype: Any) -> dict[str, Any]:
    chosen = platform.get_vit_attn_backend(head_size=head_size, dtype=dtype)
    candidates = []
    for priority, backend in enumerate(platform.get_supported_vit_attn_backends()):
        reasons = []  # the checks get_vit_attn_backend makes per backend (vllm/platforms/cuda.py)
        if backend.name != "TORCH_SDPA":
            try:
                cls = backend.get_class()
                for ok, why in (
                    (cls.supports_head_size(head_size), f"head size {head_size}"),
                    (cls.supports_dtype(dtype), f"dtype {dtype}"),
                    (cls.supports_compute_capability(platform.get_device_capability()), "capability"),
                ):
                    reasons += [] if ok else [f"{why} not supported"]
            except ImportError as exc:
                reasons.append(f"ImportError: {exc}")
        candidates.append(
            {"name": backend.name, "priority": priority, "usable": not reasons, "reasons": reasons}
        )
    out = {"selected": chosen.name, "class": "get_vit_attn_backend", "candidates": candidates}
    if chosen.name == "FLASH_ATTN":
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

        out["detail"] = f"FA{get_flash_attn_version(head_size=head_size)}"
    return out


def _moe_config(text: Any, dtype: Any) -> Any:
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )

    experts = int(getattr(text, "num_experts", 0) or getattr(text, "n_routed_experts", 0))
    return FusedMoEConfig(
        num_experts=experts,
        experts_per_token=int(text.num_experts_per_tok),
        hidden_dim=int(text.hidden_size),
        intermediate_size=int(text.moe_intermediate_size),
        num_local_experts=experts,
        num_logical_experts=experts,
        activation=MoEActivation.SILU,
        device="cuda",
        routing_method=RoutingMethodType.Renormalize,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        in_dtype=dtype,
    )


def _walk(backends: list[Any], kernels: Any, config: Any, wkey: Any, akey: Any) -> list[dict[str, Any]]:
    """Each backend of vLLM's priority list with vLLM's own answer for this config (first usable wins)."""
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk

    fmt = mk.FusedMoEActivationFormat.Standard
    out = []
    for priority, backend in enumerate(backends):
        reasons = []
        usable = False
        try:
            for k_cls in kernels(backend):
                ok, reason = k_cls.is_supported_config(k_cls, config, wkey, akey, fmt)
                if ok:
                    usable = True
                    break
                reasons.append(f"{k_cls.__name__}: {reason}")
        except Exception as exc:  # an import of a missing optional package is vLLM's "unavailable"
            reasons.append(f"{type(exc).__name__}: {exc}")
        out.append(
            {
                "name": backend.value,
                "priority": priority,
                "usable": usable,
                "reasons": [] if usable else reasons,
            }
        )
    return out


def _skipped_above(candidates: list[dict[str, Any]], selected: str, why: str) -> list[dict[str, Any]]:
    """Candidates ahead of vLLM's choice that pass their own check were dropped by the oracle itself."""
    top = next((c["priority"] for c in candidates if c["name"] == selected), None)
    for cand in candidates:
        if top is not None and cand["priority"] < top and cand["usable"]:
            cand.update(usable=False, reasons=[f"left out by vLLM's selection: {why}"])
    return candidates


def _moe(kind: str, text: Any, dtype: Any) -> dict[str, Any]:
    from vllm.model_executor.layers.quantization.utils import quant_utils as q

    config = _moe_config(text, dtype)
    if kind == "fp8_block":
        from vllm.model_executor.layers.fused_moe.oracle import fp8

        wkey, akey = q.kFp8Static128BlockSym, q.kFp8Dynamic128Sym
        backend, _ = fp8.select_fp8_moe_backend(config, wkey, akey, allow_vllm_cutlass=False)
        order = fp8._get_priority_backends(config, wkey, akey)
        candidates = _skipped_above(
            _walk(order, fp8.backend_to_kernel_cls, config, wkey, akey),
            backend.value,
            "Fp8MoEMethod passes allow_vllm_cutlass=False; DeepGEMM off for this model "
            "type (should_auto_disable_deep_gemm)",
        )
    elif kind == "nvfp4":
        from vllm.model_executor.layers.fused_moe.oracle import nvfp4

        wkey, akey = q.kNvfp4Static, q.kNvfp4Dynamic
        backend, _ = nvfp4.select_nvfp4_moe_backend(config, wkey, akey)
        # select_nvfp4_moe_backend's own list is a local (oracle/nvfp4.py, "AVAILABLE_BACKENDS = [" after
        # "intentionally excluded from auto-selection"): mirrored here, pinned by tests/engine/test_kernels_vllm.py
        order = nvfp4.prioritize_humming([getattr(nvfp4.NvFp4MoeBackend, n) for n in NVFP4_MOE_ORDER])
        candidates = _skipped_above(
            _walk(order, nvfp4.backend_to_kernel_cls, config, wkey, akey),
            backend.value,
            "select_nvfp4_moe_backend",
        )
    else:
        from vllm.model_executor.layers.fused_moe.oracle import unquantized as uq

        backend, _ = uq.select_unquantized_moe_backend(config)
        candidates = _skipped_above(
            _walk(uq._get_priority_backends(config), uq.backend_to_kernel_cls, config, None, None),
            backend.value,
            "select_unquantized_moe_backend",
        )
    return {"selected": backend.value, "class": f"{kind} MoE oracle", "candidates": candidates}


def _linear(kind: str, dtype: Any, shape: tuple[int, int]) -> dict[str, Any]:
    from vllm.model_executor.kernels import linear as lin
    from vllm.model_executor.layers.quantization.utils import quant_utils as q

    if kind == "fp8_block":
        config = lin.FP8ScaledMMLinearLayerConfig(
            weight_quant_key=q.kFp8Static128BlockSym,
            activation_quant_key=q.kFp8Dynamic128Sym,
            input_dtype=dtype,
            out_dtype=dtype,
            weight_shape=shape,
        )
        chosen = lin.init_fp8_linear_kernel(q.kFp8Dynamic128Sym, q.kFp8Static128BlockSym, dtype, dtype, shape)
        possible = lin._POSSIBLE_FP8_BLOCK_KERNELS
    else:
        config = lin.NvFp4LinearLayerConfig()
        chosen = lin.init_nvfp4_linear_kernel()
        possible = lin._POSSIBLE_NVFP4_KERNELS
    import vllm.platforms as platforms

    candidates = []
    for priority, kernel in enumerate(possible[platforms.current_platform._enum]):
        try:
            ok, reason = lin.is_supported_and_can_implement_kernel(kernel, config, None)
        except Exception as exc:
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        candidates.append(
            {
                "name": kernel.__name__,
                "priority": priority,
                "usable": ok,
                "reasons": [reason] if reason else [],
            }
        )
    return {"selected": type(chosen).__name__, "class": f"{kind} linear", "candidates": candidates}  # fmt: skip


def _sampler() -> dict[str, Any]:
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler, _flashinfer_jit_unsupported_reason

    sampler = TopKTopPSampler()
    name = getattr(sampler.forward, "__name__", "forward")
    import vllm.platforms as platforms

    why = (
        []
        if name == "forward_cuda"
        else [
            str(
                _flashinfer_jit_unsupported_reason(platforms.current_platform.get_device_capability())
                or "flashinfer_sampler_supported() is False"
            )
        ]
    )
    return {"selected": name, "class": "TopKTopPSampler", "candidates": [
        {"name": "forward_cuda", "priority": 0, "usable": name == "forward_cuda", "reasons": why},
        {"name": "forward_native", "priority": 1, "usable": True, "reasons": []}]}  # fmt: skip


def _quant_kind(vcfg: Any) -> str:
    quant = vcfg.model_config.quantization
    if quant is None:
        return "bf16"
    qcfg = getattr(vcfg.model_config.hf_config, "quantization_config", None) or {}
    if quant == "fp8" and qcfg.get("weight_block_size"):
        return "fp8_block"
    if quant in ("modelopt_fp4", "nvfp4") or "nvfp4" in json.dumps(qcfg).lower():
        return "nvfp4"
    return str(quant)


def _guard(what: str, func: Any, *args: Any) -> dict[str, Any]:
    try:
        return {"layer": what, **func(*args)}
    except Exception as exc:
        return {"layer": what, "selected": None, "error": f"{type(exc).__name__}: {exc}",
                "where": traceback.format_exc().splitlines()[-3:]}  # fmt: skip


def _python_digests() -> dict[str, str]:
    """The installed vLLM's `vllm/...py` files -> RECORD sha256 (to compare a wheel's sources with these)."""
    from importlib.metadata import files

    return {str(f): f.hash.value for f in files("vllm") or [] if str(f).endswith(".py") and f.hash}


def select(request: dict[str, Any]) -> dict[str, Any]:
    import torch
    import vllm
    from vllm.config import set_current_vllm_config

    capability = capability_of(str(request["capability"]))
    platform = inject(capability, int(request.get("sms", 48)))
    try:
        vcfg = vllm_config(dict(request["config"]), dict(request.get("args") or {}))
    except Exception as exc:
        return {"error": "config", "message": f"{type(exc).__name__}: {exc}", "vllm": vllm.__version__}
    text = vcfg.model_config.hf_text_config
    dtype = vcfg.model_config.dtype
    kind = _quant_kind(vcfg)
    head = int(getattr(text, "head_dim", 0) or text.hidden_size // text.num_attention_heads)
    layer_types = set(getattr(text, "layer_types", None) or ["full_attention"])
    layers = []
    with set_current_vllm_config(vcfg):
        if "full_attention" in layer_types:
            layers.append(_guard("full_attention", _attention, platform, head, dtype, None))
        if "linear_attention" in layer_types:
            layers.append(_guard("linear_attention", _gdn, vcfg))
        vision = getattr(vcfg.model_config.hf_config, "vision_config", None)
        if vision is not None:
            vhead = int(vision.hidden_size // vision.num_heads)
            layers.append(_guard("vision_encoder", _vision, platform, vhead, dtype))
        moe_kinds = ["fp8_block", "nvfp4", "bf16"]
        if getattr(text, "num_experts", 0):
            for moe in moe_kinds:
                layers.append({**_guard(f"moe.{moe}", _moe, moe, text, dtype), "checkpoint": moe == kind})
        shape = (int(text.hidden_size), int(text.hidden_size))
        for lin in ("fp8_block", "nvfp4"):
            layers.append({**_guard(f"linear.{lin}", _linear, lin, dtype, shape), "checkpoint": lin == kind})
        layers.append(_guard("sampler", _sampler))
    return {
        "vllm": vllm.__version__,
        "vllm_file": vllm.__file__,
        "torch": torch.__version__,
        "capability": list(capability),
        "injected_at": "vllm.platforms.cuda.CudaPlatform.get_device_capability",
        "platform_class": type(platform).__name__,
        "architecture": (vcfg.model_config.architectures or [None])[0],
        "quantization": vcfg.model_config.quantization,
        "checkpoint_kind": kind,
        "layers": layers,
        "python_digests": _python_digests() if request.get("digests") else None,
    }


def without_driver() -> str:
    """Let vLLM's extension modules (they need libcuda.so.1) load without a driver: the image's link stub with that
    soname ($CUDA_HOME/lib/stubs/libcuda.so) loaded first, lazy binding; no CUDA call is made here."""
    import ctypes
    import os

    try:
        ctypes.CDLL("libcuda.so.1")
        return "driver"
    except OSError:
        pass
    home = Path(os.environ.get("CUDA_HOME", "/opt/venv/cuda"))
    stub = home / "lib" / "stubs" / "libcuda.so"
    if not stub.exists():
        return "none"
    ctypes.CDLL(str(stub), mode=os.RTLD_GLOBAL)
    sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_GLOBAL)
    return f"link stub {stub}"


def main() -> int:
    logging.disable(logging.WARNING)
    driver = without_driver()
    request = json.loads(Path(sys.argv[1]).read_text())
    try:
        result = select(request)
    except Exception as exc:
        result = {"error": "selection", "message": f"{type(exc).__name__}: {exc}",
                  "where": traceback.format_exc().splitlines()[-6:]}  # fmt: skip
    result["driver"] = driver
    print(MARKER + json.dumps(result, sort_keys=True, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

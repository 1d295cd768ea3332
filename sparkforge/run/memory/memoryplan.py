"""The memory plan of one serve profile: per node, weights + activation peak + CUDA graphs + workspace + KV cache
inside vLLM's budget (gpu-memory-utilization x the node's memory), and what unified memory keeps for the host.

Pure arithmetic (no engine, no download): the checkpoint's dimensions (checkpoint.py), vLLM's weight layout
(weightbytes.py) and KV cache layout (kvcache.py), the profile's flags with vLLM 0.33.0's defaults on GB10.
Verdict: 'fits', 'tight' (starts, but the host keeps less than its reserve or fewer than two full-length
requests fit) or 'does not fit' (vLLM refuses at start, or the weights leave no room), with the fixes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from sparkforge.boundary import parse_json
from sparkforge.errors import InputError, RunError
from sparkforge.run.memory.checkpoint import DTYPE_BYTES, Architecture
from sparkforge.run.memory.kvcache import CacheSettings, KvSpec, kv_spec
from sparkforge.run.memory.weightbytes import Split, cdiv, stage_weights

GiB = 1 << 30


@dataclass(frozen=True)
class NodeMemory:
    """One node's memory as vLLM and the host see it."""

    kind: str  # "gb10" or "cpu" (the CPU twin: KV cache sized by VLLM_CPU_KVCACHE_SPACE)
    total: int  # bytes vLLM calls the device's total
    held_at_boot: int  # what the OS, driver and firmware already hold when nothing runs
    reserve: int  # what the host must keep outside vLLM's budget


# GB10: CUDA reports 121.69 GiB total; on a fresh, headless Spark with caches dropped, free memory at boot caps at
# 101.3-102.2 GiB (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47): ~19.5 GiB are held before anything starts.
# The reserve adds 4.5 GiB for what runs beside the GPU budget on the same memory: the API server's and engine's
# CPU-side processes (Python heaps, tokenizer), Docker, and page-cache churn while safetensors are read.
GB10 = NodeMemory("gb10", total=int(121.69 * GiB), held_at_boot=int(19.5 * GiB), reserve=24 * GiB)
ACTIVATION_MARGIN = 1.2  # the estimate below covers the large buffers only: allocator slack on top
WORKSPACE = GiB  # cuBLAS/FlashInfer workspaces and the CUDA context outside torch's allocator
NCCL_BUFFERS = GiB // 2  # per rank when TP or PP > 1
CUDA_GRAPHS = (
    3 * GiB // 2
)  # FULL_AND_PIECEWISE graphs (vLLM's default for hybrid models) unless enforce-eager
GB10_MAX_NUM_SEQS = 256  # vLLM 0.33.0 arg_utils: GB10 stays on the small tier (256 seqs, 2048 batched tokens)
GB10_MAX_BATCHED = 2048
CPU_KERNEL_BLOCK = 128  # vllm/platforms/cpu.py update_block_size_for_backend: the CPU block size is 128


@dataclass(frozen=True)
class Settings:
    """The profile's flags the plan reads, with vLLM's defaults."""

    tp: int
    pp: int
    utilization: float
    max_model_len: int
    max_num_seqs: int
    max_batched: int
    enforce_eager: bool
    multimodal: bool
    cache: CacheSettings
    mtp: bool
    cpu_kv_space: int = 4 * GiB  # VLLM_CPU_KVCACHE_SPACE (the CPU twin)


@dataclass
class NodePlan:
    """One node's budget and what fills it (bytes)."""

    node: int
    stage: int
    budget: int
    parts: dict[str, int]
    kv_bytes: int
    spec: KvSpec
    request_bytes: int
    concurrency: float
    longest: int
    weights: dict[str, int] = field(default_factory=dict)


@dataclass
class MemoryPlan:
    profile: str
    checkpoint: str
    node_memory: NodeMemory
    settings: Settings
    nodes: list[NodePlan]
    verdict: str  # fits | tight | does not fit
    reasons: list[str]
    fixes: list[str]
    warnings: list[str]
    fit_max_model_len: int
    fit_concurrency: int

    @property
    def fits(self) -> bool:
        return self.verdict != "does not fit"

    def to_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "profile": self.profile,
            "checkpoint": self.checkpoint,
            "verdict": self.verdict,
            "reasons": self.reasons,
            "fixes": self.fixes,
            "warnings": self.warnings,
            "node_memory": {
                "kind": self.node_memory.kind,
                "total_gib": _gib(self.node_memory.total),
                "held_at_boot_gib": _gib(self.node_memory.held_at_boot),
                "reserve_gib": _gib(self.node_memory.reserve),
            },
            "settings": {
                "tensor_parallel_size": s.tp,
                "pipeline_parallel_size": s.pp,
                "gpu_memory_utilization": s.utilization,
                "max_model_len": s.max_model_len,
                "max_num_seqs": s.max_num_seqs,
                "max_num_batched_tokens": s.max_batched,
                "kv_cache_dtype": s.cache.kv_dtype,
                "prefix_caching": s.cache.prefix_caching,
                "speculative_tokens": s.cache.num_spec,
                "enforce_eager": s.enforce_eager,
            },
            "largest_fit": {"max_model_len": self.fit_max_model_len, "concurrency": self.fit_concurrency},
            "nodes": [
                {
                    "node": n.node,
                    "stage": n.stage,
                    "budget_gib": _gib(n.budget),
                    **{f"{k}_gib": _gib(v) for k, v in n.parts.items()},
                    "kv_cache_gib": _gib(n.kv_bytes),
                    "weights_by_part_gib": {k: _gib(v) for k, v in n.weights.items()},
                    "kv_per_token_per_attention_layer_bytes": n.spec.attn_bytes_per_token,
                    "attention_layers": n.spec.attention_layers,
                    "state_per_sequence_per_layer_bytes": n.spec.state_bytes,
                    "state_layers": n.spec.state_layers,
                    "block_size": n.spec.block_size,
                    "page_bytes": n.spec.page_bytes,
                    "request_bytes_at_max_model_len": n.request_bytes,
                    "max_concurrency_at_max_model_len": round(n.concurrency, 2),
                    "longest_sequence_tokens": n.longest,
                }
                for n in self.nodes
            ],
        }


def _gib(value: int) -> float:
    return round(value / GiB, 2)


def _flag(args: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in args:
            return args[name]
    return None


def read_settings(args: dict[str, Any], env: dict[str, str], arch: Architecture) -> Settings:
    """The profile's args (normalised flag names) -> Settings, vLLM 0.33.0's defaults for what is not given."""

    def number(value: Any, flag: str, kind: type = int) -> Any:
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise RunError(
                f"profile flag --{flag} {value!r} is not a number; fix: a {kind.__name__}"
            ) from None

    spec_raw = _flag(args, "speculative-config")
    num_spec, mtp = 0, False
    if spec_raw:
        try:
            spec = parse_json(spec_raw, "--speculative-config") if isinstance(spec_raw, str) else None
        except InputError:
            spec = None
        if not isinstance(spec, dict):
            raise RunError(
                f"profile flag --speculative-config {spec_raw!r} is not a JSON object; fix: e.g. "
                '\'{"method": "mtp", "num_speculative_tokens": 2}\''
            )
        num_spec = number(spec.get("num_speculative_tokens", 1), "speculative-config num_speculative_tokens")
        mtp = "mtp" in str(spec.get("method", "")).lower()
    limit = str(_flag(args, "limit-mm-per-prompt") or "")
    multimodal = bool(arch.vision_params) and not ('"image": 0' in limit and '"video": 0' in limit)
    prefix = _flag(args, "enable-prefix-caching")
    space = env.get("VLLM_CPU_KVCACHE_SPACE")
    return Settings(
        tp=number(_flag(args, "tensor-parallel-size", "tp") or 1, "tensor-parallel-size"),
        pp=number(_flag(args, "pipeline-parallel-size", "pp") or 1, "pipeline-parallel-size"),
        utilization=number(_flag(args, "gpu-memory-utilization") or 0.92, "gpu-memory-utilization", float),
        max_model_len=number(_flag(args, "max-model-len") or arch.max_position, "max-model-len"),
        max_num_seqs=number(_flag(args, "max-num-seqs") or GB10_MAX_NUM_SEQS, "max-num-seqs"),
        max_batched=number(
            _flag(args, "max-num-batched-tokens") or GB10_MAX_BATCHED, "max-num-batched-tokens"
        ),
        enforce_eager=_flag(args, "enforce-eager") is True,
        multimodal=multimodal,
        cache=CacheSettings(
            kv_dtype=str(_flag(args, "kv-cache-dtype") or "auto"),
            prefix_caching=prefix is not False,
            num_spec=num_spec,
        ),
        mtp=mtp,
        cpu_kv_space=number(space, "VLLM_CPU_KVCACHE_SPACE") * GiB if space else 4 * GiB,
    )


def activation_peak(arch: Architecture, s: Settings) -> int:
    """The largest buffers of vLLM's profiling forward pass: one chunk of max-num-batched-tokens through a layer
    (hidden states, projections, fused-MoE intermediates, gated-delta-net chunk states), the sampler's float32
    logits for max-num-seqs, and the vision tower's profiling batch when images are allowed. An estimate: vLLM
    measures the real peak when it starts (the plan is compared with that in benchmarks/memory.md)."""
    t, tp, dt = s.max_batched, s.tp, DTYPE_BYTES.get(arch.dtype, 2)
    hidden = 6 * t * arch.hidden * dt
    q_out = (
        arch.heads * arch.head_dim * (2 if arch.attn_output_gate else 1) + 2 * arch.kv_heads * arch.head_dim
    )
    attention = 2 * t * q_out * dt // tp
    kd = arch.linear_key_heads * arch.linear_key_dim
    vd = arch.linear_value_heads * arch.linear_value_dim
    gdn = (
        3 * t * (2 * kd + 2 * vd) * dt // tp
        + cdiv(t, 64) * (arch.linear_value_heads // tp) * arch.linear_key_dim * arch.linear_value_dim * 4
    )
    if arch.experts:
        mlp = t * arch.experts_per_token * (3 * arch.moe_intermediate // tp + arch.hidden) * dt
    else:
        mlp = 3 * t * arch.intermediate * dt // tp
    logits = 2 * s.max_num_seqs * arch.vocab * 4
    vision = 4 * t * (6 * arch.vision_hidden + arch.vision_intermediate) * dt if s.multimodal else 0
    return int((hidden + max(attention, gdn) + mlp + logits + vision) * ACTIVATION_MARGIN)


def _plan_nodes(arch: Architecture, s: Settings, mem: NodeMemory) -> list[NodePlan]:
    stages = stage_weights(arch, Split(tp=s.tp, pp=s.pp, mtp=s.mtp))
    act = activation_peak(arch, s)
    plans = []
    for node in range(s.tp * s.pp):
        stage = stages[node // s.tp]
        last = stage.stage == s.pp - 1
        spec = kv_spec(arch, s.tp, stage.layers, s.cache, arch.mtp_layers if (s.mtp and last) else 0)
        parts = {
            "weights": stage.total,
            "activation_peak": act,
            "cuda_graphs": 0 if (s.enforce_eager or mem.kind == "cpu") else CUDA_GRAPHS,
            "workspace": (0 if mem.kind == "cpu" else WORKSPACE) + (NCCL_BUFFERS if s.tp * s.pp > 1 else 0),
        }
        budget = sum(parts.values()) + s.cpu_kv_space if mem.kind == "cpu" else int(s.utilization * mem.total)
        kv = budget - sum(parts.values())
        request = spec.request_bytes(s.max_model_len)
        plans.append(
            NodePlan(
                node=node,
                stage=stage.stage,
                budget=budget,
                parts=parts,
                kv_bytes=kv,
                spec=spec,
                request_bytes=request,
                concurrency=spec.max_concurrency(kv, s.max_model_len) if kv > 0 else 0.0,
                longest=min(spec.longest(kv), arch.max_position) if kv > 0 else 0,
                weights=dict(stage.parts),
            )
        )
    return plans


def _judge(
    arch: Architecture, s: Settings, mem: NodeMemory, nodes: list[NodePlan]
) -> tuple[str, list[str], list[str]]:
    reasons: list[str] = []
    warnings: list[str] = []
    worst = min(nodes, key=lambda n: n.kv_bytes - n.request_bytes)
    fixed = sum(worst.parts.values())
    host_left = mem.total - worst.budget
    if worst.kv_bytes <= 0:
        reasons.append(
            f"node {worst.node}: weights {worst.parts['weights'] / GiB:.1f} GiB + activation, graphs and "
            f"workspace {(fixed - worst.parts['weights']) / GiB:.1f} GiB exceed vLLM's budget "
            f"{worst.budget / GiB:.1f} GiB: no room for any KV cache"
        )
    elif worst.kv_bytes < worst.request_bytes:
        reasons.append(
            f"node {worst.node}: the KV cache ({worst.kv_bytes / GiB:.1f} GiB) holds {worst.longest} "
            f"tokens, max-model-len {s.max_model_len} needs {worst.request_bytes / GiB:.1f} GiB (vLLM "
            "refuses to start)"
        )
    if mem.kind != "cpu" and worst.budget > mem.total - mem.held_at_boot:
        reasons.append(
            f"gpu-memory-utilization {s.utilization} asks {worst.budget / GiB:.1f} GiB of "
            f"{mem.total / GiB:.2f} GiB, more than a {mem.kind.upper()} has free at start "
            f"(~{(mem.total - mem.held_at_boot) / GiB:.1f} GiB): vLLM's start check refuses it"
        )
    elif mem.kind != "cpu" and host_left < mem.reserve:
        warnings.append(
            f"gpu-memory-utilization {s.utilization} leaves the host {host_left / GiB:.1f} GiB of unified "
            f"memory, less than its {mem.reserve / GiB:.0f} GiB reserve (OS, Docker, the server's CPU "
            "side, page cache): the host may run out while serving"
        )
    if reasons:
        return "does not fit", reasons, warnings
    if warnings or min(n.concurrency for n in nodes) < 2:
        if min(n.concurrency for n in nodes) < 2:
            warnings.append(
                f"only {min(n.concurrency for n in nodes):.2f} requests of max-model-len "
                f"{s.max_model_len} fit the KV cache at once"
            )
        return "tight", reasons, warnings
    return "fits", reasons, warnings


def safe_utilization(mem: NodeMemory) -> float:
    """The largest gpu-memory-utilization (two decimals) that leaves the host its reserve."""
    return math.floor((mem.total - mem.reserve) / mem.total * 100) / 100


def plan_memory(
    profile: str, arch: Architecture, s: Settings, mem: NodeMemory = GB10, *, fixes: bool = True
) -> MemoryPlan:
    """The plan, its verdict, the largest max-model-len and concurrency that fit, and the fixes."""
    if mem.kind == "cpu":
        # vLLM's CPU platform: blocks of 128; its GDN prefill exports no checkpoints
        s = replace(s, cache=replace(s.cache, gdn_checkpoints=False, kernel_block=CPU_KERNEL_BLOCK))
    nodes = _plan_nodes(arch, s, mem)
    verdict, reasons, warnings = _judge(arch, s, mem, nodes)
    worst_kv = min(nodes, key=lambda n: n.kv_bytes)
    longest = min(n.longest for n in nodes)
    fit_len = min(longest // 1024 * 1024 if longest >= 1024 else longest, s.max_model_len)
    concurrency = min(s.max_num_seqs, int(min(n.concurrency for n in nodes)))
    plan = MemoryPlan(
        profile, arch.source, mem, s, nodes, verdict, reasons, [], warnings, fit_len, concurrency
    )
    if fixes and verdict != "fits":
        plan.fixes = _fixes(profile, arch, s, mem, plan, worst_kv)
    return plan


def _fixes(
    profile: str, arch: Architecture, s: Settings, mem: NodeMemory, plan: MemoryPlan, worst: NodePlan
) -> list[str]:
    out: list[str] = []
    safe = safe_utilization(mem)
    if mem.kind != "cpu" and s.utilization > safe:
        lowered = plan_memory(profile, arch, replace(s, utilization=safe), mem, fixes=False)
        out.append(
            f"lower gpu-memory-utilization to {safe} (leaves the host its {mem.reserve / GiB:.0f} GiB)"
            + (
                ""
                if lowered.fits
                else f"; then also max-model-len to {lowered.fit_max_model_len}"
                if lowered.fit_max_model_len
                else ""
            )
        )
        s = replace(s, utilization=min(s.utilization, safe))
        worst = min(lowered.nodes, key=lambda n: n.kv_bytes)
    if worst.kv_bytes <= 0 or worst.kv_bytes < worst.request_bytes:
        if worst.longest >= 1024:
            out.append(
                f"max-model-len to {min(worst.longest // 1024 * 1024, s.max_model_len)} (the longest sequence "
                "the KV cache holds)"
            )
        for tp in (2, 4, 8):
            if tp <= s.tp or arch.linear_value_heads % tp or arch.heads % tp:
                continue
            wider = plan_memory(profile, arch, replace(s, tp=tp), mem, fixes=False)
            if wider.fits:
                out.append(
                    f"add nodes: tensor-parallel-size {tp} over {tp * s.pp} Sparks (nodes: {tp * s.pp}); "
                    f"{wider.nodes[0].parts['weights'] / GiB:.1f} GiB of weights per node"
                )
                break
    if plan.verdict == "tight" and plan.fit_concurrency < 2 and plan.fit_max_model_len:
        half = max(1024, plan.fit_max_model_len // 2 // 1024 * 1024)
        out.append(f"max-model-len to {half} for two full-length requests at once, or max-num-seqs 1")
    return out

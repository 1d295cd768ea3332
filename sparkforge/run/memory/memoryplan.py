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
from sparkforge.run.memory.configtypes import check_speculative
from sparkforge.run.memory.kvcache import CacheSettings, KvSpec, kv_spec
from sparkforge.run.memory.weightbytes import Split, cdiv, stage_weights

GiB = 1 << 30


@dataclass(frozen=True)
class NodeMemory:
    """One node's memory as vLLM and the host see it."""

    kind: str  # "gb10" or "cpu" (the CPU twin: KV cache sized by VLLM_CPU_KVCACHE_SPACE)
    total: int  # bytes vLLM calls the device's total
    held_at_boot: int  # what the OS, driver and firmware already hold when nothing runs
    reserve: int  # what the host should keep outside vLLM's budget (less: 'tight', warned)
    floor: int = 0  # the least the host may keep: below it 'does not fit' (the field's safe band ends here)
    available: int | None = None  # the node's MemAvailable as the doctor reads it (None: not measured)
    size_gb: int = 128  # the Spark's memory as sold (64 or 128 GB)


# GB10: CUDA reports 121.69 GiB total; on a fresh, headless Spark with caches dropped, free memory at boot caps at
# 101.3-102.2 GiB (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47): ~19.5 GiB are held before anything starts.
# The reserve adds 4.5 GiB for what runs beside the GPU budget on the same memory: the API server's and engine's
# CPU-side processes (Python heaps, tokenizer), Docker, and page-cache churn while safetensors are read.
# The floor: single-Spark owners serve at gpu-memory-utilization 0.85-0.90 (the host then keeps 18.3-12.2 GiB);
# less than 12 GiB (0.91 and up, vLLM's default 0.92 included) is refused.
GB10 = NodeMemory(
    "gb10", total=int(121.69 * GiB), held_at_boot=int(19.5 * GiB), reserve=24 * GiB, floor=12 * GiB
)
# The 64 GB Spark: half the memory. NOT measured here: what the OS and driver hold at boot is assumed 12 GiB (less
# than the 128 GB one's 19.5, more than half of it), the reserve that + 4.5 GiB, the floor 8 GiB. A MemAvailable
# reading (invoke memory --mem-available, the doctor's figure) replaces the assumption at start.
GB10_64 = NodeMemory(
    "gb10", int(121.69 * GiB) // 2, held_at_boot=12 * GiB, reserve=int(16.5 * GiB), floor=8 * GiB, size_gb=64
)
SPARK_SIZES = {128: GB10, 64: GB10_64}
HOST_RUNTIME = int(
    4.5 * GiB
)  # beside the budget while serving: the server's CPU side, Docker, page-cache churn
LOAD_SHARD = (
    5 * 10**9
)  # Hugging Face's default max_shard_size: fastsafetensors stages one file per rank at a time
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
    kv_cache_bytes: int | None = (
        None  # --kv-cache-memory-bytes: the KV cache's size, utilization then ignored for it
    )
    fastsafetensors: bool = False  # --load-format fastsafetensors: weights staged through device buffers


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
    draft_request_bytes: int = 0  # of request_bytes: the MTP draft layer's KV at max-model-len
    load_peak: int = 0  # while loading: the weights + fastsafetensors' staging buffer (device memory)
    page_cache: int = 0  # while loading: the checkpoint files read (reclaimable, but on the same memory)


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
                "floor_gib": _gib(self.node_memory.floor),
                "available_gib": None
                if self.node_memory.available is None
                else _gib(self.node_memory.available),
                "spark_memory_gb": self.node_memory.size_gb,
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
                "kv_cache_memory_bytes": s.kv_cache_bytes,
                "load_format_fastsafetensors": s.fastsafetensors,
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
                    "mtp_draft_kv_per_request_gib": _gib(n.draft_request_bytes),
                    "load_peak_gib": _gib(n.load_peak),
                    "load_page_cache_gib": _gib(n.page_cache),
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


HUMAN_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30,
               "T": 1 << 40}  # fmt: skip  # vLLM's human_readable_int: lower case decimal, upper case binary


def parse_bytes(value: Any, flag: str) -> int:
    """A byte count as vLLM's --kv-cache-memory-bytes takes it: 8589934592, 8G (binary), 8.5g (decimal)."""
    text = str(value).strip()
    unit = HUMAN_UNITS.get(text[-1:], 1) if text else 1
    number = text[:-1] if unit != 1 else text
    try:
        amount = float(number) * unit if unit != 1 and not number.isdigit() else int(number) * unit
    except ValueError:
        amount = -1
    if not 0 < amount < 1 << 50:
        raise RunError(
            f"profile flag --{flag} {value!r} is not a byte count; fix: e.g. 8589934592 or 8G (GiB) or 8g (GB)"
        )
    return int(amount)


def read_settings(args: dict[str, Any], env: dict[str, str], arch: Architecture) -> Settings:
    """The profile's args (normalised flag names) -> Settings, vLLM 0.33.0's defaults for what is not given."""

    def number(value: Any, flag: str, kind: type = int) -> Any:
        try:
            parsed = kind(value)
        except (TypeError, ValueError, OverflowError):
            parsed = None
        if isinstance(value, bool) or parsed is None or not 0 < parsed <= 1 << 40 or parsed != parsed:
            raise RunError(
                f"profile flag --{flag} {value!r} is not a positive number of at most 2^40; fix: a {kind.__name__}"
            ) from None
        return parsed

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
        try:
            typed_spec = check_speculative(spec, "profile flag --speculative-config")
        except InputError as exc:
            raise RunError(str(exc)) from None
        num_spec, mtp = typed_spec.num_speculative_tokens, "mtp" in typed_spec.method.lower()
    limit = str(_flag(args, "limit-mm-per-prompt") or "")
    multimodal = bool(arch.vision_params) and not ('"image": 0' in limit and '"video": 0' in limit)
    prefix = _flag(args, "enable-prefix-caching")
    space = env.get("VLLM_CPU_KVCACHE_SPACE")
    kv_bytes = _flag(args, "kv-cache-memory-bytes")
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
        kv_cache_bytes=parse_bytes(kv_bytes, "kv-cache-memory-bytes") if kv_bytes not in (None, "") else None,
        fastsafetensors=str(_flag(args, "load-format") or "") == "fastsafetensors",
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
    # vLLM reserves lookahead slots for the speculative tokens on top of max-model-len
    tokens = s.max_model_len + s.cache.num_spec
    plans = []
    for node in range(s.tp * s.pp):
        stage = stages[node // s.tp]
        last = stage.stage == s.pp - 1
        drafts = arch.mtp_layers if (s.mtp and last) else 0
        spec = kv_spec(arch, s.tp, stage.layers, s.cache, drafts)
        parts = {
            "weights": stage.total,
            "activation_peak": act,
            "cuda_graphs": 0 if (s.enforce_eager or mem.kind == "cpu") else CUDA_GRAPHS,
            "workspace": (0 if mem.kind == "cpu" else WORKSPACE) + (NCCL_BUFFERS if s.tp * s.pp > 1 else 0),
        }
        if mem.kind == "cpu":
            budget = sum(parts.values()) + s.cpu_kv_space
        elif s.kv_cache_bytes is not None:  # vLLM sizes the cache to the flag, not to utilization x total
            budget = sum(parts.values()) + s.kv_cache_bytes
        else:
            budget = int(s.utilization * mem.total)
        kv = budget - sum(parts.values())
        request = spec.request_bytes(tokens)
        plans.append(
            NodePlan(
                node=node,
                stage=stage.stage,
                budget=budget,
                parts=parts,
                kv_bytes=kv,
                spec=spec,
                request_bytes=request,
                concurrency=spec.max_concurrency(kv, tokens) if kv > 0 else 0.0,
                longest=min(spec.longest(kv), arch.max_position) if kv > 0 else 0,
                weights=dict(stage.parts),
                draft_request_bytes=drafts * spec.page_bytes * cdiv(tokens, spec.block_size),
                load_peak=stage.total + (min(LOAD_SHARD, stage.total) if s.fastsafetensors else 0),
                # a rank reads its own slices of the files (safetensors mmap): about its weights pass the page cache
                page_cache=0 if mem.kind == "cpu" else stage.total,
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
    if s.max_model_len > arch.max_position:
        reasons.append(
            f"max-model-len {s.max_model_len} is above the model's max_position_embeddings {arch.max_position} "
            f"({arch.source}): vLLM refuses it, and past the trained positions the answers degrade"
        )
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
    if mem.kind != "cpu":
        _judge_host(s, mem, nodes, reasons, warnings)
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


def _judge_host(
    s: Settings, mem: NodeMemory, nodes: list[NodePlan], reasons: list[str], warnings: list[str]
) -> None:
    """The budget against the machine: the node's MemAvailable when measured, else the host's floor (refused) and
    reserve (warned: the band single-Spark owners serve in); the load phase; MTP drafts at long context."""
    taken = max(n.budget for n in nodes)  # what vLLM holds on the fullest node
    asked = max(taken, int(s.utilization * mem.total))  # vLLM's start check wants utilization x total free
    spark = f"a {mem.size_gb} GB Spark ({mem.total / GiB:.2f} GiB)"
    if mem.available is not None:
        if asked > mem.available:
            reasons.append(
                f"vLLM asks {asked / GiB:.1f} GiB at start (gpu-memory-utilization {s.utilization} of {spark}), "
                f"the node has {mem.available / GiB:.1f} GiB MemAvailable: its start check refuses, or the host "
                "starves"
            )
        elif mem.available - taken < HOST_RUNTIME:
            warnings.append(
                f"vLLM's {taken / GiB:.1f} GiB leave {(mem.available - taken) / GiB:.1f} GiB of the node's "
                f"{mem.available / GiB:.1f} GiB MemAvailable, less than the {HOST_RUNTIME / GiB:.1f} GiB the "
                "server's CPU side and the page cache take while serving"
            )
    else:
        left = mem.total - asked
        if left < mem.floor:
            reasons.append(
                f"gpu-memory-utilization {s.utilization} asks {asked / GiB:.1f} GiB of {spark}, leaving the host "
                f"{left / GiB:.1f} GiB: less than the {mem.floor / GiB:.0f} GiB floor (the field serves up to "
                f"{math.floor((mem.total - mem.floor) / mem.total * 100) / 100} on one Spark; past it the host "
                "freezes or vLLM's start check refuses)"
            )
        elif left < mem.reserve:
            warnings.append(
                f"gpu-memory-utilization {s.utilization} leaves the host {left / GiB:.1f} GiB of unified memory, "
                f"less than its {mem.reserve / GiB:g} GiB reserve (OS, Docker, the server's CPU side, page "
                "cache): single-Spark owners run this band, but whether it starts depends on MemAvailable at "
                "start (the doctor reads it; --mem-available judges against it) and the watchdog should stay on"
            )
    worst_load = max(nodes, key=lambda n: n.load_peak)
    if worst_load.load_peak + mem.held_at_boot > mem.total:
        reasons.append(
            f"node {worst_load.node}: loading needs {worst_load.load_peak / GiB:.1f} GiB of device memory (weights"
            + (" + fastsafetensors' staging buffer" if s.fastsafetensors else "")
            + f"), more than {spark} has beside what it holds at boot"
        )


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
    if s.max_model_len > arch.max_position:
        out.append(f"max-model-len to at most {arch.max_position} (the model's max_position_embeddings)")
        s = replace(s, max_model_len=arch.max_position)
        worst = min(plan_memory(profile, arch, s, mem, fixes=False).nodes, key=lambda n: n.kv_bytes)
    safe = safe_utilization(mem)
    if mem.kind != "cpu" and s.utilization > safe and s.kv_cache_bytes is None:
        kv_fix = _kv_bytes_fix(profile, arch, s, mem, safe)
        if kv_fix:
            out.append(kv_fix)
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


def _kv_bytes_fix(profile: str, arch: Architecture, s: Settings, mem: NodeMemory, safe: float) -> str:
    """Where utilization is the wrong knob: the KV cache the profile needs (two requests of max-model-len) named
    directly with --kv-cache-memory-bytes, so vLLM takes what the model needs and the host keeps the rest."""
    probe = plan_memory(profile, arch, replace(s, kv_cache_bytes=GiB), mem, fixes=False)
    need = max(n.request_bytes for n in probe.nodes) * 2
    kv = cdiv(need, GiB) * GiB
    sized = plan_memory(profile, arch, replace(s, kv_cache_bytes=kv, utilization=safe), mem, fixes=False)
    if not sized.fits or sized.verdict != "fits":
        return ""
    taken = max(n.budget for n in sized.nodes)
    return (
        f"kv-cache-memory-bytes {kv // GiB}G with gpu-memory-utilization {safe}: vLLM sizes the KV cache to "
        f"two requests of max-model-len {s.max_model_len} instead of utilization x total, takes "
        f"{taken / GiB:.1f} GiB and the host keeps {(mem.total - taken) / GiB:.1f} GiB"
    )

"""The memory plan as the lines `invoke memory`, `serve --dry` and the refusals print."""

from __future__ import annotations

from sparkforge.run.memory.memoryplan import GiB, MemoryPlan


def plan_lines(plan: MemoryPlan) -> list[str]:
    s, mem = plan.settings, plan.node_memory
    where = f"{len(plan.nodes)} {mem.kind.upper()} node(s)"
    lines = [
        f"memory plan: {plan.profile} on {where} ({mem.size_gb} GB Spark: {mem.total / GiB:.2f} GiB each; the host "
        f"keeps {mem.reserve / GiB:g} GiB, at least {mem.floor / GiB:g}"
        + (f"; MemAvailable {mem.available / GiB:.1f} GiB" if mem.available is not None else "") + ")"
        if mem.kind != "cpu" else
        f"memory plan: {plan.profile} on {where} (KV cache VLLM_CPU_KVCACHE_SPACE {s.cpu_kv_space / GiB:.0f} GiB)",
        f"  checkpoint {plan.checkpoint}",
    ]  # fmt: skip
    for n in plan.nodes:
        parts = " + ".join(f"{k.replace('_', ' ')} {v / GiB:.2f}" for k, v in n.parts.items())
        lines.append(
            f"  node {n.node} (stage {n.stage}): budget {n.budget / GiB:.2f} GiB"
            + (f" (gpu-memory-utilization {s.utilization})" if mem.kind != "cpu" else "")
            + f" = {parts} + KV cache {n.kv_bytes / GiB:.2f}"
        )
        k = n.spec
        lines.append(
            f"    KV: {k.attn_bytes_per_token} B per token x {k.attention_layers} attention layers; "
            f"{k.state_bytes / (1 << 20):.2f} MiB state per sequence x {k.state_layers} gated-delta-net layers; "
            f"block {k.block_size} tokens"
        )
        lines.append(
            f"    one request of {s.max_model_len} tokens: {n.request_bytes / GiB:.2f} GiB; maximum concurrency "
            f"{n.concurrency:.2f}x; longest sequence {n.longest} tokens"
            + (
                f" (the MTP draft layer's KV: {n.draft_request_bytes / GiB:.2f} GiB of it)"
                if n.draft_request_bytes
                else ""
            )
        )
        if mem.kind != "cpu":
            lines.append(
                f"    loading: {n.load_peak / GiB:.2f} GiB of device memory"
                + (" (weights + one fastsafetensors staging file)" if s.fastsafetensors else " (the weights)")
                + f" while ~{n.page_cache / GiB:.1f} GiB of safetensors pass the page cache (reclaimable, on the "
                "same memory: drop caches before a start when MemAvailable is short)"
            )
    lines.append(
        f"verdict: {plan.verdict} (largest that fit: max-model-len {plan.fit_max_model_len}, "
        f"{plan.fit_concurrency} full-length requests at once)"
    )
    lines += [f"  why: {r}" for r in plan.reasons]
    lines += [f"  warning: {w}" for w in plan.warnings]
    lines += [f"  fix: {f}" for f in plan.fixes]
    return lines

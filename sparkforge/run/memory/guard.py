"""The one call serve, cluster.up, conform, bench and `invoke memory` make: plan the profile's memory before any
engine or download is touched, print it, and refuse a profile that does not fit (unless --force)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.recipe.checkpoints import checkpoint_path, pinned_revision
from sparkforge.recipe.profile import PROFILES_DIR, Profile
from sparkforge.recipe.serveargs import norm_flag
from sparkforge.run.memory.checkpoint import load_architecture
from sparkforge.run.memory.memoryplan import (
    GB10,
    SPARK_SIZES,
    MemoryPlan,
    NodeMemory,
    plan_memory,
    read_settings,
)
from sparkforge.run.memory.text import plan_lines


def node_memory(device: str, *, spark_gb: int = 128, available: int | None = None) -> NodeMemory:
    """A Spark of `spark_gb` (64 or 128) for a GPU recipe, judged against `available` (the node's MemAvailable)
    when it was read; for the CPU twin, a GB10's memory (its KV cache is a fixed size)."""
    if device == "cpu":
        return NodeMemory("cpu", total=GB10.total, held_at_boot=0, reserve=0)
    if spark_gb not in SPARK_SIZES:
        raise RunError(f"a Spark has 64 or 128 GB, not {spark_gb}; fix: spark_memory_gb 64 or 128")
    return replace(SPARK_SIZES[spark_gb], available=available)


def plan_profile(
    profile: Profile, model_dir: Path | None, mem: NodeMemory = GB10, *, config: Path | None = None
) -> MemoryPlan:
    """The profile's plan from the config of the MODEL it serves (its id and pinned revision, or --model-dir),
    never from the profile's file name: RunError when there is none or it is not countable. `config`: that
    config.json, wherever it is (import's plan, before the profile has its own)."""
    path = config or checkpoint_path(
        profile.model.model, pinned_revision(profile.model.args), PROFILES_DIR, model_dir
    )
    arch = load_architecture(path)
    args = {norm_flag(k): v for k, v in profile.model.args.items()}
    return plan_memory(profile.name, arch, read_settings(args, dict(profile.model.env), arch), mem)


def plan_or_refuse(
    profile: Profile, model_dir: Path | None, device: str, force: bool
) -> tuple[MemoryPlan | None, list[str]]:
    """The profile's plan and the warnings it needs, before anything prints or starts: a GB10 profile without a
    countable checkpoint config is refused (nothing proves it fits); only --force starts it. The CPU twin (a
    test vehicle whose KV cache is a fixed VLLM_CPU_KVCACHE_SPACE) is let through, warned."""
    try:
        mem = node_memory(device, spark_gb=profile.model.spark_memory_gb)
        return plan_profile(profile, model_dir, mem), []
    except RunError as exc:
        if device == "cpu" or force:
            return None, [f"warning: no memory plan for {profile.name}: {exc}"]
        raise RunError(
            f"profile {profile.name}: no memory plan, so nothing shows it fits: {exc}; nothing was started or "
            "downloaded"
        ) from None


def judge_memory(
    session: Session, plan: MemoryPlan | None, profile: str, force: bool, refusal: str = ""
) -> MemoryPlan | None:
    """Print the plan; refuse a profile that does not fit (the plan printed, '--force' named) or that has no
    plan (`refusal`: plan_or_refuse's reason)."""
    if refusal:
        raise RunError(refusal)
    if plan is None:
        return None
    for line in plan_lines(plan):
        session.echo(line)
    for line in plan.warnings:
        session.warn(f"warning: {line}")
    if plan.fits:
        return plan
    if force:
        session.warn(f"warning: --force: starting {profile} although the memory plan says it does not fit")
        return plan
    raise RunError(
        f"profile {profile} does not fit: {'; '.join(plan.reasons)}; nothing was started or downloaded; "
        f"fix: {'; or '.join(plan.fixes) or 'see the plan above'} (or --force to try anyway)"
    )

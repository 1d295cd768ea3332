"""The one call serve, cluster.up, conform, bench and `invoke memory` make: plan the profile's memory before any
engine or download is touched, print it, and refuse a profile that does not fit (unless --force)."""

from __future__ import annotations

from pathlib import Path

from sparkforge.console import Echo
from sparkforge.errors import RunError
from sparkforge.recipe.profile import PROFILES_DIR, Profile
from sparkforge.recipe.serveargs import norm_flag
from sparkforge.run.memory.checkpoint import checkpoint_path, load_architecture
from sparkforge.run.memory.memoryplan import GB10, MemoryPlan, NodeMemory, plan_memory, read_settings
from sparkforge.run.memory.text import plan_lines


def node_memory(device: str, host_total: int | None = None) -> NodeMemory:
    """GB10 for a GPU recipe; for the CPU twin, the host's own memory (its KV cache is a fixed size)."""
    if device == "cpu":
        total = host_total or GB10.total
        return NodeMemory("cpu", total=total, held_at_boot=0, reserve=0)
    return GB10


def plan_profile(
    profile: Profile, model_dir: Path | None, mem: NodeMemory = GB10, *, config: Path | None = None
) -> MemoryPlan:
    """The profile's plan from its checkpoint config (RunError when there is none or it is not countable);
    `config`: that config.json, wherever it is (import's plan, before the profile has its own)."""
    arch = load_architecture(config or checkpoint_path(profile.name, PROFILES_DIR, model_dir))
    args = {norm_flag(k): v for k, v in profile.model.args.items()}
    return plan_memory(profile.name, arch, read_settings(args, dict(profile.model.env), arch), mem)


def memory_guard(
    profile: Profile,
    model_dir: Path | None,
    *,
    device: str = "gpu",
    force: bool = False,
    echo: Echo,
    warn: Echo,
) -> MemoryPlan | None:
    """Plan, print, refuse: a profile that does not fit raises (the plan printed, '--force' named); a profile
    without a countable checkpoint config is let through with a warning (there is nothing to judge)."""
    try:
        plan = plan_profile(profile, model_dir, node_memory(device))
    except RunError as exc:
        warn(f"warning: no memory plan for {profile.name}: {exc}")
        return None
    for line in plan_lines(plan):
        echo(line)
    for line in plan.warnings:
        warn(f"warning: {line}")
    if plan.fits:
        return plan
    if force:
        warn(f"warning: --force: starting {profile.name} although the memory plan says it does not fit")
        return plan
    raise RunError(
        f"profile {profile.name} does not fit: {'; '.join(plan.reasons)}; nothing was started or downloaded; "
        f"fix: {'; or '.join(plan.fixes) or 'see the plan above'} (or --force to try anyway)"
    )

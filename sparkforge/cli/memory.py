"""`invoke memory`: a serve profile's memory plan per node, before any engine or download (thin: the work is in
sparkforge.run.memory)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from invoke import Context
from invoke.exceptions import Exit

from sparkforge.cli import task, user_errors
from sparkforge.cli.families import JSON, Family, Outputs, opt
from sparkforge.context import Session


@dataclass(frozen=True)
class NodeSize:
    """The node `invoke memory` judges against (as given): the Spark's size, or its MemAvailable."""

    spark_memory: int = opt(
        0, "the Sparks' memory as sold, 64 or 128 GB (default: the profile's spark_memory_gb)"
    )
    mem_available: float = opt(
        0.0,
        "the node's MemAvailable in GiB (what 'invoke cluster.doctor' reads): judge the budget against it instead of the Spark's size",
    )


NODE_SIZE = Family.of(NodeSize, "node")


@task(
    families=(NODE_SIZE, JSON),
    help={
        "recipe": "recipe name in recipes/ or path to a recipe file (its device: GB10 or the CPU twin)",
        "profile": "serve profile name in profiles/ or path to a profile file",
        "model_dir": "a directory holding the model's config.json (default: the one shipped for the profile's "
        "model and revision, profiles/checkpoints/<org>/<name>/<revision>.json)",
        "json": "write the plan as JSON here",
    },
)
@user_errors
def memory(
    c: Context,
    session: Session,
    recipe: str,
    profile: str,
    node: NodeSize,
    outputs: Outputs,
    model_dir: str = "",
) -> None:
    """Memory plan per node: weights, KV cache per layer type, activation, graphs, the host's reserve; verdict."""
    import json as json_lib

    from sparkforge.boundary import check_number, write_output
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.memory.guard import node_memory, plan_profile
    from sparkforge.run.memory.text import plan_lines

    available = (
        int(float(check_number("--mem-available", node.mem_available, low=1, high=4096)) * (1 << 30))
        if node.mem_available
        else None
    )
    loaded = load_profile(profile)
    size = node.spark_memory or loaded.model.spark_memory_gb
    mem = node_memory(load_recipe(recipe).model.device, spark_gb=size, available=available)
    plan = plan_profile(loaded, Path(model_dir).resolve() if model_dir else None, mem)
    for line in plan_lines(plan):
        session.out(line)
    if outputs.json:
        write_output(outputs.json, json_lib.dumps(plan.to_dict(), indent=2) + "\n", "--json")
        session.out(f"plan: {outputs.json}")
    if not plan.fits:
        raise Exit(
            f"sparkforge: profile {loaded.name} does not fit; fix: {'; or '.join(plan.fixes) or 'see above'}",
            code=1,
        )

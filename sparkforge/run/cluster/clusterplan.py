"""The plan of a task over several nodes (`cluster.up`, `cluster.doctor`): one LaunchPlan (run/launchplan.py: the
recipe and profile loaded once, every launch flag checked once, the image and the memory plan decided) with the
cluster's own decisions on top: the fabric flags checked, --tp/--pp/--dp applied to the profile (the memory plan follows
the new split), the split judged against the model, the cabling and the known-bad list (LayoutPlan), and the
doctor's options (the fabric flags, the split, the recipe's NCCL pin, the memory plan its memory stage holds each
node to). Every refusal is raised here, before any engine is contacted; `--dry` prints the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sparkforge.errors import RunError
from sparkforge.run.cluster.clusterflags import ClusterFlags
from sparkforge.run.launchplan import (
    FlagError,
    LaunchFlags,
    LaunchPlan,
    doctor_options,
    plan_nodes,
    plan_task,
)

if TYPE_CHECKING:
    from sparkforge.run.cluster.parallel import LayoutPlan
    from sparkforge.run.facts import DoctorOptions
    from sparkforge.run.nodes import Node

GID_FIX = (
    "leave it out (NCCL picks the RoCE v2 IPv4 GID itself) or give one index 'invoke cluster.fabric' lists"
)


@dataclass(frozen=True)
class FabricSettings:
    """The fabric flags checked: each value as the doctor and the fabric report take it."""

    gid_index: int | None
    nccl: Literal["image", "host"]
    layout: str | None
    min_busbw: float | None


def fabric_settings(flags: ClusterFlags) -> FabricSettings:
    """Every fabric flag checked (a usage error naming the flag and the fix)."""
    from sparkforge.boundary import ascii_number

    gid = ascii_number(flags.gid_index, integer=True) if flags.gid_index else None
    if flags.gid_index and (gid is None or not 0 <= gid <= 255):  # ASCII digits only: '²'.isdigit() is True
        raise FlagError(
            f"--gid-index {flags.gid_index[:40]!r} is not a GID table index 0..255; fix: {GID_FIX}"
        )
    if flags.nccl not in ("image", "host"):
        raise FlagError(f"--nccl {flags.nccl!r} is not one of image, host; fix: use one of them")
    floor = ascii_number(flags.min_busbw, integer=False) if flags.min_busbw else None
    if flags.min_busbw and (floor is None or not 0 <= floor < 10_000):  # float() takes '1_8', '٣' and 'nan'
        raise FlagError(
            f"--min-busbw {flags.min_busbw!r} is not a bandwidth in GB/s; fix: e.g. 18, or 0 to disable"
        )
    from sparkforge.run.cluster.topology import layout as find_layout

    layout = find_layout(flags.layout).name if flags.layout else None
    return FabricSettings(
        None if gid is None else int(gid), "host" if flags.nccl == "host" else "image", layout, floor
    )


@dataclass(frozen=True)
class ClusterPlan:
    """What a task over several nodes decided before it contacts any: the nodes (head first), the doctor's
    options and, with a profile, the launch (profile with the split applied, memory plan) and its layout."""

    nodes: tuple[Node, ...]
    doctor: DoctorOptions
    launch: LaunchPlan | None = None
    layout: LayoutPlan | None = None
    warnings: tuple[
        str, ...
    ] = ()  # without a profile: the nodes' and the image's warnings (else the launch's)
    notes: tuple[str, ...] = ()  # without a profile: which image and why


def plan_cluster(
    recipe: str,
    profile: str,
    flags: LaunchFlags,
    cluster: ClusterFlags,
    env: Mapping[str, str],
    *,
    dry: bool = False,
) -> ClusterPlan:
    """`profile` (may be empty: the doctor alone) launched with `recipe`'s image over `flags.nodes`, split as
    --tp/--pp/--dp say (0: the profile's). Every input checked before any engine: RunError/FlagError naming it."""
    from sparkforge.run.cluster.parallel import Parallel, check_layout, relayout
    from sparkforge.run.inputs import check_positive

    if not flags.nodes:
        raise FlagError(
            "no --nodes given; fix: --nodes A,B (head first), e.g. ssh://me@spark1,ssh://me@spark2"
        )
    fabric_set = fabric_settings(cluster)
    split = (cluster.tp, cluster.pp, cluster.dp)
    for name, value in zip(("--tp", "--pp", "--dp"), split, strict=True):
        if value:
            check_positive(name, value)
    if not profile:
        return _doctor_only(recipe, flags, fabric_set, env, cluster.quick)
    launch = plan_task(recipe, profile, flags, env, dry=dry)
    served = (
        relayout(launch.profile, Parallel(split[0] or 1, split[1] or 1, split[2] or 1))
        if any(split)
        else launch.profile
    )
    pin = launch.recipe.model.runtime.nccl
    nccl = pin.model_dump(mode="json") if pin else None
    arch = _architecture(served, launch)
    layout = check_layout(
        served,
        arch,
        len(launch.nodes),
        fabric_set.layout,
        nccl=nccl,
        backend=flags.backend,
        device=launch.device,
    )
    if any(split):  # the memory plan follows the split
        launch = _replanned(launch, served)
    memory = launch.memory.to_dict() if launch.memory is not None and flags.gpus != "none" else None
    memory = every_replica(memory, layout.parallel.dp) if memory else None
    doctor = replace(
        _with_fabric(launch.doctor or doctor_options(launch.image, flags), fabric_set, cluster.quick),
        parallel=(layout.parallel.tp, layout.parallel.pp),
        cuda_graphs=layout.cuda_graphs,
        nccl_pin=nccl,
        memory_plan=memory,  # --gpus none: vLLM takes no gpu-memory-utilization share; the stage only reports
    )
    return ClusterPlan(launch.nodes, doctor, launch, layout)


def every_replica(memory: dict[str, Any], dp: int) -> dict[str, Any]:
    """The memory plan of one replica (its TP x PP nodes) repeated for each of the `dp` replicas, numbered by
    node rank as --nodes orders them (replica r holds nodes r x width onwards), so that the doctor holds every
    node to its budget. Conservative for MoE: vLLM shards the experts over TP x DP, the plan over TP alone."""
    nodes = memory.get("nodes") or []
    if dp == 1 or not nodes:
        return memory
    width = len(nodes)
    copies = [{**n, "node": r * width + n["node"]} for r in range(dp) for n in nodes]
    return {**memory, "nodes": copies}


def _doctor_only(
    recipe: str, flags: LaunchFlags, fabric: FabricSettings, env: Mapping[str, str], quick: bool
) -> ClusterPlan:
    """The doctor without a profile: the image as named, else the recipe's (dry: nothing built or pulled, the
    doctor's own image stage names what each node lacks)."""
    from sparkforge.run.launchplan import resolve_image

    nodes, warnings = plan_nodes(flags, env)
    if flags.image:
        from sparkforge.recipe.plan import check_reference

        check_reference("--image", flags.image)  # the boundary: before the recipe or the engine
    image, notes = flags.image, []
    if recipe:
        from sparkforge.recipe.loader import load_recipe

        image, why, said = resolve_image(load_recipe(recipe), flags, dry=True)
        warnings += said
        notes.append(f"sparkforge: image {image}: {why}")
    doctor = _with_fabric(doctor_options(image, flags), fabric, quick)
    return ClusterPlan(nodes, doctor, warnings=tuple(warnings), notes=tuple(notes))


def _with_fabric(options: DoctorOptions, fabric: FabricSettings, quick: bool) -> DoctorOptions:
    return replace(
        options,
        gid_index=fabric.gid_index,
        nccl_source=fabric.nccl,
        layout=fabric.layout,
        min_busbw=fabric.min_busbw,
        quick=quick,
    )


def _architecture(profile: Any, launch: LaunchPlan) -> Any:
    """The model's checkpoint config (heads, experts, layers), None where none is known (only the node count is
    then judged)."""
    from sparkforge.recipe.checkpoints import checkpoint_path, pinned_revision
    from sparkforge.recipe.profile import PROFILES_DIR
    from sparkforge.run.memory.checkpoint import load_architecture

    try:
        revision = pinned_revision(profile.model.args)
        where = Path(launch.flags.model_dir) if launch.flags.model_dir else None
        return load_architecture(checkpoint_path(profile.model.model, revision, PROFILES_DIR, where))
    except RunError:
        return None


def _replanned(launch: LaunchPlan, served: Any) -> LaunchPlan:
    """The launch with the split profile and its own memory plan (the split changes each node's share)."""
    from sparkforge.run.memory.guard import plan_or_refuse

    try:
        memory, _ = plan_or_refuse(served, launch.launch.model_dir, launch.device, launch.flags.force)
        refusal = ""
    except RunError as exc:
        memory, refusal = None, str(exc)
    return replace(launch, profile=served, memory=memory, memory_refusal=refusal)


def plan_lines(plan: ClusterPlan) -> list[str]:
    """The layout the launch will run (the split, each pipeline stage's layers and nodes)."""
    return plan.layout.lines() if plan.layout else []

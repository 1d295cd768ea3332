"""Parallel layouts that fit: TP x PP (x DP) over N Sparks checked against the model and the cabling before launch.

vLLM's rules, as its model code enforces them at load (too late: after every node started and loaded): the
tensor-parallel size divides the attention heads; the KV heads divide by it or it by them (vLLM replicates KV
heads when TP exceeds them); the gated-delta-net key and value heads divide by it; each expert's intermediate
size divides by it, and with FP8 block quantization the per-rank share is whole blocks ("not divisible by weight
quantization block_n"); with expert parallelism the experts divide by TP x DP. Pipeline stages split the layers
(vLLM's get_pp_indices: each stage at least one). One GB10 per Spark: TP x PP x DP is the node count. A TP group
that spans more than two nodes of a switchless ring is refused unless the image's NCCL is the ring-only build.
Data parallel: DP replicas of TP x PP nodes each, contiguous (vLLM 0.32: a node's DP rank is node_rank // (TP x PP),
ParallelConfig.node_rank_within_dp); a MoE model's experts are sharded over TP x DP ranks unless expert parallel
keeps them whole (FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp), so DP joins TP in the experts' split.
Pure: `relayout` gives the profile the layout (its memory plan then follows), `check_parallel` the refusals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkforge.errors import RunError
from sparkforge.recipe.profile import Profile
from sparkforge.recipe.serveargs import norm_flag
from sparkforge.run.cluster.pitfalls import ClusterFacts, judge
from sparkforge.run.cluster.topology import layout as find_layout
from sparkforge.run.memory.checkpoint import Architecture
from sparkforge.run.memory.weightbytes import pp_ranges

RING_SOURCE = (
    "stock NCCL builds tree/PAT connections to non-adjacent ranks, and RoCE queue-pair setup does not follow the "
    "IP route (MiaAI-Lab DeepSeek-v4.1-Flash-DGX-Sparks PR #3; alexellis/switchless-nccl)"
)


@dataclass(frozen=True)
class Parallel:
    """How the model is split: tensor, pipeline and data parallel sizes (one GPU per node)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    expert_parallel: bool = False
    # VLLM_PP_LAYER_PARTITION: the layers of each stage, when the profile sets it
    partition: tuple[int, ...] | None = None

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def describe(self) -> str:
        return f"TP={self.tp} x PP={self.pp}" + (f" x DP={self.dp}" if self.dp > 1 else "")


def parallel_of(profile: Profile) -> Parallel:
    """The profile's layout from its args (vLLM's defaults: 1)."""
    args = {norm_flag(k): v for k, v in profile.model.args.items()}

    def size(*names: str) -> int:
        value = next((args[n] for n in names if n in args), 1)
        return int(value)  # type: ignore[arg-type]

    return Parallel(
        tp=size("tensor-parallel-size", "tp"),
        pp=size("pipeline-parallel-size", "pp"),
        dp=size("data-parallel-size", "dp"),
        expert_parallel=args.get("enable-expert-parallel") is True,
        partition=layer_partition(profile),
    )


def layer_partition(profile: Profile) -> tuple[int, ...] | None:
    """The profile's VLLM_PP_LAYER_PARTITION (its grammar is checked at load: digits and commas), else None."""
    text = str(profile.model.env.get("VLLM_PP_LAYER_PARTITION") or "")
    return tuple(int(n) for n in text.split(",")) if text else None


@dataclass
class ParallelCheck:
    """The verdict on one layout: refusals (each with its reason and fix), warnings, and how the layers split."""

    parallel: Parallel
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stages: list[tuple[int, int]] = field(
        default_factory=list
    )  # per pipeline stage: first layer, end (exclusive)

    @property
    def fits(self) -> bool:
        return not self.problems


def stage_without_attention(arch: Architecture, stages: list[tuple[int, int]]) -> str | None:
    """A hybrid model (gated-delta-net `linear_attention` and `full_attention` layers) split so that a stage
    lacks one of the two kinds: vLLM (0.31 on) fails that launch after every rank has loaded its weights. A stage
    without full attention reports every KV-cache layout and the head stops at start-up ("AssertionError:
    Workers disagree on supported KV cache layouts", resolve_kv_cache_layout in vllm/v1/attention/backends/
    utils.py); a stage without gated-delta-net layers fails the first request ("AssertionError: no mamba layers
    in the model", get_mamba_groups in vllm/v1/worker/mamba_utils.py). Both seen for real with PP=3 on three
    CPU-twin nodes (benchmarks/cluster-three.md). Refused before anything starts."""
    kinds = arch.layer_types
    present = set(kinds)
    if len(present) < 2 or len(stages) < 2:
        return None

    def lacking(bounds: list[tuple[int, int]]) -> list[int]:
        return [i for i, (lo, hi) in enumerate(bounds) if set(kinds[lo:hi]) != present]

    bare = lacking(stages)
    if not bare or len(kinds) != sum(hi - lo for lo, hi in stages):
        return None
    good = [pp for pp in range(1, min(arch.layers, 16) + 1) if not lacking(pp_ranges(arch.layers, pp))]
    where = ", ".join(f"stage {i} (layers {stages[i][0]}-{stages[i][1] - 1})" for i in bare)
    return (
        f"pipeline-parallel-size {len(stages)}: {where} lack(s) full-attention or gated-delta-net layers of this "
        'hybrid model, and vLLM then fails after loading the weights ("Workers disagree on supported KV cache '
        'layouts" or "no mamba layers in the model"); fix: a pipeline-parallel-size whose every stage holds '
        f"both kinds ({', '.join(map(str, good))} for its layers "
        f"{''.join('F' if k == 'full_attention' else 'L' for k in kinds)}), or VLLM_PP_LAYER_PARTITION in the "
        "profile's env to move the boundaries"
    )


def _divides(what: str, count: int, tp: int, problems: list[str]) -> None:
    if count and count % tp:
        problems.append(f"it does not divide the {count} {what}")


def _tp_fix(arch: Architecture, par: Parallel, nodes: int) -> str:
    """The layouts over the same nodes the model does split: TP among the divisors, the rest as PP."""
    good = [
        f"TP={tp} x PP={nodes // tp}"
        for tp in range(1, nodes + 1)
        if nodes % tp == 0 and not _tp_problems(arch, Parallel(tp, nodes // tp))
    ]
    return f"over {nodes} nodes use {' or '.join(good)}" if good else "use fewer or more nodes"


def _tp_problems(arch: Architecture, par: Parallel) -> list[str]:
    tp, problems = par.tp, []
    if tp * par.dp == 1:
        return problems
    _divides("attention heads", arch.heads, tp, problems)
    if arch.kv_heads and arch.kv_heads % tp and tp % arch.kv_heads:
        problems.append(
            f"neither it nor the {arch.kv_heads} KV heads divides the other (vLLM splits or replicates KV heads)"
        )
    linear = arch.linear_layers > 0
    _divides("gated-delta-net key heads", arch.linear_key_heads if linear else 0, tp, problems)
    _divides("gated-delta-net value heads", arch.linear_value_heads if linear else 0, tp, problems)
    ranks = tp * par.dp  # without expert parallel vLLM shards each expert over TP x DP ranks
    if arch.experts and not par.expert_parallel:
        share, rest = divmod(arch.moe_intermediate, ranks)
        block = arch.quant.block[0] if arch.quant.method == "fp8" else 1
        over = f" over TP x DP = {ranks} ranks" if par.dp > 1 else ""
        if rest or share % block:
            problems.append(
                f"it splits each expert's intermediate size {arch.moe_intermediate}{over} into "
                f"{arch.moe_intermediate / ranks:g}, not whole FP8 blocks of {block} (vLLM: 'not divisible by weight "
                f"quantization block_n = {block}'; enable-expert-parallel keeps experts whole per rank)"
            )
    return problems


def check_parallel(
    arch: Architecture,
    par: Parallel,
    nodes: int,
    layout: str | None = None,
    *,
    ring_only_nccl: bool = False,
) -> ParallelCheck:
    """Every reason the layout cannot run on `nodes` Sparks cabled as `layout` (None: not read yet)."""
    found = ParallelCheck(par)
    problems = found.problems
    if par.world != nodes:
        problems.append(
            f"{par.describe()} = {par.world} GPUs, but {nodes} nodes were given (one GB10 each); fix: pass "
            f"{par.world} nodes, or a layout whose product is {nodes}"
        )
    tp_problems = _tp_problems(arch, par)
    if tp_problems:
        what = f"tensor-parallel-size {par.tp}" if par.dp == 1 else par.describe()
        fix = _tp_fix(arch, par, nodes) if par.dp == 1 else "enable-expert-parallel, or another TP x DP"
        problems.append(f"{what} does not split the model: {'; '.join(tp_problems)}; fix: {fix}")
    if arch.experts and par.expert_parallel and arch.experts % (par.tp * par.dp):
        problems.append(
            f"enable-expert-parallel: the {arch.experts} experts do not divide over TP x DP = {par.tp * par.dp} "
            "ranks; fix: a TP x DP that divides them"
        )
    if par.pp > arch.layers:
        problems.append(
            f"pipeline-parallel-size {par.pp} exceeds the {arch.layers} layers; fix: at most {arch.layers} stages"
        )
    elif par.partition and (len(par.partition) != par.pp or sum(par.partition) != arch.layers):
        problems.append(
            f"VLLM_PP_LAYER_PARTITION {','.join(map(str, par.partition))} gives {len(par.partition)} stages of "
            f"{sum(par.partition)} layers, but the layout has {par.pp} stages and the model {arch.layers} layers "
            "(vLLM refuses it at start-up); fix: one count per stage, summing to the layers"
        )
    else:
        found.stages = pp_ranges(arch.layers, par.pp, par.partition)
        bare = stage_without_attention(arch, found.stages)
        if bare:
            problems.append(bare)
    ring = ring_problem(par.tp, layout, ring_only_nccl)
    if ring:
        problems.append(ring)
    if layout == "ring" and par.pp > 1:
        found.warnings.append(
            "pipeline stages follow the ring order (each stage's neighbour is the next node on the ring); vLLM's "
            "message queue reaches non-adjacent nodes over TCP only through routes (ip_forward on the relaying "
            "nodes) or a switch"
        )
    if layout == "mesh3" and par.tp == 3:
        found.warnings.append(
            "TP=3 on a mesh: each node reaches each peer on another subnet; NCCL needs subnet-aware routing "
            "(NCCL_IB_SUBNET_AWARE_ROUTING=1, NCCL >= 2.30)"
        )
    return found


def ring_problem(tp: int, layout: str | None, ring_only_nccl: bool) -> str | None:
    """A TP group over more than two nodes of a switchless ring, with stock NCCL: refused, with the reason."""
    if layout != "ring" or tp <= 2 or ring_only_nccl:
        return None
    return (
        f"tensor-parallel-size {tp} spans {tp} nodes of a switchless ring: {RING_SOURCE}; fix: a switch, or TP=2 "
        "on neighbours with PP along the ring, or an image whose NCCL is the ring-only build (recipe "
        "nccl.variant: switchless)"
    )


# vLLM's data-parallel launch flags that the cluster plan derives from the nodes (run/multinode.py): a profile's
# own would contradict it (another load-balancing mode, another rank, another rendezvous port or backend).
DP_PLANNED = (
    "data-parallel-size-local",
    "data-parallel-start-rank",
    "data-parallel-rank",
    "data-parallel-rpc-port",
    "data-parallel-hybrid-lb",
    "data-parallel-external-lb",
    "data-parallel-multi-port-external-lb",
    "data-parallel-backend",
)


def dp_problems(par: Parallel, args: Mapping[str, Any], backend: str) -> list[str]:
    """Why a data-parallel layout cannot be launched as cluster.up plans it (vLLM's internal load balancing: one
    API on the head, every other node headless with its DP start rank), with the fix; [] for DP=1."""
    if par.dp == 1:
        return []
    problems = []
    if backend != "mp":
        problems.append(
            f"data-parallel-size {par.dp} with --backend {backend}: cluster.up's Ray launch is one `vllm serve "
            "--distributed-executor-backend ray` on the head, and vLLM's Ray data parallelism (--data-parallel-backend "
            "ray) places its own engines, which cluster.up does not plan (vLLM also refuses --nnodes with it); fix: "
            "--backend mp"
        )
    given = [f"--{k}" for k in DP_PLANNED if k in args]
    if given:
        problems.append(
            f"the profile sets {', '.join(given)}, which cluster.up derives from the nodes for vLLM's data-parallel "
            "rendezvous (internal load balancing behind the head's API); fix: remove them from the profile's args"
        )
    return problems


def relayout(profile: Profile, par: Parallel) -> Profile:
    """The profile with `par` for its tensor/pipeline/data-parallel sizes and `nodes` = TP x PP x DP (the args
    keep their order; the memory plan and the launch read the new sizes)."""
    args = {k: v for k, v in profile.model.args.items() if norm_flag(k) not in ("tp", "pp", "dp")}
    args["tensor-parallel-size"] = par.tp
    args["pipeline-parallel-size"] = par.pp
    args["data-parallel-size"] = par.dp
    for flag, size in (("pipeline-parallel-size", par.pp), ("data-parallel-size", par.dp)):
        if size == 1:
            args.pop(flag)
    try:
        model = profile.model.model_validate({**profile.model.model_dump(), "args": args, "nodes": par.world})
    except ValueError as exc:
        raise RunError(f"profile {profile.name} with {par.describe()}: {exc}") from None
    return Profile(profile.name, profile.path, model, profile.lines)


@dataclass(frozen=True)
class LayoutPlan:
    """What a multi-node launch will run, judged before any engine is contacted: the split, the per-stage
    layers, the warnings (known-bad warnings included); `check_layout` raises for a refusal."""

    parallel: Parallel
    nodes: int
    layout: str | None
    stages: tuple[tuple[int, int], ...]
    warnings: tuple[str, ...]
    cuda_graphs: bool = True  # false with enforce-eager

    def lines(self) -> list[str]:
        par = self.parallel
        over = f" cabled as {self.layout}" if self.layout else ""
        out = [f"layout: {par.describe()} over {self.nodes} nodes{over}"]
        width = par.tp * par.pp  # the nodes of one replica, contiguous (vLLM: DP rank = node rank // width)
        for replica in range(par.dp):
            indent = "  "
            if par.dp > 1:
                nodes = ", ".join(f"node{replica * width + r}" for r in range(width))
                role = "the API, its engine" if replica == 0 else "headless engine"
                out.append(f"  DP rank {replica} ({role}): {nodes}")
                indent = "    "
            for i, (first, end) in enumerate(self.stages if par.pp > 1 else ()):
                ranks = range(replica * width + i * par.tp, replica * width + (i + 1) * par.tp)
                nodes = ", ".join(f"node{r}" for r in ranks)
                out.append(f"{indent}stage {i}: layers {first}-{end - 1} on {nodes}")
        if par.dp > 1:
            out.append(
                f"  each DP rank holds the whole model over its {width} node(s): the memory plan is one replica's, "
                "every replica's nodes alike (a MoE's experts are sharded over TP x DP by vLLM, over TP in the "
                "plan: an upper bound)"
            )
        return out


def check_layout(
    profile: Profile,
    arch: Architecture | None,
    nodes: int,
    layout: str | None = None,
    *,
    nccl: Mapping[str, Any] | None = None,
    backend: str = "mp",
    device: str = "cuda",
) -> LayoutPlan:
    """The profile's split over `nodes` against the model (`arch`: None when no checkpoint config is known: only
    the node count is judged), the declared layout, and the known-bad list with the recipe's NCCL pin `nccl`;
    RunError naming every refusal (nothing has started)."""
    par = parallel_of(profile)
    args = {norm_flag(k): v for k, v in profile.model.args.items()}
    variant = str((nccl or {}).get("variant") or "stock")
    if arch is not None:
        found = check_parallel(arch, par, nodes, layout, ring_only_nccl=variant == "switchless")
    else:
        found = ParallelCheck(par)
        if par.world != nodes:
            found.problems.append(f"{par.describe()} = {par.world} GPUs, but {nodes} nodes were given")
        ring = ring_problem(par.tp, layout, variant == "switchless")
        found.problems += [ring] if ring else []
        if par.world > 1:
            found.warnings.append(
                f"no checkpoint config for {profile.name}: its heads, experts and layers were not checked against "
                f"{par.describe()}; fix: profiles/checkpoints/{profile.name}.json or --model-dir with config.json"
            )
    refused, warned = judge(
        ClusterFacts(
            nodes,
            par.tp,
            par.pp,
            (nccl or {}).get("version"),
            args.get("enforce-eager") is not True,
            backend,
            layout,
            dp=par.dp,
            moe=arch.experts > 0 if arch is not None else None,
            device=device,
        )
    )
    problems = found.problems + dp_problems(par, args, backend) + refused
    cabled = find_layout(layout) if layout else None
    if cabled and not cabled.fits(nodes):
        problems.insert(
            0,
            f"--layout {cabled.name} is cabled for {cabled.nodes[0]}-{cabled.nodes[1]} nodes, not {nodes}; fix: "
            "name the layout the nodes are cabled as (cluster.fabric reads it)",
        )
    if problems:
        raise RunError(
            f"profile {profile.name} as {par.describe()} over {nodes} nodes cannot run: "
            + "; ".join(problems)
            + "; nothing was started"
        )
    graphs = args.get("enforce-eager") is not True
    return LayoutPlan(par, nodes, layout, tuple(found.stages), tuple(found.warnings + warned), graphs)

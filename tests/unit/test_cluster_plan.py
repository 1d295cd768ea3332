"""One ClusterPlan per cluster task (sparkforge/run/cluster/clusterplan.py), asserted without an engine: the
launch's plan with --tp/--pp applied (its memory plan follows the split), the split judged, the fabric flags
checked once into the doctor's options. DOCKER_HOST points at TEST-NET: an engine contact would fail, not pass."""

from __future__ import annotations

import pytest

from sparkforge.errors import RunError
from sparkforge.recipe.loader import load_recipe
from sparkforge.run.cluster.clusterflags import ClusterFlags
from sparkforge.run.cluster.clusterplan import fabric_settings, plan_cluster
from sparkforge.run.launchplan import FlagError, LaunchFlags

RECIPE, PROFILE = "vllm-qwen35", "qwen35-122b-a10b-fp8-tp2"  # the profile: TP=2 over two nodes
THREE = "ssh://u@spark1=10.0.12.1,ssh://u@spark2=10.0.12.2,ssh://u@spark3=10.0.13.3"
IMAGE = "sparkforge-example/vllm:1"  # a local name: taken as named, no registry, no engine


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://192.0.2.1:9")


def _flags(nodes: str = THREE, **given: object) -> LaunchFlags:
    return LaunchFlags(image=IMAGE, nodes=nodes, allow_unpinned_model=True, **given)  # type: ignore[arg-type]


def test_the_split_is_applied_to_the_profile_and_the_memory_plan_follows_it() -> None:
    cluster = ClusterFlags(tp=1, pp=3, layout="mesh3", gid_index="3", nccl="host", quick=True)
    plan = plan_cluster(RECIPE, PROFILE, _flags(), cluster, {})
    assert plan.launch is not None and plan.layout is not None
    assert [n.address for n in plan.nodes] == ["10.0.12.1", "10.0.12.2", "10.0.13.3"]
    assert (plan.layout.parallel.tp, plan.layout.parallel.pp, plan.layout.layout) == (1, 3, "mesh3")
    assert (
        plan.launch.profile.model.args["pipeline-parallel-size"] == 3 and plan.launch.profile.model.nodes == 3
    )
    assert (
        plan.launch.memory is not None and len(plan.launch.memory.nodes) == 3
    )  # one budget per stage's node
    doctor = plan.doctor
    assert (doctor.parallel, doctor.layout, doctor.gid_index, doctor.nccl_source, doctor.quick) == (
        (1, 3), "mesh3", 3, "host", True
    )  # fmt: skip
    pin = load_recipe(RECIPE).model.runtime.nccl
    assert doctor.nccl_pin == (pin.model_dump(mode="json") if pin else None)
    assert doctor.memory_plan == plan.launch.memory.to_dict() and doctor.image == IMAGE
    unsplit = plan_cluster(
        RECIPE, PROFILE, _flags("ssh://u@a=10.0.0.1,ssh://u@b=10.0.0.2"), ClusterFlags(), {}
    )
    assert unsplit.launch is not None and unsplit.launch.memory is not None
    assert len(unsplit.launch.memory.nodes) == 2 and unsplit.doctor.parallel == (2, 1)


def test_without_gpus_the_doctor_holds_no_node_to_the_memory_plan() -> None:
    plan = plan_cluster(RECIPE, PROFILE, _flags(gpus="none"), ClusterFlags(pp=3, tp=1), {})
    assert plan.launch is not None and plan.launch.memory is not None and plan.doctor.memory_plan is None


def test_a_split_the_model_or_the_cabling_cannot_run_is_refused_in_the_plan() -> None:
    with pytest.raises(RunError, match="tensor-parallel-size 3 does not split the model"):
        plan_cluster(RECIPE, PROFILE, _flags(), ClusterFlags(tp=3), {})
    with pytest.raises(RunError, match="--layout ring is cabled for 4-8 nodes, not 3"):
        plan_cluster(RECIPE, PROFILE, _flags(), ClusterFlags(tp=1, pp=3, layout="ring"), {})
    with pytest.raises(FlagError, match="no --nodes given"):
        plan_cluster(RECIPE, PROFILE, _flags(""), ClusterFlags(), {})


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"gid_index": "²"}, "--gid-index '²' is not a GID table index 0..255"),
        ({"gid_index": "256"}, "--gid-index '256' is not a GID table index 0..255"),
        ({"nccl": "both"}, "--nccl 'both' is not one of image, host"),
        ({"min_busbw": "nan"}, "--min-busbw 'nan' is not a bandwidth in GB/s"),
        ({"layout": "torus"}, "--layout 'torus' is not a known layout"),
    ],
)
def test_each_fabric_flag_is_checked_once_with_the_fix(given: dict[str, str], needle: str) -> None:
    with pytest.raises((FlagError, RunError)) as refused:
        fabric_settings(ClusterFlags(**given))
    assert needle in str(refused.value) and "fix:" in str(refused.value)


def test_the_doctor_alone_takes_the_image_as_named_and_the_fabric_flags() -> None:
    cluster = ClusterFlags(min_busbw="18", layout="ring4")
    plan = plan_cluster("", "", _flags(gpus="none"), cluster, {})
    assert plan.launch is None and plan.layout is None and plan.notes == ()
    assert (plan.doctor.image, plan.doctor.min_busbw, plan.doctor.layout, plan.doctor.gpus) == (
        IMAGE, 18.0, "ring", False
    )  # fmt: skip

"""One LaunchPlan per launch task (sparkforge/run/launchplan.py), asserted without an engine: the recipe and the
profile loaded once, every flag checked once before anything is contacted, the containers' argv, ports and mounts
decided in the plan; `serve --dry` prints that plan. DOCKER_HOST points at TEST-NET: an engine contact would
fail, not pass."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from invoke import Context

from sparkforge.cli.run import serve
from sparkforge.errors import RunError, SparkforgeError
from sparkforge.recipe import loader, profile
from sparkforge.run.launch import TOKEN_MOUNT
from sparkforge.run.launchplan import FlagError, LaunchFlags, plan_lines, plan_task

RECIPE = "vllm-qwen35"
PROFILE = "qwen35-35b-a3b-fp8"
IMAGE = "sparkforge-example/vllm:1"  # a local name: taken as named, no registry, no engine


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://192.0.2.1:9")


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often a recipe and a profile are read from disk (the real loaders, counted)."""
    counts = {"recipe": 0, "profile": 0}
    chain, read = loader._load_chain, profile.load_profile

    def load_chain(path: Path, seen: tuple[Path, ...]):  # type: ignore[no-untyped-def]
        counts["recipe"] += not seen  # the top of an `extends` chain: one recipe load
        return chain(path, seen)

    def load_profile(ref):  # type: ignore[no-untyped-def]
        counts["profile"] += 1
        return read(ref)

    monkeypatch.setattr(loader, "_load_chain", load_chain)
    monkeypatch.setattr(profile, "load_profile", load_profile)
    return counts


def test_one_plan_decides_the_container_and_loads_each_file_once(
    tmp_path: Path, loads: dict[str, int]
) -> None:
    token = tmp_path / "token"
    token.write_text("hf_x\n")
    flags = LaunchFlags(IMAGE, port=18431, gpus="none", hf_token_file=str(token), cache_dir=str(tmp_path / "c"),
                        ulimit=("nofile=16384",), allow_unpinned_model=True, weights="skip")  # fmt: skip
    plan = plan_task(RECIPE, PROFILE, flags, {})
    assert loads == {"recipe": 1, "profile": 1}
    assert (plan.recipe.name, plan.profile.name, plan.image, plan.image_why) == (
        RECIPE, PROFILE, IMAGE, "--image as named"
    )  # fmt: skip
    assert plan.containers is not None and plan.memory is not None and plan.memory.fits
    head = plan.containers.head.container
    argv = plan.containers.head.docker_argv()
    assert head.image == IMAGE and argv[argv.index("--entrypoint") + 1] == "vllm"
    assert argv[argv.index("--host") : argv.index("--host") + 4] == ["--host", "0.0.0.0", "--port", "18431"]
    assert (
        f"{token.resolve()}:{TOKEN_MOUNT}:ro" in head.mounts
    )  # --weights skip: vLLM downloads with the token
    assert f"{tmp_path / 'c'}/vllm:/root/.cache/vllm" in head.mounts
    assert head.ulimits == ("nofile=16384",) and not head.gpus
    assert any("--allow-unpinned-model" in w for w in plan.warnings)
    lines = plan_lines(plan)
    assert lines[-1].startswith("# warning: the OpenAI API listens on all interfaces")
    assert "docker run " + " ".join(argv[1:3]) in "\n".join(lines)


def test_the_plan_keeps_the_defaults_of_flags_a_task_does_not_have() -> None:
    plan = plan_task(RECIPE, PROFILE, LaunchFlags(IMAGE, allow_unpinned_model=True), {})
    defaults = LaunchFlags()
    assert plan.launch.port == defaults.port and plan.launch.master_port == defaults.master_port
    assert plan.launch.cache_dir == defaults.cache_dir and plan.launch.gpus
    assert plan.doctor is None  # one node: no doctor
    assert [n.label for n in plan.nodes] == ["node0 (local)"]


@pytest.mark.parametrize(
    ("changed", "needle"),
    [
        ({"port": 0}, "--port 0 is not a port"),
        ({"gpus": "some"}, "--gpus 'some' is not one of all, none"),
        ({"weights": "half"}, "--weights 'half'"),
        ({"cache_dir": "/var/cache:/etc"}, "--cache-dir"),
        ({"ulimit": ("nofile",)}, "--ulimit 'nofile'"),
        ({"node": "ftp://host"}, "node 'ftp://host'"),
        ({"image": "UPPER/Case"}, "--image"),
    ],
)
def test_a_bad_flag_is_refused_by_the_plan_before_any_engine(changed: dict[str, object], needle: str) -> None:
    flags = LaunchFlags(
        **{**{f.name: getattr(LaunchFlags(IMAGE), f.name) for f in fields(LaunchFlags)}, **changed}
    )
    with pytest.raises(SparkforgeError, match="fix") as info:
        plan_task(RECIPE, PROFILE, flags, {})
    assert needle in str(info.value)


def test_a_hub_that_is_not_a_url_is_a_usage_error_naming_where_it_came_from() -> None:
    with pytest.raises(FlagError, match="HF_ENDPOINT \\(your environment\\)") as info:
        plan_task(RECIPE, PROFILE, LaunchFlags(IMAGE), {"HF_ENDPOINT": "ftp://hub"})
    assert info.value.exit_code == 2


def test_an_unpinned_model_is_planned_and_refused_at_the_start_not_before_the_memory_plan() -> None:
    plan = plan_task(RECIPE, PROFILE, LaunchFlags(IMAGE), {})
    assert "is not pinned to a commit" in plan.pin_refusal and plan.memory is not None


def test_several_nodes_plan_no_containers_before_the_doctor() -> None:
    plan = plan_task(RECIPE, "qwen35-122b-a10b-fp8-tp2", LaunchFlags(IMAGE, nodes="ssh://sf@spark-a,ssh://sf@spark-b",
                                                                   interface="enp1s0f1np1"), {})  # fmt: skip
    assert plan.containers is None and [n.rank for n in plan.nodes] == [0, 1]
    assert plan.doctor is not None and plan.doctor.interface == "enp1s0f1np1" and plan.doctor.image == IMAGE
    with pytest.raises(RunError, match="interface"):
        plan_task(
            RECIPE,
            PROFILE,
            LaunchFlags(IMAGE, nodes="ssh://sf@spark-a,ssh://sf@spark-b", interface="no/such"),
            {},
        )


def test_serve_dry_prints_the_plan_and_loads_the_recipe_once(
    loads: dict[str, int], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    serve(Context(), recipe=RECIPE, profile=PROFILE, image=IMAGE, dry=True, no_preflight=True, gpus="none",
          allow_unpinned_model=True, cache_dir=str(tmp_path), port=18432)  # fmt: skip
    out = capsys.readouterr().out
    assert loads == {"recipe": 1, "profile": 1}
    assert f"sparkforge: image {IMAGE}: --image as named" in out and "verdict: fits" in out
    (run,) = [line for line in out.splitlines() if line.startswith("docker run ")]
    assert f" {IMAGE} " in run and "--port 18432" in run and "--gpus" not in run
    assert "download: skipped (--gpus none: vLLM stops before loading)" in out

"""The download phase's plan (one container per node, or one for a shared cache) and the stage a start reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkforge.recipe.profile import load_profile
from sparkforge.run.launch import LaunchOptions
from sparkforge.run.nodes import run_argv
from sparkforge.run.postmortem import stage_of
from sparkforge.run.weights.weights import plan_downloads

PROFILE = "qwen35-122b-a10b-fp8-tp2"


def test_each_node_downloads_with_the_launch_cache_and_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    options = LaunchOptions(image="img:1", cache_dir="/c/", hf_token_file=token)
    downloads = plan_downloads(load_profile(PROFILE), [0, 1], options)
    assert [d.rank for d in downloads] == [0, 1]
    argv = run_argv(downloads[1].container)
    assert argv[argv.index("--name") + 1] == f"sparkforge-weights-{PROFILE}-1"
    assert "/c/huggingface:/root/.cache/huggingface" in argv and f"{token}:/run/secrets/hf_token:ro" in argv
    assert "HF_TOKEN_PATH=/run/secrets/hf_token" in argv and argv[-2:] == ["Qwen/Qwen3.5-122B-A10B-FP8", ""]
    assert not any(a.startswith(("NCCL_", "HF_ENDPOINT")) for a in argv)  # nothing of the profile's env
    assert "--gpus" not in argv and "--network" in argv


def test_shared_cache_downloads_once_and_a_model_dir_not_at_all(tmp_path: Path) -> None:
    profile = load_profile(PROFILE)
    assert [d.rank for d in plan_downloads(profile, [0, 1], LaunchOptions(image="i", weights="shared"))] == [
        0
    ]
    assert plan_downloads(profile, [0, 1], LaunchOptions(image="i", model_dir=tmp_path)) == []
    assert plan_downloads(profile, [0, 1], LaunchOptions(image="i", weights="skip")) == []
    assert (
        plan_downloads(profile, [0, 1], LaunchOptions(image="i", gpus=False)) == []
    )  # vLLM never loads them


def test_the_stage_a_start_reached() -> None:
    assert stage_of([]) == "starting, before weight loading"
    lines = [
        "INFO [gpu_model_runner.py] Starting to load model Qwen/Qwen3.5-122B-A10B-FP8...",
        "INFO Loading safetensors checkpoint shards: 40% Completed | 16/39",
    ]
    assert stage_of(lines) == "loading the weights"
    assert stage_of([*lines, "INFO Model loading took 58.2 GiB", "INFO GPU KV cache size: 1,234 tokens"]) == (
        "allocating the KV cache"
    )


def test_the_weight_server_never_listens_on_every_interface() -> None:
    from sparkforge.commands import Runner
    from sparkforge.context import Session
    from sparkforge.errors import RunError
    from sparkforge.run.nodes import NodeEngine, parse_nodes
    from sparkforge.run.weights.weightstream import Transfer, share_weights

    session = Session(echo=print, runner=Runner(stream=False))

    # Unroutable engines (TEST-NET): the refusal comes before either is contacted.
    head, peer = (NodeEngine(n) for n in parse_nodes("tcp://192.0.2.1:2376,tcp://192.0.2.2:2376"))
    for address in ("0.0.0.0", "::", ""):
        with pytest.raises(RunError, match="every interface"):
            share_weights(
                session, head, [peer], Transfer("img", address, "/c/hub/models--a--b", "/c/hub/models--a--b")
            )

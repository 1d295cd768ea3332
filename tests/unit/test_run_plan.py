"""Nodes as Docker takes them, and the launch plan: the exact docker argv and environment per node."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest

from sparkforge.errors import RunError
from sparkforge.recipe.profile import load_profile
from sparkforge.run.cluster.doctor import network_env
from sparkforge.run.launch import LaunchOptions, describe_plan, plan_launch
from sparkforge.run.nodes import LOCAL, NodeEngine, parse_nodes


def test_node_forms(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "a.sock"))  # unix:// nodes must name a real socket
    nodes = parse_nodes(
        f"unix://{tmp_path}/a.sock, ssh://me@spark2:2222=192.168.100.2,tcp://10.0.0.3:2376,spark3"
    )
    sock.close()
    assert [(n.kind, n.target, n.address, n.rank) for n in nodes] == [
        ("unix", f"unix://{tmp_path}/a.sock", None, 0),
        ("ssh", "ssh://me@spark2:2222", "192.168.100.2", 1),
        ("tcp", "tcp://10.0.0.3:2376", None, 2),
        ("context", "spark3", None, 3),
    ]
    assert nodes[1].engine_flags() == ("--host", "ssh://me@spark2:2222")
    assert nodes[3].engine_flags() == ("--context", "spark3")
    assert LOCAL.engine_flags() == ()  # serve's default: DOCKER_HOST or the current context
    assert NodeEngine(nodes[1], docker="/usr/bin/docker").command("ps").argv == (
        "/usr/bin/docker", "--host", "ssh://me@spark2:2222", "ps",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "--nodes is empty"),
        ("http://x", "Docker does not take http:// engines"),
        ("ssh://", "nothing after ssh://"),
        ("ssh://a=notanip", "is not an IP address"),
        ("a,a", "names a twice"),
        ("bad name", "holds whitespace"),
        ("bad!name", "neither an engine URL nor a context name"),
    ],
)
def test_bad_nodes(text: str, needle: str) -> None:
    with pytest.raises(RunError, match=needle):
        parse_nodes(text)


def test_network_env_from_the_interface() -> None:
    assert network_env("enp1s0f1np1", "192.168.100.1", ["rocep1s0f1", "roceP2p1s0f1"]) == {
        "VLLM_HOST_IP": "192.168.100.1",
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "TP_SOCKET_IFNAME": "enp1s0f1np1",
        "UCX_NET_DEVICES": "enp1s0f1np1",
        "OMPI_MCA_btl_tcp_if_include": "enp1s0f1np1",
        "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
    }


def test_two_node_mp_plan_is_exact(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("hf_secret_canary\n")
    profile = load_profile("qwen35-122b-a10b-fp8-tp2")
    env = [network_env("fabric0", "10.77.0.1"), network_env("fabric0", "10.77.0.2")]
    options = LaunchOptions(image="img:1", hf_token_file=token, cache_dir="/c")
    plan = plan_launch(profile, ["10.77.0.1", "10.77.0.2"], env, options)
    assert [n.rank for n in plan.start_order()] == [1, 0]  # workers first
    head, worker = plan.nodes
    common = [
        "--label", "dev.sparkforge.run=serve",
        "--label", "dev.sparkforge.run.profile=qwen35-122b-a10b-fp8-tp2",
    ]  # fmt: skip
    assert worker.docker_argv()[:6] == [
        "run",
        "--detach",
        "--pull",
        "never",  # the image was resolved and checked before: the engine never fetches a tag itself
        "--name",
        "sparkforge-serve-qwen35-122b-a10b-fp8-tp2-1",
    ]
    assert worker.docker_argv()[6:10] == common
    argv = worker.docker_argv()
    tail = argv[argv.index("img:1") :]
    assert tail == [
        "img:1", "serve", "Qwen/Qwen3.5-122B-A10B-FP8", *profile.serve_args(),
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.77.0.1", "--master-port", "29501", "--headless",
    ]  # fmt: skip
    head_argv = head.docker_argv()
    assert head_argv[-12:] == [
        "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.77.0.1", "--master-port", "29501",
        "--host", "0.0.0.0", "--port", "8000",
    ]  # fmt: skip
    for flags in (
        ["--network", "host"],
        ["--ipc", "host"],
        ["--gpus", "all"],
        ["--ulimit", "memlock=-1"],
        ["--cap-add", "IPC_LOCK"],
        ["--entrypoint", "vllm"],
    ):
        assert any(head_argv[i : i + 2] == flags for i in range(len(head_argv))), flags
    assert (
        worker.container.env["VLLM_HOST_IP"] == "10.77.0.2"
        and head.container.env["VLLM_HOST_IP"] == "10.77.0.1"
    )
    assert worker.container.env["NCCL_SOCKET_IFNAME"] == "fabric0"
    assert worker.container.env["NCCL_NET_GDR_LEVEL"] == "0"  # the profile's env
    # The download phase fetched the weights: the serving container (which runs what the profile names) gets no
    # token and stays off the hub; with --weights skip vLLM downloads, so only then the read-only mount and its path.
    assert (
        not any("hf_token" in m for m in head.container.mounts) and "HF_TOKEN_PATH" not in head.container.env
    )
    assert head.container.env["HF_HUB_OFFLINE"] == "1"
    skip = plan_launch(profile, ["10.77.0.1", "10.77.0.2"], [{}, {}], replace(options, weights="skip")).head
    assert f"{token}:/run/secrets/hf_token:ro" in skip.container.mounts
    assert skip.container.env["HF_TOKEN_PATH"] == "/run/secrets/hf_token"
    printed = "\n".join(describe_plan(plan, ["a", "b"]))
    assert "hf_secret_canary" not in printed and "hf_secret_canary" not in repr(plan)
    assert "/c/huggingface:/root/.cache/huggingface" in printed


def test_ray_plan_starts_ray_then_serves_on_the_head() -> None:
    profile = load_profile("qwen35-122b-a10b-fp8-tp2")
    plan = plan_launch(profile, ["10.0.0.1", "10.0.0.2"], [{}, {}], LaunchOptions(image="i", backend="ray"))
    head, worker = plan.nodes
    assert worker.docker_argv()[-4:] == [
        "start",
        "--block",
        "--node-ip-address=10.0.0.2",
        "--address=10.0.0.1:6379",
    ]
    assert (
        head.docker_argv()[-4:]
        == ["start", "--block", "--node-ip-address=10.0.0.1", "--head", "--port=6379"][-4:]
    )
    assert head.exec_argv[:3] == ("vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8")
    assert "--distributed-executor-backend" in head.exec_argv and "--nnodes" not in head.exec_argv
    assert worker.container.env["RAY_NODE_IP_ADDRESS"] == "10.0.0.2"


def test_plan_refuses_a_node_count_the_profile_does_not_run_on() -> None:
    with pytest.raises(RunError, match="runs on 2 node"):
        plan_launch(load_profile("qwen35-122b-a10b-fp8-tp2"), ["10.0.0.1"], [{}], LaunchOptions(image="i"))


def test_model_dir_is_mounted_read_only_and_named(tmp_path: Path) -> None:
    plan = plan_launch(
        load_profile("qwen35-35b-a3b-fp8"), ["127.0.0.1"], [{}], LaunchOptions(image="i", model_dir=tmp_path)
    )
    argv = plan.head.docker_argv()
    assert f"{tmp_path}:/models:ro" in argv
    assert argv[argv.index("i") + 1 : argv.index("i") + 3] == ["serve", "/models"]
    assert argv[-6:-4] == ["--served-model-name", "Qwen/Qwen3.5-35B-A3B-FP8"]

"""The memory plan from the shipped checkpoint configs, vLLM's cache arithmetic, and the refusal before any engine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sparkforge.errors import RunError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.profile import load_profile
from sparkforge.recipe.serveargs import norm_flag
from sparkforge.run.memory.checkpoint import Architecture, load_architecture
from sparkforge.run.memory.guard import plan_profile
from sparkforge.run.memory.kvcache import CacheSettings, kv_spec
from sparkforge.run.memory.memoryplan import GB10, GiB, plan_memory, read_settings, safe_utilization

CHECKPOINTS = REPO_ROOT / "profiles" / "checkpoints"
BIG = "qwen35-122b-a10b-fp8-tp2"
SHIPPED = {  # profile -> the config of the model it serves (keyed by model id and revision, not profile name)
    "qwen35-35b-a3b-fp8": CHECKPOINTS / "Qwen/Qwen3.5-35B-A3B-FP8/unpinned.json",
    BIG: CHECKPOINTS / "Qwen/Qwen3.5-122B-A10B-FP8/unpinned.json",
    "qwen35-35b-a3b-nvfp4": CHECKPOINTS / "nvidia/Qwen3.5-35B-A3B-NVFP4/unpinned.json",
}


def _settings(name: str, **changes: object):
    profile = load_profile(name)
    arch = load_architecture(SHIPPED[name])
    args = {norm_flag(k): v for k, v in profile.model.args.items()}
    return arch, replace(read_settings(args, dict(profile.model.env), arch), **changes)


def _total_parameters(arch: Architecture) -> int:
    """Parameters of the whole checkpoint (no TP, no quantization), counted from the architecture the plan reads."""
    h = arch.hidden
    count = arch.vocab * h * (1 if arch.tie_embeddings else 2) + h + arch.vision_params
    for kind in arch.layer_types:
        if kind == "full_attention":
            gate = 2 if arch.attn_output_gate else 1
            count += h * arch.heads * arch.head_dim * (gate + 1) + 2 * h * arch.kv_heads * arch.head_dim
        else:
            kd = arch.linear_key_heads * arch.linear_key_dim
            vd = arch.linear_value_heads * arch.linear_value_dim
            count += (
                h * (2 * kd + 2 * vd)
                + h * 2 * arch.linear_value_heads
                + vd * h
                + (2 * kd + vd) * arch.conv_kernel
            )
        if arch.experts:
            count += arch.experts * 3 * h * arch.moe_intermediate + arch.experts * h
            count += 3 * h * arch.shared_intermediate + h
        else:
            count += 3 * h * arch.intermediate
        count += 2 * h
    return count


def test_the_shipped_checkpoints_are_the_published_sizes() -> None:
    assert round(_total_parameters(load_architecture(SHIPPED["qwen35-35b-a3b-fp8"])) / 1e9) == 35
    assert round(_total_parameters(load_architecture(SHIPPED[BIG])) / 1e9) == 123


def test_35b_fp8_fits_one_spark() -> None:
    plan = plan_profile(load_profile("qwen35-35b-a3b-fp8"), None)
    assert plan.verdict == "fits", plan.reasons + plan.warnings
    (node,) = plan.nodes
    assert 30 * GiB < node.parts["weights"] < 40 * GiB  # ~32 B expert weights in FP8 + bf16 rest
    assert node.budget == int(0.80 * GB10.total)
    assert plan.fit_max_model_len == 131072 and plan.fit_concurrency >= 2


def test_kv_arithmetic_is_vllms() -> None:
    """vLLM 0.33.0: FullAttentionSpec page / token = 2 * kv_heads * head_size * dtype; the GDN state of
    MambaStateShapeCalculator.gated_delta_net_state_shape in (bf16 conv, float32 temporal); block aligned up."""
    arch = load_architecture(SHIPPED["qwen35-35b-a3b-fp8"])
    spec = kv_spec(arch, 1, (0, 40), CacheSettings(prefix_caching=False, gdn_checkpoints=False))
    assert spec.attn_bytes_per_token == 2 * 2 * 256 * 2
    conv = (128 * 16 * 2 + 128 * 32) * (4 - 1) * 2
    temporal = 32 * 128 * 128 * 4
    assert spec.state_bytes == conv + temporal
    assert spec.block_size == 16 * -(-(conv + temporal) // (16 * 2048)) == 1056
    assert (spec.attention_layers, spec.state_layers, spec.group_size) == (10, 30, 10)
    assert (spec.attention_groups, spec.state_groups, spec.state_blocks_per_request) == (1, 3, 1)
    # One request of 131072 tokens: cdiv(131072, 1056) attention blocks + one state block per GDN group.
    assert spec.blocks_per_request(131072) == 125 + 3
    # TP=2 halves the state and, with 2 KV heads, the per-token page; MTP adds a state row per draft token.
    two = kv_spec(arch, 2, (0, 40), CacheSettings(num_spec=2))
    assert two.attn_bytes_per_token == 1024
    assert two.state_bytes == (128 * 16 * 2 + 128 * 32) // 2 * (3 + 2) * 2 + 16 * 128 * 128 * 4
    assert two.block_size % 64 == 0 and two.state_blocks_per_request == 2 + 2 + 1


def test_122b_fp8_needs_two_sparks() -> None:
    plan = plan_profile(load_profile(BIG), None)
    assert plan.verdict == "fits" and len(plan.nodes) == 2
    assert all(50 * GiB < n.parts["weights"] < 65 * GiB for n in plan.nodes)
    arch, one = _settings(BIG, tp=1)
    alone = plan_memory(BIG, arch, one)
    assert alone.verdict == "does not fit"
    assert alone.nodes[0].parts["weights"] > alone.nodes[0].budget  # the weights alone exceed one Spark
    assert any("tensor-parallel-size 2 over 2 Sparks" in fix for fix in alone.fixes), alone.fixes


def test_utilization_against_the_hosts_reserve() -> None:
    arch, settings = _settings("qwen35-35b-a3b-fp8", utilization=0.83)
    tight = plan_memory("p", arch, settings)
    assert tight.verdict == "tight" and any("less than its 24 GiB reserve" in w for w in tight.warnings)
    assert any(f"gpu-memory-utilization to {safe_utilization(GB10)}" in f for f in tight.fixes)
    # vLLM's own default (0.92) asks more than a Spark has free at start: its start check refuses it.
    arch, default = _settings("qwen35-35b-a3b-fp8", utilization=0.92)
    refused = plan_memory("p", arch, default)
    assert refused.verdict == "does not fit" and "start check" in refused.reasons[0]


def arch_len() -> int:
    return load_architecture(SHIPPED["qwen35-35b-a3b-fp8"]).max_position


def test_too_long_a_context_names_the_longest_that_fits() -> None:
    arch, settings = _settings(
        "qwen35-35b-a3b-fp8", utilization=0.38, max_model_len=arch_len(), max_num_seqs=1
    )
    plan = plan_memory("p", arch, settings)
    assert plan.verdict == "does not fit" and "vLLM refuses to start" in plan.reasons[0], plan.reasons
    longest = plan.nodes[0].longest
    assert 0 < longest < 1 << 20 and plan.fit_max_model_len == longest // 1024 * 1024
    assert (
        f"max-model-len to {plan.fit_max_model_len} (the longest sequence the KV cache holds)" in plan.fixes
    )
    shorter = plan_memory("p", arch, replace(settings, max_model_len=plan.fit_max_model_len))
    assert shorter.fits  # the fix it names is one that fits


def _unfit_profile(tmp_path: Path) -> tuple[Path, Path]:
    """The 122B FP8 on ONE Spark (weights alone > the budget), its config.json in a model directory."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((SHIPPED[BIG]).read_text())
    profile = tmp_path / "qwen35-122b-one-spark.yaml"
    text = (REPO_ROOT / "profiles" / f"{BIG}.yaml").read_text()
    profile.write_text(
        text.replace("nodes: 2", "nodes: 1").replace("tensor-parallel-size: 2", "tensor-parallel-size: 1")
    )
    return profile, model


def _dead_socket(path: Path) -> str:
    """A unix socket file nothing listens on: an engine there would refuse every connection."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
    return f"unix://{path}"


@pytest.mark.parametrize("task", ["serve", "cluster.up"])
def test_a_profile_that_cannot_fit_is_refused_before_any_engine(tmp_path: Path, task: str) -> None:
    profile, model = _unfit_profile(tmp_path)
    dead = _dead_socket(tmp_path / "dead.sock")
    args = ["serve", "--node", dead] if task == "serve" else ["cluster.up", "--nodes", dead]
    marker = tmp_path / "docker-was-called"
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "docker").write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    (shim / "docker").chmod(0o755)
    env = {**os.environ, "DOCKER_HOST": dead, "PATH": f"{shim}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args, "--recipe", "vllm-qwen35", "--profile", str(profile),
         "--model-dir", str(model), "--image", "img:1"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "does not fit" in out and "verdict: does not fit" in proc.stdout
    assert "tensor-parallel-size 2 over 2 Sparks" in out and "--force" in out
    assert "Traceback" not in out
    assert not marker.exists(), "docker was called before the refusal"


def test_invoke_memory_writes_the_plan(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "memory", "--recipe", "vllm-qwen35", "--profile", BIG, "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "fits" and len(doc["nodes"]) == 2
    assert doc["nodes"][0]["kv_per_token_per_attention_layer_bytes"] == 1024  # 2 KV heads over TP 2


def test_the_twins_own_start_log_for_the_tiny_model(tmp_path: Path) -> None:
    """vLLM 0.32.0 (the CPU twin) serving tests/profiles/cpu-tiny-qwen35moe.yaml with the random tiny model (the
    fixture's config.json; the profile now serves the trained one: the same attention and gated-delta-net
    shapes, so the same KV figures) logged (benchmarks/memory.md,
    benchmarks/results/memory_twin_vllm_lines.txt): 'Setting attention block size to 384 tokens', 'Padding mamba page
    size by 43.28%', 'CPU KV cache size: 699,008 tokens, Maximum concurrency for 512 tokens per request: 1365.25x'."""
    from sparkforge.run.memory.guard import node_memory

    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(
        (REPO_ROOT / "tests/unit/fixtures/memory/tiny-qwen35moe-config.json").read_text()
    )
    profile = load_profile(str(REPO_ROOT / "tests/profiles/cpu-tiny-qwen35moe.yaml"))
    plan = plan_profile(profile, model, node_memory("cpu"))
    (node,) = plan.nodes
    assert node.spec.block_size == 384
    assert round(100 * (node.spec.page_bytes - node.spec.state_bytes) / node.spec.state_bytes, 2) == 43.28
    assert (
        node.kv_bytes // node.spec.bytes_per_block * 128 == 699_008
    )  # vLLM counts its CPU blocks of 128 tokens
    assert abs(node.concurrency - 1365.25) / 1365.25 < 0.10 and round(node.concurrency, 2) == 1365.25
    assert plan.verdict == "fits"


def test_mtp_drafts_add_their_layer_and_state_rows() -> None:
    arch, plain = _settings("qwen35-35b-a3b-fp8")
    args = {"speculative-config": '{"method": "mtp", "num_speculative_tokens": 2}', "max-model-len": 131072}
    drafted = read_settings(args, {}, arch)
    assert drafted.mtp and drafted.cache.num_spec == 2
    base, mtp = plan_memory("p", arch, plain).nodes[0], plan_memory("p", arch, drafted).nodes[0]
    assert "mtp_draft" in mtp.weights and 0.3 * GiB < mtp.weights["mtp_draft"] < 1.5 * GiB
    assert mtp.spec.attention_layers == base.spec.attention_layers + 1  # the draft layer's own KV cache
    assert (
        mtp.spec.state_bytes - base.spec.state_bytes == 2 * (128 * 16 * 2 + 128 * 32) * 2
    )  # 2 more conv rows
    with pytest.raises(RunError, match="not a JSON object"):
        read_settings({"speculative-config": "mtp"}, {}, arch)

"""The memory plan follows the model (not the profile's file name) and is judged against the machine: the Spark's
size (64 or 128 GB), the node's MemAvailable, the band single-Spark owners serve in, the model's positions."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sparkforge.errors import RunError
from sparkforge.recipe.checkpoints import checkpoint_path
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.profile import PROFILES_DIR, load_profile
from sparkforge.recipe.serveargs import norm_flag
from sparkforge.run.memory.checkpoint import load_architecture
from sparkforge.run.memory.guard import node_memory, plan_or_refuse, plan_profile
from sparkforge.run.memory.memoryplan import GB10, GB10_64, GiB, parse_bytes, plan_memory, read_settings

BIG = "qwen35-122b-a10b-fp8-tp2"
SMALL = "qwen35-35b-a3b-fp8"
REV = "0123456789abcdef0123456789abcdef01234567"


def _copy(tmp_path: Path, source: str, name: str, *edits: tuple[str, str]) -> Path:
    """The shipped profile `source` saved as `name`.yaml elsewhere, with text edits (a user's copy)."""
    text = (PROFILES_DIR / f"{source}.yaml").read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def _plan(profile: str | Path, **mem: object):
    loaded = load_profile(str(profile))
    return plan_profile(loaded, None, node_memory("gpu", spark_gb=loaded.model.spark_memory_gb, **mem))


def _verdicts(profile: str | Path) -> tuple[str, list[str]]:
    plan = _plan(profile)
    return plan.verdict, plan.reasons


def test_a_renamed_copy_gets_the_same_verdict_as_the_original(tmp_path: Path) -> None:
    for name in (SMALL, BIG):
        copy = _copy(tmp_path, name, f"my-{name}-renamed")
        original, renamed = _plan(name), _plan(copy)
        assert renamed.checkpoint == original.checkpoint  # the model's config, found without the file name
        assert (renamed.verdict, renamed.reasons, renamed.fixes) == (
            original.verdict,
            original.reasons,
            original.fixes,
        )


def test_a_copy_of_the_122b_set_to_one_spark_is_refused(tmp_path: Path) -> None:
    """The issue's case: before, a copy got 'no memory plan' and `serve --dry` exited 0."""
    copy = _copy(
        tmp_path,
        BIG,
        "mine",
        ("nodes: 2", "nodes: 1"),
        ("tensor-parallel-size: 2", "tensor-parallel-size: 1"),
    )
    plan = _plan(copy)
    assert plan.verdict == "does not fit" and "Qwen3.5-122B-A10B-FP8" in plan.checkpoint
    assert any("tensor-parallel-size 2 over 2 Sparks" in fix for fix in plan.fixes), plan.fixes


def test_a_copy_asking_098_with_262144_tokens_is_refused(tmp_path: Path) -> None:
    copy = _copy(
        tmp_path, SMALL, "greedy",
        ("gpu-memory-utilization: 0.80", "gpu-memory-utilization: 0.98"),
        ("max-model-len: 131072", "max-model-len: 262144"),
    )  # fmt: skip
    plan = _plan(copy)
    assert plan.verdict == "does not fit" and any("floor" in r for r in plan.reasons), plan.reasons
    assert any("gpu-memory-utilization to 0.8" in f for f in plan.fixes), plan.fixes


@pytest.mark.parametrize("utilization", [0.84, 0.85, 0.90])
def test_the_fields_band_is_a_warning_not_a_refusal_on_128gb(utilization: float) -> None:
    """0.84, 0.85 and 0.90 were refused on a two-Spark report; single-Spark owners serve at 0.85-0.90."""
    for name in (SMALL, BIG):
        plan = _plan(name)
        arch = load_architecture(Path(plan.checkpoint))
        banded = plan_memory(name, arch, replace(plan.settings, utilization=utilization), GB10)
        assert banded.verdict == "tight", banded.reasons
        assert any("single-Spark owners run this band" in w for w in banded.warnings)


@pytest.mark.parametrize("utilization", [0.91, 0.92, 0.98])
def test_past_the_band_is_refused_on_128gb(utilization: float) -> None:
    plan = _plan(SMALL)
    arch = load_architecture(Path(plan.checkpoint))
    refused = plan_memory(SMALL, arch, replace(plan.settings, utilization=utilization), GB10)
    assert refused.verdict == "does not fit" and "floor" in refused.reasons[0]


def test_a_64gb_spark(tmp_path: Path) -> None:
    """Half the memory: the 35B FP8 at 0.80 fits a 128 GB Spark but leaves a 64 GB one's host less than its reserve
    (tight); 0.88, inside the 128 GB band, is past the 64 GB floor (refused)."""
    small64 = _copy(tmp_path, SMALL, "small-on-64", ("nodes: 1", "nodes: 1\nspark_memory_gb: 64"))
    plan = _plan(small64)
    assert plan.node_memory == GB10_64 and plan.nodes[0].budget == int(0.80 * GB10_64.total)
    assert plan.verdict == "tight" and "less than its 16.5 GiB reserve" in plan.warnings[0], plan.warnings
    assert _plan(SMALL).verdict == "fits"
    arch = load_architecture(Path(plan.checkpoint))
    on128 = plan_memory(SMALL, arch, replace(plan.settings, utilization=0.88), GB10)
    on64 = plan_memory(SMALL, arch, replace(plan.settings, utilization=0.88), GB10_64)
    assert on128.verdict == "tight" and on64.verdict == "does not fit" and "64 GB Spark" in on64.reasons[0]
    # the 122B is refused on 64 GB Sparks even over two of them (~60 GiB of weights per node)
    big64 = _copy(tmp_path, BIG, "big-on-64", ("nodes: 2", "nodes: 2\nspark_memory_gb: 64"))
    assert _plan(big64).verdict == "does not fit"
    # the size from the command line: the same profile judged on both sizes
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "memory", "--recipe", "vllm-qwen35", "--profile", SMALL, "--spark-memory", "64",
         "--json", str(tmp_path / "p.json")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and "64 GB Spark" in proc.stdout and "verdict: tight" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    assert json.loads((tmp_path / "p.json").read_text())["node_memory"]["spark_memory_gb"] == 64


def test_memavailable_decides_when_it_was_read() -> None:
    """The doctor's figure: a node with less MemAvailable than vLLM asks is refused even inside the band; a node
    with enough is not warned about the reserve."""
    assert _plan(SMALL, available=90 * GiB).verdict == "does not fit"  # 0.80 x 121.69 = 97.4 GiB asked
    roomy = _plan(SMALL, available=110 * GiB)
    assert roomy.verdict == "fits", roomy.reasons + roomy.warnings
    close = _plan(SMALL, available=100 * GiB)
    assert close.verdict == "tight" and "MemAvailable" in close.warnings[0]


def test_max_model_len_above_the_models_positions_is_refused() -> None:
    plan = _plan(SMALL)
    arch = load_architecture(Path(plan.checkpoint))
    over = plan_memory(SMALL, arch, replace(plan.settings, max_model_len=arch.max_position + 1), GB10)
    assert over.verdict == "does not fit" and "max_position_embeddings" in over.reasons[0]
    assert f"max-model-len to at most {arch.max_position} (the model's max_position_embeddings)" in over.fixes


def test_kv_cache_memory_bytes_is_offered_and_then_sizes_the_cache() -> None:
    plan = _plan(SMALL)
    arch = load_architecture(Path(plan.checkpoint))
    high = plan_memory(SMALL, arch, replace(plan.settings, utilization=0.88), GB10)
    (offer,) = [f for f in high.fixes if f.startswith("kv-cache-memory-bytes")]
    size = offer.split()[1]
    args = {norm_flag(k): v for k, v in load_profile(SMALL).model.args.items()}
    taken = read_settings({**args, "kv-cache-memory-bytes": size, "gpu-memory-utilization": 0.8}, {}, arch)
    sized = plan_memory(SMALL, arch, taken, GB10)
    assert sized.verdict == "fits" and sized.nodes[0].kv_bytes == parse_bytes(size, "x")
    assert sized.nodes[0].concurrency >= 2 and sized.nodes[0].budget < plan.nodes[0].budget
    assert (parse_bytes("8G", "x"), parse_bytes("8g", "x"), parse_bytes("1024", "x")) == (
        8 << 30,
        8 * 10**9,
        1024,
    )
    with pytest.raises(RunError, match="not a byte count"):
        parse_bytes("lots", "kv-cache-memory-bytes")


def test_mtp_drafts_and_the_load_phase_are_in_the_plan(tmp_path: Path) -> None:
    copy = _copy(
        tmp_path, SMALL, "mtp-long",
        ("max-model-len: 131072", "max-model-len: 262144\n  load-format: fastsafetensors\n  speculative-config: "
         "'{\"method\": \"mtp\", \"num_speculative_tokens\": 3}'"),
    )  # fmt: skip
    plan, base = _plan(copy), _plan(SMALL)
    node = plan.nodes[0]
    # the draft layer's KV over 262144 + 3 lookahead tokens, 2048 B a token, in whole blocks
    blocks = -(-(262144 + 3) // node.spec.block_size)
    assert node.draft_request_bytes == blocks * node.spec.page_bytes > 0.5 * GiB
    assert node.load_peak == node.parts["weights"] + 5 * 10**9  # one fastsafetensors staging file
    assert (
        base.nodes[0].load_peak == base.nodes[0].parts["weights"] and base.nodes[0].draft_request_bytes == 0
    )
    doc = plan.to_dict()["nodes"][0]
    assert doc["mtp_draft_kv_per_request_gib"] >= 0.5 and doc["load_peak_gib"] > doc["weights_gib"]


def test_the_config_is_keyed_by_model_and_revision(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    pinned = profiles / "checkpoints" / "Qwen" / "Qwen3.5-35B-A3B-FP8" / f"{REV}.json"
    pinned.parent.mkdir(parents=True)
    pinned.write_text("{}")
    assert checkpoint_path("Qwen/Qwen3.5-35B-A3B-FP8", REV, profiles, None) == pinned
    with pytest.raises(RunError, match=f"shipped for revisions: {REV}") as err:
        checkpoint_path("Qwen/Qwen3.5-35B-A3B-FP8", "f" * 40, profiles, None)
    assert f"as {pinned.parent / ('f' * 40)}.json" in str(err.value)
    with pytest.raises(RunError, match="no pinned revision"):
        checkpoint_path("Qwen/Qwen3.5-35B-A3B-FP8", None, profiles, None)
    for model in ("../../etc/passwd", "/abs/model", "local-name"):
        with pytest.raises(RunError, match="not a Hugging Face id"):
            checkpoint_path(model, None, profiles, None)
    with pytest.raises(RunError, match=r"holds no config\.json"):
        checkpoint_path("Qwen/Qwen3.5-35B-A3B-FP8", None, profiles, tmp_path)


def test_a_gpu_profile_without_a_config_is_refused_not_waved_through(tmp_path: Path) -> None:
    unknown = _copy(
        tmp_path, SMALL, "other-model", ("model: Qwen/Qwen3.5-35B-A3B-FP8", "model: someone/Unknown-7B")
    )
    profile = load_profile(str(unknown))
    with pytest.raises(RunError, match="no memory plan") as err:
        plan_or_refuse(profile, None, "gpu", False)
    assert "profiles/checkpoints/someone/Unknown-7B/unpinned.json" in str(err.value) and "--model-dir" in str(
        err.value
    )
    # --force starts it, warned; the CPU twin (a test vehicle) is warned only
    for device, force in (("gpu", True), ("cpu", False)):
        plan, warnings = plan_or_refuse(profile, None, device, force)
        assert plan is None and len(warnings) == 1 and "no memory plan" in warnings[0]


def test_serve_dry_refuses_the_renamed_one_spark_copy(tmp_path: Path) -> None:
    """End to end through the task: `serve --dry` of a renamed copy of the 122B on one Spark exits non-zero."""
    copy = _copy(
        tmp_path,
        BIG,
        "renamed-122b",
        ("nodes: 2", "nodes: 1"),
        ("tensor-parallel-size: 2", "tensor-parallel-size: 1"),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "serve", "--dry", "--recipe", "vllm-qwen35", "--profile", str(copy),
         "--image", "img:1"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "verdict: does not fit" in proc.stdout, out
    assert "tensor-parallel-size 2 over 2 Sparks" in out and "Traceback" not in out

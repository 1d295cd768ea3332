"""NVIDIA's catalog format (schema 3 and 4): import, export, and round trips as for the other two formats; the
samples are our own (tests/unit/fixtures/nvidia/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparkforge.errors import RecipeError
from sparkforge.preflight.catalog import ImportOptions, PinnedVllm, import_with, read_source
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.recipe.community.formats import FORMATS, detect_format, read_community
from sparkforge.recipe.community.fromprofile import Pins, check_export, export_document, export_text
from sparkforge.recipe.community.nvidia import RecipeV3, RecipeV4
from sparkforge.recipe.community.toprofile import write_profile
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.recipe.profile import list_profile_names, load_profile
from sparkforge.recipe.yamlfile import read_yaml

SAMPLES = Path(__file__).parent / "fixtures" / "nvidia"
CI_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"
NVIDIA = [f for f in FORMATS if f.startswith("nvidia")]
PINS = Pins("localhost:5000/sparkforge/ci-wheels@sha256:" + "a" * 64, "b" * 40, "ci-wheels-amd64", "c" * 64)


@pytest.fixture(scope="module")
def pinned() -> PinnedVllm:
    return PinnedVllm(load_recipe(str(CI_RECIPE)), make_fetcher())


V3 = SAMPLES / "v3-qwen35-35b-spark.recipe.yaml"
V4 = SAMPLES / "v4-qwen35-122b-2spark.recipe.yaml"
SAMPLE_NAMES = sorted(p.name for p in SAMPLES.glob("*.recipe.yaml"))


def test_samples_are_detected_by_schema_version_and_read() -> None:
    v3, v4 = read_yaml(V3), read_yaml(V4)
    assert detect_format(v3.data, "v3") == "nvidia-v3" and detect_format(v4.data, "v4") == "nvidia-v4"
    three = read_community(v3, "v3.yaml")
    assert three.command.startswith("vllm serve Qwen/Qwen3.5-35B-A3B-FP8 --max-model-len 32768")
    assert three.env == {"VLLM_USE_FLASHINFER_SAMPLER": "1"} and three.min_nodes == 1
    four = read_community(v4, "v4.yaml")
    assert four.min_nodes == 2 and four.cluster_only and "--tensor-parallel-size 2" in four.command
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "HEAD_IP"):
        assert flag not in four.command
    notes = dict(four.notes)
    assert (
        "--nnodes 2, --node-rank 0, --master-addr $HEAD_IP, --master-port $MASTER_PORT"
        in notes["serve.command"]
    )
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1" in notes["runtime.setup_command"]
    assert "temperature" in notes["sampling"] and "worker" in notes["serve.additional_commands"]
    assert "differ" not in notes["serve.additional_commands"]  # the sample's worker runs the head's flags


def test_a_worker_command_that_differs_from_the_heads_is_named(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(
        V4.read_text().replace(
            "          --gpu-memory-utilization 0.85", "          --gpu-memory-utilization 0.7"
        )
    )
    notes = dict(read_community(read_yaml(path), str(path)).notes)
    assert "differ from the head's" in notes["serve.additional_commands"]


def test_an_unknown_key_is_refused_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(V4.read_text() + "launcher: docker\n")
    with pytest.raises(
        RecipeError, match=r"bad.yaml:\d+: unknown top-level key 'launcher' for the nvidia-v4"
    ):
        read_community(read_yaml(bad), str(bad))
    v3_keys = tmp_path / "v3keys.yaml"  # schema 4's keys are not schema 3's
    v3_keys.write_text(V3.read_text() + "spec_dec: mtp\n")
    with pytest.raises(RecipeError, match=r"unknown top-level key 'spec_dec' for the nvidia-v3"):
        read_community(read_yaml(v3_keys), str(v3_keys))


def test_llama_cpp_is_refused_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "llama.yaml"
    path.write_text(V3.read_text().replace("backend: vllm", "backend: llama-cpp"))
    with pytest.raises(RecipeError, match=r"backend 'llama-cpp'.*vLLM only.*GGUF"):
        read_community(read_yaml(path), str(path))


def test_import_names_what_is_not_carried(pinned) -> None:
    imported = import_with(pinned, read_source(str(V4), pinned.fetcher))
    text = " ".join(a.message for a in imported.attention)
    assert "--nnodes 2" in text and "NCCL_SOCKET_IFNAME" in text
    assert imported.document["nodes"] == 2 and imported.document["env"] == {"VLLM_MARLIN_USE_ATOMIC_ADD": "1"}


@pytest.mark.parametrize("sample", SAMPLE_NAMES)
def test_import_gives_a_profile(pinned, sample: str, tmp_path: Path) -> None:
    imported = import_with(pinned, read_source(str(SAMPLES / sample), pinned.fetcher))
    assert "revision" not in imported.document["args"]  # the catalog pins no model revision
    profile = load_profile(write_profile(imported, tmp_path / f"{imported.name}.yaml"))
    assert profile.model.nodes in (1, 2)


@pytest.mark.parametrize("fmt", NVIDIA)
@pytest.mark.parametrize("sample", SAMPLE_NAMES)
def test_import_export_import_is_stable(pinned, tmp_path: Path, sample: str, fmt: str) -> None:
    first = import_with(pinned, read_source(str(SAMPLES / sample), pinned.fetcher))
    profile = load_profile(write_profile(first, tmp_path / "a" / f"{first.name}.yaml"))
    out = tmp_path / f"exported.{fmt}.yaml"
    out.write_text(export_text(export_document(profile, fmt, Pins("img:1")), []))  # type: ignore[arg-type]
    assert detect_format(yaml.safe_load(out.read_text()), str(out)) == fmt
    again = import_with(pinned, read_source(str(out), pinned.fetcher), ImportOptions(name=first.name))
    assert again.document == first.document
    assert load_profile(write_profile(again, tmp_path / "b" / f"{first.name}.yaml")).model == profile.model


@pytest.mark.parametrize("fmt", NVIDIA)
@pytest.mark.parametrize("ref", list_profile_names())
def test_exports_of_shipped_profiles_validate(ref: str, fmt: str) -> None:
    profile = load_profile(ref)
    text = export_text(export_document(profile, fmt, PINS), ["test"])  # type: ignore[arg-type]
    check_export(text, fmt, profile, PINS)  # type: ignore[arg-type]  # strict schema, then the same profile back
    data = yaml.safe_load(text)
    recipe = (RecipeV3 if fmt == "nvidia-v3" else RecipeV4).model_validate(data)
    assert recipe.runtime.image == PINS.image and recipe.topology.node_count == profile.model.nodes
    assert recipe.hardware == {1: "dgx-spark", 2: "dgx-spark-2gpu", 4: "dgx-spark-4gpu"}.get(
        profile.model.nodes, recipe.hardware
    )
    assert f"--revision {'b' * 40}" in recipe.serve.command and "c" * 12 in (recipe.notes or "")
    assert all(
        line.rstrip().endswith("\\") for line in recipe.serve.command.splitlines()[:-1] if "vllm" in line
    )
    if profile.model.nodes > 1:
        workers = recipe.serve.additional_commands or []
        assert recipe.serve.target == "head" and len(workers) == profile.model.nodes - 1
        assert "--headless" in workers[0].command and "--node-rank 1" in workers[0].command

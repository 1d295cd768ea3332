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


def test_samples_are_detected_by_schema_version_and_read() -> None:
    v3, v4 = (
        read_yaml(SAMPLES / n) for n in ("nvidia-v3-qwen35-35b-fp8.yaml", "nvidia-v4-qwen35-122b-tp2.yaml")
    )
    assert detect_format(v3.data, "v3") == "nvidia-v3" and detect_format(v4.data, "v4") == "nvidia-v4"
    three = read_community(v3, "v3.yaml")
    assert three.command.startswith("vllm serve Qwen/Qwen3.5-35B-A3B-FP8 --max-model-len 32768")
    assert three.model_revision == "0123456789abcdef0123456789abcdef01234567" and three.min_nodes == 1
    four = read_community(v4, "v4.yaml")
    assert "--tensor-parallel-size 2" in four.command and "--no-enable-chunked-prefill" in four.command
    assert "--enable-prefix-caching --no-enable" in four.command and four.min_nodes == 2 and four.cluster_only


def test_an_unknown_key_is_refused_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((SAMPLES / "nvidia-v4-qwen35-122b-tp2.yaml").read_text() + "launcher: docker\n")
    with pytest.raises(
        RecipeError, match=r"bad.yaml:\d+: unknown top-level key 'launcher' for the nvidia-v4"
    ):
        read_community(read_yaml(bad), str(bad))


@pytest.mark.parametrize(
    "sample", sorted(p.name for p in SAMPLES.glob("*.yaml") if "performance" not in p.name)
)
def test_import_gives_a_pinned_profile(pinned, sample: str, tmp_path: Path) -> None:
    imported = import_with(pinned, read_source(str(SAMPLES / sample), pinned.fetcher))
    args = imported.document["args"]
    assert args["revision"] == args["tokenizer-revision"] == args["code-revision"]  # the one pin, everywhere
    profile = load_profile(write_profile(imported, tmp_path / f"{imported.name}.yaml"))
    assert profile.model.nodes in (1, 2)


@pytest.mark.parametrize("fmt", NVIDIA)
@pytest.mark.parametrize(
    "sample", sorted(p.name for p in SAMPLES.glob("*.yaml") if "performance" not in p.name)
)
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
    if fmt == "nvidia-v3":
        recipe3 = RecipeV3.model_validate(data)
        assert recipe3.model.revision == "b" * 40 and recipe3.engine.container == PINS.image
        assert recipe3.hardware.nodes == profile.model.nodes and "c" * 12 in recipe3.name
    else:
        recipe4 = RecipeV4.model_validate(data)
        assert recipe4.model.revision == "b" * 40 and recipe4.runtime.image == PINS.image
        assert recipe4.deployment.nodes == profile.model.nodes and recipe4.engine_args["revision"] == "b" * 40

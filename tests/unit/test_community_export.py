"""Exports of every shipped profile validate as their format (strict schema, the formats' own rules); import ->
export -> import gives the same profile; `recipes --catalog` reports per recipe, model classes from the HF cache
against the pinned vLLM's registry, in seconds."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from sparkforge.errors import PublishError
from sparkforge.preflight.catalog import (
    ImportOptions,
    PinnedVllm,
    format_row,
    import_with,
    read_source,
    run_catalog,
)
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.recipe.community.formats import EugrRecipe, SparkArenaRecipe
from sparkforge.recipe.community.fromprofile import Pins, check_export, export_document, export_text
from sparkforge.recipe.community.toprofile import write_profile
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.recipe.profile import list_profile_names, load_profile
from sparkforge.registry.realize import model_revision_of, pin_image

FIXTURES = Path(__file__).parent / "fixtures" / "community"
CI_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"
SHIPPED = [
    *list_profile_names(),
    *(str(p) for p in sorted((REPO_ROOT / "tests" / "profiles").glob("*.yaml"))),
]
PINS = Pins("localhost:5000/sparkforge/ci-wheels@sha256:" + "a" * 64, "b" * 40, "ci-wheels-amd64", "c" * 64)


@pytest.fixture(scope="module")
def pinned() -> PinnedVllm:
    return PinnedVllm(load_recipe(str(CI_RECIPE)), make_fetcher())


@pytest.mark.parametrize("fmt", ["sparkarena", "eugr"])
@pytest.mark.parametrize("ref", SHIPPED)
def test_exports_of_shipped_profiles_validate(ref: str, fmt: str) -> None:
    profile = load_profile(ref)
    text = export_text(export_document(profile, fmt, PINS), ["test"])  # type: ignore[arg-type]
    check_export(text, fmt, profile, PINS)  # type: ignore[arg-type]  # strict schema, then the same profile back
    data = yaml.safe_load(text)
    if fmt == "sparkarena":  # what Spark Arena takes: version 2, a vLLM runtime, the pins
        recipe = SparkArenaRecipe.model_validate({**data, "recipe_version": str(data["recipe_version"])})
        assert data["recipe_version"] == 2 and recipe.runtime == "vllm" and recipe.model_revision == "b" * 40
        assert recipe.min_nodes == profile.model.nodes and recipe.container == PINS.image
        assert recipe.metadata["sparkforge_recipe_hash"] == "c" * 64
        # sparkrun reads these from its config chain: a literal in the command would hide them from it.
        for key in ("tensor_parallel", "max_model_len", "gpu_memory_utilization", "port"):
            assert f"{{{key}}}" in recipe.command or key not in recipe.defaults
    else:  # the runner's required keys; a cluster recipe says so
        recipe = EugrRecipe.model_validate(data)
        assert recipe.recipe_version == "1" and recipe.cluster_only == (profile.model.nodes > 1)
        assert "c" * 12 in recipe.name and "--revision " + "b" * 40 in recipe.command


@pytest.mark.parametrize("fmt", ["sparkarena", "eugr"])
@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.yaml")))
def test_import_export_import_is_stable(pinned, tmp_path: Path, name: str, fmt: str) -> None:
    doc, where = read_source(str(FIXTURES / name), pinned.fetcher)
    first = import_with(pinned, (doc, where))
    profile = load_profile(write_profile(first, tmp_path / "a" / f"{first.name}.yaml"))
    out = tmp_path / f"exported.{fmt}.yaml"
    out.write_text(export_text(export_document(profile, fmt, Pins("img:1")), []))  # type: ignore[arg-type]
    again = import_with(pinned, read_source(str(out), pinned.fetcher), ImportOptions(name=first.name))
    assert again.document == first.document
    assert load_profile(write_profile(again, tmp_path / "b" / f"{first.name}.yaml")).model == profile.model


def test_realize_refuses_what_it_cannot_pin(monkeypatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "https://127.0.0.1:9")  # a hub that does not answer (nothing listens)
    with pytest.raises(PublishError, match=r"not a commit .*a branch or tag moves"):
        model_revision_of("Qwen/Qwen3.5-35B-A3B-FP8", "main", None)
    with pytest.raises(PublishError, match="this run is offline; fix: pass --model-revision"):
        model_revision_of("Qwen/Qwen3.5-35B-A3B-FP8", "", None)
    with pytest.raises(PublishError, match=r"hub did not answer .* fix: pass --model-revision COMMIT"):
        model_revision_of("Qwen/Qwen3.5-35B-A3B-FP8", "", make_fetcher(timeout=5, retries=0))
    assert pin_image("r/x@sha256:" + "d" * 64) == "r/x@sha256:" + "d" * 64
    with pytest.raises(PublishError, match="is not a sha256 digest"):
        pin_image("r/x@sha256:abc")


def _hf_cache(root: Path, model: str, arch: str) -> None:
    snapshot = root / "hub" / f"models--{model.replace('/', '--')}" / "snapshots" / ("e" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"architectures": [arch]}))


def test_catalog_reports_each_recipe_and_its_model_class(pinned, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    _hf_cache(tmp_path / "hf", "Qwen/Qwen3.5-35B-A3B-FP8", "Qwen3_5MoeForConditionalGeneration")
    _hf_cache(
        tmp_path / "hf", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4", "NemotronHypotheticalForCausalLM"
    )
    bad = tmp_path / "shell.yaml"
    bad.write_text('recipe_version: "1"\nname: x\ncontainer: c\ncommand: bash run.sh\n')
    refs = [(r, r) for r in [*sorted(str(p) for p in FIXTURES.glob("*.yaml")), str(bad)]]
    start = time.monotonic()
    rows, _ = run_catalog(refs, pinned, pinned.fetcher, None)
    assert time.monotonic() - start < 30  # seconds for the catalog (the pinned vLLM is read once, cached)
    by = {Path(r.file).name: r for r in rows}
    solo = by["eugr-qwen35-35b-solo.yaml"]
    assert (solo.status, solo.model_class, solo.registered) == (
        "imports cleanly", "Qwen3_5MoeForConditionalGeneration", True,
    )  # fmt: skip
    mods = by["eugr-nemotron-mods.yaml"]
    assert mods.status == "needs attention" and mods.registered is False
    assert any("does not register NemotronHypotheticalForCausalLM" in n for n in mods.notes)
    assert by["eugr-qwen35-122b-tp2.yaml"].model_class is None
    assert "not in the HF cache" in by["eugr-qwen35-122b-tp2.yaml"].model_class_from
    assert by["shell.yaml"].status == "does not import" and "not `vllm serve`" in by["shell.yaml"].notes[0]
    assert (
        format_row(solo)
        .splitlines()[0]
        .endswith(
            "imports cleanly | Qwen/Qwen3.5-35B-A3B-FP8 | model class Qwen3_5MoeForConditionalGeneration (registered)"
        )
    )
    assert json.loads(json.dumps([r.to_dict() for r in rows]))[0]["status"] in (
        "imports cleanly",
        "needs attention",
    )

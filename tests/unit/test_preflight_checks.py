"""Checks 1 and 2 on real vLLM releases: registered architectures and declared requirements."""

from __future__ import annotations

import pytest
from preflight_fixtures import (  # noqa: F401 (pytest fixtures)
    COMMITS,
    SESSION,
    check_named,
    fixture_sdist_0160,
    fixture_sdist_0310,
    vllm_pin,
    vllm_sdist,
    write_recipe,
)

from sparkforge.errors import PreflightError
from sparkforge.preflight.checks import CHECKS, PreflightOptions, run_preflight
from sparkforge.preflight.registry import check_models, registered_architectures
from sparkforge.preflight.requirements import (
    check_requirements,
    marker_environment,
    read_requirement_file,
    source_requirements,
)
from sparkforge.preflight.sources import REGISTRY_PY
from sparkforge.recipe.loader import load_recipe
from sparkforge.report import Check

QWEN35 = ["Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration"]


def _models_check(tree) -> Check:
    check = Check("models", "passed")
    text = (tree / REGISTRY_PY).read_text()
    check_models(
        check, text, REGISTRY_PY, QWEN35, subject="vLLM", module_exists=lambda rel: (tree / rel).exists()
    )
    return check


def test_shipped_source_recipe_passes_on_0_31_0(sdist_0310):
    report = run_preflight(SESSION, load_recipe("vllm-qwen35"), PreflightOptions(source="pypi"))
    statuses = {c.name: c.status for c in report.checks}
    # 'images' depends on whether Docker Hub answers from this machine; it is tested against a real local
    # registry (tests/engine/test_publish_preflight.py) and an unreachable one (test_preflight_lock.py) instead.
    statuses.pop("images")
    assert statuses == {
        "source": "passed",
        "models": "passed",
        "requirements": "passed",
        "patches": "passed",
        "arch-plan": "passed",
    }
    models = check_named(report, "models")
    found = models.details["found"]["Qwen3_5MoeForConditionalGeneration"]
    assert found["module"] == "vllm.model_executor.models.qwen3_5" and found["module_file"] is True


def test_0_16_0_fails_naming_the_missing_architecture(sdist_0160, tmp_path):
    recipe = write_recipe(tmp_path, vllm_pin("0.16.0", COMMITS["0.16.0"], patches=[]))
    report = run_preflight(SESSION, recipe, PreflightOptions(source="pypi"))
    models = check_named(report, "models")
    assert models.status == "failed"
    assert "does not register Qwen3_5MoeForConditionalGeneration" in models.reason
    assert "fix: pin vLLM >= 0.17.0" in models.reason
    assert models.details["missing"] == QWEN35
    assert models.details["registered"] > 200  # the registry was read, the names just are not in it
    assert report.status == "failed"


def test_checks_runs_only_the_rows_named_and_reports_the_others_skipped(sdist_0160, tmp_path):
    recipe = write_recipe(tmp_path, vllm_pin("0.16.0", COMMITS["0.16.0"], patches=[]))
    report = run_preflight(SESSION, recipe, PreflightOptions(source="pypi", checks=CHECKS.parse("models")))
    statuses = {c.name: c.status for c in report.checks}
    assert list(statuses) == list(CHECKS.names())  # every row reported, in the registry's order
    assert statuses["source"] == "passed" and statuses["models"] == "failed"
    assert all(statuses[n] == "skipped" for n in ("requirements", "patches", "arch-plan", "images"))
    assert "not selected (--checks models)" in check_named(report, "images").reason
    with pytest.raises(PreflightError, match=r"--checks: unknown preflight row 'arch'.*arch-plan, images"):
        CHECKS.parse("models,arch")


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.17.0", "0.19.1", "0.31.0", "0.33.0"])
def test_releases_with_qwen35_register_it(version):
    check = _models_check(vllm_sdist(version).tree())
    assert check.status == "passed", check.reason
    assert set(check.details["found"]) == set(QWEN35)


def test_registry_reader_follows_merges_and_ignores_other_dicts():
    text = (
        "_A_MODELS = {'X': ('x', 'X'), 'Y': ('y', 'YImpl')}\n"
        "_B_MODELS: dict = {'Z': ('z', 'Z')}\n"
        "_PREVIOUSLY_SUPPORTED_MODELS = {'Old': '0.10.0'}\n"
        "_VLLM_MODELS = {**_A_MODELS, **_B_MODELS}\n"
    )
    found = registered_architectures(text)
    assert sorted(found) == ["X", "Y", "Z"] and found["Y"].class_name == "YImpl"


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"torch": {"version": "2.11.0"}}, "torch 2.11.0 is outside ==2.13.0"),
        ({"transformers": {"version": "4.57.0"}}, "transformers 4.57.0 is outside <5.18.0,>=5.10.4"),
        ({"transformers": {"version": "5.18.0"}}, "transformers 5.18.0 is outside <5.18.0,>=5.10.4"),
        ({"flashinfer": {"package": "flashinfer-python", "version": "0.6.6"}}, "flashinfer-python 0.6.6"),
    ],
)
def test_pins_outside_vllm_0_31_0_ranges_fail(sdist_0310, tmp_path, override, needle):
    recipe = write_recipe(tmp_path, {"components": override})
    check = check_named(run_preflight(SESSION, recipe, PreflightOptions(source="pypi")), "requirements")
    assert check.status == "failed"
    assert needle in check.reason
    assert "fix: set components." in check.reason


def test_torch_fix_names_the_exact_pin_and_its_origin(sdist_0310, tmp_path):
    recipe = write_recipe(tmp_path, {"components": {"torch": {"version": "2.11.0"}}})
    check = check_named(run_preflight(SESSION, recipe, PreflightOptions(source="pypi")), "requirements")
    assert "set components.torch.version to 2.13.0" in check.reason
    origins = {d["from"] for d in check.details["components"]["torch"]["declared"]}
    assert {"requirements/cuda.txt:7", "pyproject.toml [build-system] requires"} <= origins


def test_transformers_too_old_for_the_model_types():
    model = load_recipe("vllm-qwen35").model
    old = model.model_copy(
        update={"components": model.components.model_copy(update={"transformers": _component("5.1.0")})}
    )
    check = Check("requirements", "passed")
    check_requirements(check, [], old, subject="vLLM")
    assert check.status == "failed"
    assert "does not know model type qwen3_5_moe (needs >= 5.2.0)" in check.reason


def _component(version: str):
    model = load_recipe("vllm-qwen35").model
    return model.components.transformers.model_copy(update={"version": version})


def test_wheel_metadata_requirements(tmp_path):
    recipe = write_recipe(
        tmp_path, {"components": {"torch": {"version": "2.13.0"}}}, extends="vllm-qwen35-wheels"
    )
    report = run_preflight(SESSION, recipe)
    check = check_named(report, "requirements")
    assert check.status == "failed"
    assert "torch 2.13.0 is outside ==2.14.0 (METADATA Requires-Dist)" in check.reason
    assert check_named(report, "arch-plan").status == "skipped"


def test_requirement_files_resolve_includes_and_markers(tmp_path):
    (tmp_path / "requirements" / "build").mkdir(parents=True)
    (tmp_path / "requirements" / "common.txt").write_text(
        "transformers >= 5.0 # comment\n--extra-index-url x\n"
    )
    (tmp_path / "requirements" / "build" / "cuda.txt").write_text(
        "-r ../common.txt\ntorch==2.13.0; platform_machine == 'aarch64'\ntorch==9.9; platform_machine == 'x86_64'\n"
    )
    files = {p.relative_to(tmp_path).as_posix(): p.read_text() for p in tmp_path.rglob("*.txt")}
    declared = read_requirement_file(files.get, "requirements/build/cuda.txt")
    first = declared[0]
    assert (str(first.requirement.specifier), first.origin) == (">=5.0", "requirements/common.txt:1")
    assert len(source_requirements(files.get)) == 3  # common.txt read directly and through -r: once
    check = Check("requirements", "passed")
    check_requirements(check, declared, load_recipe("vllm-qwen35").model, subject="vLLM")
    assert check.status == "passed", check.reason  # the x86_64-only torch pin does not apply to linux/arm64
    assert marker_environment("linux/arm64", "3.12")["platform_machine"] == "aarch64"

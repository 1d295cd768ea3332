"""The compile probe for real: vLLM 0.31.0's sdist (PyPI, served on 127.0.0.1), its own CMake configure in the
probe stage (torch 2.13.0 and CUDA 13.0 nvcc from PyPI on the offline Debian base), real CUTLASS objects from
nvcc, audited for sm_121. Cold: about 12 min for the patched probe (one heavy CUTLASS unit, ~7 min on 2 shared
cores) plus 2-3 min for the unpatched and the no-nvcc variants; warm (BuildKit cache): about 1 min."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from sparkforge.imagebuild.pipeline import plan
from sparkforge.imagebuild.probe import ProbeResult, judge, run_probe
from sparkforge.imagebuild.stage import BuildOptions, BuildPlan, parse_base_image
from sparkforge.probe.units import ProbeError
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.report import Report
from tests.engine.sessions import build_session
from tests.recipe_files import write_recipe_file

pytestmark = pytest.mark.engine
SESSION = build_session()

RECIPES = REPO_ROOT / "tests" / "recipes"
FP8 = "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_sm120_fp8.cu"
DISPATCH = "csrc/libtorch_stable/quantization/w8a8/cutlass/scaled_mm_c3x_sm120.cu"


def _plan(recipe, base: str, url: str | None, logs: Path) -> BuildPlan:
    """The probe stage's plan, as `invoke probe` makes it (no URL: the source from PyPI, then GitHub)."""
    options = BuildOptions(
        target="probe", bases=parse_base_image(base), sources={"vllm": url} if url else {},
        network="host" if url else None, verify=False, preflight=False, probe=False, log_root=logs,
    )  # fmt: skip
    return plan(SESSION, recipe, options)


def _probe(recipe, base: str, url: str | None, logs: Path) -> ProbeResult:
    return run_probe(SESSION, _plan(recipe, base, url, logs))


def _check(report: Report, name: str):
    return next(c for c in report.checks if c.name == name)


@pytest.fixture(scope="module")
def patched(base_amd64: str, sdist_url: str, tmp_path_factory: pytest.TempPathFactory) -> ProbeResult:
    recipe = load_recipe(str(RECIPES / "ci-probe-amd64.yaml"))
    return _probe(recipe, base_amd64, sdist_url, tmp_path_factory.mktemp("logs"))


@pytest.mark.slow(cost_s=600, rank=4, reason="vLLM configured by CMake for sm_121 (535 s)")
def test_probed_fp8_objects_carry_native_sm121a_sass(patched: ProbeResult) -> None:
    report = patched.report
    assert report.status == "passed", [(c.name, c.reason) for c in report.failed]
    units = {u["source"]: u for u in report.extra["units"]}
    for source in (FP8, DISPATCH):
        assert units[source]["gencode"] == ["arch=compute_121a,code=sm_121a"]
        assert units[source]["verdict"] == "native"
        assert units[source]["entries"].get("sass_121a", 0) >= 1
        assert not [k for k in units[source]["entries"] if k.startswith("sass_120")]
    # A real CUTLASS GEMM object (0.66 MB built Release; 15 MB with RelWithDebInfo's debug info), compiled for
    # real (CCACHE_RECACHE: never a cache hit) and measured.
    assert (patched.out_dir / "objects" / (FP8.replace("/", "__") + ".o")).stat().st_size > 300_000
    assert units[FP8]["peak_tree_mb"] > 1000 and units[FP8]["seconds"] > 10
    assert "kernel-group decisions" in _check(report, "plan-vs-configure").reason
    assert (patched.out_dir / "probe.json").is_file() and patched.unit_peak_gb >= 1
    data = report.to_dict()
    assert data["command"] == "probe" and data["target"] == "sm_121"


@pytest.mark.slow(cost_s=30, rank=4, reason="reads the probe above")
def test_a_plan_that_disagrees_with_the_configure_fails_the_probe(
    patched: ProbeResult, base_amd64: str, sdist_url: str
) -> None:
    # Break one side on purpose: judge the real configure (patched source) against the plan of the unpatched
    # recipe (cmake -P on vLLM's own CMakeLists.txt without the patch).
    from sparkforge.imagebuild.probe import _upstream

    unpatched = load_recipe(str(RECIPES / "ci-probe-unpatched.yaml"))
    scratch = Report(command="probe", subject="unpatched plan")
    probe = _plan(unpatched, base_amd64, sdist_url, Path("/nowhere"))  # only planned: its source is read
    upstream = _upstream(SESSION, probe, scratch)
    result = json.loads((patched.out_dir / "probe.json").read_text())
    report = Report(command="probe", subject="broken on purpose")
    judge(load_recipe(str(RECIPES / "ci-probe-amd64.yaml")), result, upstream, patched.out_dir, report)
    check = _check(report, "plan-vs-configure")
    assert check.status == "failed" and report.status == "failed"
    assert "cmake -P plan predicts ['sm_120f']" in check.reason and "has ['sm_121a']" in check.reason


@pytest.mark.slow(cost_s=100, rank=4, reason="a probe without the patch (70 s)")
def test_without_the_patch_sm12x_kernels_are_family_only(
    base_amd64: str, sdist_url: str, tmp_path: Path
) -> None:
    recipe = load_recipe(str(RECIPES / "ci-probe-unpatched.yaml"))
    report = _probe(recipe, base_amd64, sdist_url, tmp_path).report
    assert report.status == "failed"
    assert _check(report, "plan-vs-configure").status == "passed"  # plan and configure agree: 12.0f
    units = {u["source"]: u for u in report.extra["units"]}
    assert units[DISPATCH]["gencode"] == ["arch=compute_120f,code=sm_120f"]
    assert units[DISPATCH]["verdict"] == "family" and "sass_120f" in units[DISPATCH]["entries"]
    reason = _check(report, "unit:scaled_mm_c3x_sm120.cu").reason
    assert "family-only on sm_121" in reason and "0001-cmake-keep-sm121-on-cuda13.patch" in reason


def _variant(tmp_path: Path, body: str) -> Path:
    return write_recipe_file(tmp_path / "variant.yaml", body, extends=RECIPES / "ci-probe-amd64.yaml")


def test_a_probe_path_that_does_not_exist_stops_in_seconds(base_amd64: str, tmp_path: Path) -> None:
    recipe = load_recipe(
        str(
            _variant(
                tmp_path,
                "build:\n  probe:\n    sources: [csrc/libtorch_stable/quantization/w8a8/"
                "cutlass/c3x/scaled_mm_sm121_fp8.cu]\n",
            )
        )
    )
    start = time.monotonic()
    with pytest.raises(ProbeError, match=re.escape(f"closest: {FP8}")):
        _probe(recipe, base_amd64, None, tmp_path)
    assert time.monotonic() - start < 120


def test_a_patch_that_no_longer_applies_stops_before_building(base_amd64: str, tmp_path: Path) -> None:
    body = (
        "components:\n  vllm:\n    version: 0.16.0\n    commit: 89a77b10846fd96273cce78d86d2556ea582d26e\n"
        "build:\n  probe:\n    sources: [csrc/activation_kernels.cu]\n"
    )
    recipe = load_recipe(str(_variant(tmp_path, body)))
    start = time.monotonic()
    with pytest.raises(
        ProbeError, match=re.escape("0001-cmake-keep-sm121-on-cuda13.patch does not apply")
    ) as info:
        _probe(recipe, base_amd64, None, tmp_path)
    assert "nothing was built" in str(info.value) and time.monotonic() - start < 120
    assert not (tmp_path / recipe.name).exists()


def test_a_missing_build_requirement_fails_at_configure(
    base_amd64: str, sdist_url: str, tmp_path: Path
) -> None:
    # The offline Debian base has no CUDA toolkit; without build.cuda_wheels nothing installs nvcc.
    recipe = load_recipe(str(_variant(tmp_path, "build:\n  cuda_wheels: null\n")))
    start = time.monotonic()
    report = _probe(recipe, base_amd64, sdist_url, tmp_path).report
    check = _check(report, "configure")
    assert check.status == "failed" and "the build environment has no CUDA compiler" in check.reason
    assert not report.extra.get("units") and time.monotonic() - start < 900

"""`invoke probe`: upstream facts in seconds, then the `probe` stage, then the objects audited and judged."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkforge import engine
from sparkforge.audit.compat import parse_target
from sparkforge.audit.coverage import audit_library
from sparkforge.audit.fatbin import read_fatbin_file
from sparkforge.commands import Runner
from sparkforge.console import say
from sparkforge.errors import EngineError, PreflightError
from sparkforge.imagebuild.stage import BuildOptions, build_stage
from sparkforge.preflight.archplan import ArchInputs, plan_arches, plan_details, require_cmake
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.preflight.patches import check_patches
from sparkforge.preflight.sources import GITHUB, resolve_upstream
from sparkforge.probe.crosscheck import compare, gencode_calls
from sparkforge.probe.judge import judge_configure, judge_unit
from sparkforge.probe.units import ProbeError, check_units
from sparkforge.recipe.loader import REPO_ROOT, Recipe
from sparkforge.report import Report

IMAGE_DIR = "/opt/sparkforge/probe"


@dataclass(frozen=True)
class ProbeOptions:
    platform: str | None = None
    base_image: str | None = None
    ca_bundle: Path | None = None
    sources: dict[str, str] = field(default_factory=dict)  # component -> tarball URL (as build takes it)
    network: str | None = None
    no_cache: bool = False
    log_root: Path = REPO_ROOT / "logs"
    github_base: str = GITHUB


@dataclass
class ProbeResult:
    report: Report
    out_dir: Path
    unit_peak_mb: int  # the largest measured peak of one unit's compile (0: none measured)

    @property
    def unit_peak_gb(self) -> int:
        """Whole GB, rounded up: a stable build argument for the build stage's MAX_JOBS cap."""
        return math.ceil(self.unit_peak_mb / 1024) if self.unit_peak_mb else 0


def _upstream(recipe: Recipe, options: ProbeOptions, report: Report, runner: Runner) -> dict[str, Any]:
    """Source tree, unit paths, patch series and the cmake -P plan: seconds, before any build."""
    model = recipe.model
    fetcher = make_fetcher()
    with report.timed("source") as check:
        tree = resolve_upstream(
            recipe,
            source=options.sources.get("vllm"),
            github_base=options.github_base,
            fetcher=fetcher,
            runner=runner,
        )
        check.reason, check.details = (
            f"vLLM {model.components.vllm.version} from {tree.origin}",
            tree.describe(),
        )
    check_units(
        tree.root, model.build.probe_settings.sources, f"vLLM {model.components.vllm.version} ({tree.origin})"
    )
    with tempfile.TemporaryDirectory(prefix="sparkforge-probe-") as tmp:
        scratch = Path(tmp)
        with report.timed("patches") as check:
            check_patches(
                check,
                tree.root,
                recipe.patch_paths(),
                scratch,
                runner,
                subject="the pinned source",
                repo_root=REPO_ROOT,
            )
        if check.status == "failed":
            raise ProbeError(f"patch series: {check.reason}; nothing was built")

        def read_text(rel: str) -> str | None:
            patched = scratch / rel
            return patched.read_text() if patched.is_file() else tree.read_text(rel)

        problem = require_cmake(runner)
        if problem:
            raise ProbeError(f"the arch plan needs cmake on this machine: {problem}")
        inputs = ArchInputs.of(recipe, fetcher, options.platform)
        with report.timed("arch-plan") as check:
            plan = plan_details(plan_arches(read_text, inputs, runner))
            check.details = plan
            check.reason = (
                f"cmake -P: CUDA_ARCHS={';'.join(plan['cuda_archs'])}, {len(plan['groups'])} kernel groups"
            )
        return {"plan": plan, "lists_text": read_text("CMakeLists.txt") or ""}


def _build_probe_stage(
    recipe: Recipe, options: ProbeOptions, log_dir: Path, echo: Callable[[str], None]
) -> str:
    build_options = BuildOptions(
        platform=options.platform,
        target="probe",
        base_image=options.base_image,
        ca_bundle=options.ca_bundle,
        sources=dict(options.sources),
        network=options.network,
        no_cache=options.no_cache,
        verify=False,
        preflight=False,
        probe=False,
        log_root=log_dir,
    )
    return build_stage(recipe, build_options, echo=echo).candidate


def _fetch_results(image: str, out_dir: Path) -> dict[str, Any]:
    data = engine.read_image_file(image, f"{IMAGE_DIR}/probe.json")
    if data is None:
        raise EngineError(f"{image} has no {IMAGE_DIR}/probe.json: the probe stage did not run its script")
    result = json.loads(data)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probe.json").write_bytes(data)
    for name in ("configure.log",):
        text = engine.read_image_file(image, f"{IMAGE_DIR}/{name}")
        if text is not None:
            (out_dir / name).write_bytes(text)
    for unit in result.get("units", []):
        if unit.get("object"):
            blob = engine.read_image_file(image, f"{IMAGE_DIR}/{unit['object']}")
            if blob is not None:
                path = out_dir / unit["object"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(blob)
    return result


def audit_object(path: Path, gpu: str) -> dict[str, Any]:
    """The audit library's verdict for one object file (`none` when it carries no device code)."""
    fatbin = read_fatbin_file(path)
    if fatbin is None:
        return {"verdict": "none", "entries": {}}
    audit = audit_library(path.name, fatbin, parse_target(gpu), True)
    return {"verdict": audit.verdict, "entries": audit.entries}


def judge(
    recipe: Recipe, result: dict[str, Any], upstream: dict[str, Any], out_dir: Path, report: Report
) -> int:
    """Fill the report from the probe stage's result; returns the largest unit peak (MB)."""
    model = recipe.model
    if not judge_configure(report, result, model.cuda):
        return 0
    calls = gencode_calls(upstream["lists_text"])
    units = []
    for unit in result.get("units", []):
        if unit.get("object"):
            unit.update(audit_object(out_dir / unit["object"], model.gpu))
        units.append(unit)
        generic = any(c.archs_variable == "CUDA_ARCHS" and unit["source"] in c.sources for c in calls)
        judge_unit(report, unit, model, generic)
    with report.timed("plan-vs-configure") as check:
        problems = compare(
            upstream["plan"], result["configure"].get("messages", []), units, upstream["lists_text"]
        )
        check.details = {"disagreements": problems}
        if problems:
            check.status = "failed"
            check.reason = "the cmake -P arch plan and vLLM's real configure disagree: " + " | ".join(
                problems
            )
        else:
            check.reason = (
                f"{len(upstream['plan'].get('vllm_messages', []))} kernel-group decisions and {len(units)} units' "
                "-gencode flags agree"
            )
    report.extra["target"] = model.gpu
    report.extra["units"] = [
        {
            k: u.get(k)
            for k in ("source", "gencode", "verdict", "entries", "seconds", "peak_tree_mb", "peak_process_mb")
        }
        for u in units
    ]
    return max((int(u.get("peak_tree_mb") or 0) for u in units), default=0)


def run_probe(recipe: Recipe, options: ProbeOptions, *, echo: Callable[[str], None] = say) -> ProbeResult:
    """The compile probe: raises ProbeError for what stops it early; the report says what it found."""
    if recipe.model.components.vllm.source != "git":
        raise ProbeError(
            f"recipe {recipe.name} installs vLLM from a wheel: nothing is compiled, so there is nothing to probe. "
            "Fix: probe a source recipe (components.vllm.source: git), or audit the wheel with invoke audit"
        )
    report = Report(command="probe", subject=f"recipe {recipe.name}", recipe=recipe.name)
    runner = Runner(stream=False)
    try:
        upstream = _upstream(recipe, options, report, runner)
    except PreflightError as exc:
        raise ProbeError(f"the pinned vLLM source could not be read: {exc}") from None
    out_dir = options.log_root / recipe.name / "probe"
    image = _build_probe_stage(recipe, options, options.log_root, echo)
    result = _fetch_results(image, out_dir)
    peak = judge(recipe, result, upstream, out_dir, report)
    report.extra["objects"] = str(out_dir)
    return ProbeResult(report, out_dir, peak)

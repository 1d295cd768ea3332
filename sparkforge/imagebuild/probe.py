"""`invoke probe`: upstream facts in seconds, then the `probe` stage, then the objects audited and judged."""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from sparkforge import engine
from sparkforge.audit.compat import parse_target
from sparkforge.audit.coverage import audit_library
from sparkforge.audit.fatbin import read_fatbin_file
from sparkforge.boundary import MAX_JSON_BYTES, manifest_path, parse_json, write_output
from sparkforge.context import Session
from sparkforge.errors import EngineError, PreflightError
from sparkforge.imagebuild.execute import run_stage
from sparkforge.imagebuild.stage import BuildPlan
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


@dataclass
class ProbeResult:
    report: Report
    out_dir: Path
    unit_peak_mb: int  # the largest measured peak of one unit's compile (0: none measured)

    @property
    def unit_peak_gb(self) -> int:
        """Whole GB, rounded up: a stable build argument for the build stage's MAX_JOBS cap."""
        return math.ceil(self.unit_peak_mb / 1024) if self.unit_peak_mb else 0


def _upstream(session: Session, probe: BuildPlan, report: Report) -> dict[str, Any]:
    """Source tree, unit paths, patch series and the cmake -P plan: seconds, before any build."""
    recipe = probe.recipe
    model = recipe.model
    fetcher = make_fetcher()
    with report.timed("source") as check:
        tree = resolve_upstream(
            session, recipe, source=probe.options.sources.get("vllm"), github_base=GITHUB, fetcher=fetcher
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
                session,
                check,
                tree.root,
                recipe.patch_paths(),
                scratch,
                subject="the pinned source",
                repo_root=REPO_ROOT,
            )
        if check.status == "failed":
            raise ProbeError(f"patch series: {check.reason}; nothing was built")
        read_text = partial(tree.patched_text, scratch)
        problem = require_cmake(session)
        if problem:
            raise ProbeError(f"the arch plan needs cmake on this machine: {problem}")
        inputs = ArchInputs.of(recipe, fetcher, probe.platform)
        with report.timed("arch-plan") as check:
            plan = plan_details(plan_arches(session, read_text, inputs))
            check.details = plan
            check.reason = (
                f"cmake -P: CUDA_ARCHS={';'.join(plan['cuda_archs'])}, {len(plan['groups'])} kernel groups"
            )
        return {"plan": plan, "lists_text": read_text("CMakeLists.txt") or ""}


def _fetch_results(image: str, out_dir: Path) -> dict[str, Any]:
    data = engine.read_image_file(image, f"{IMAGE_DIR}/probe.json")
    if data is None:
        raise EngineError(f"{image} has no {IMAGE_DIR}/probe.json: the probe stage did not run its script")
    fix = "rebuild the probe stage ('invoke probe'); its script writes probe.json"
    result = parse_json(data, f"{image}:{IMAGE_DIR}/probe.json", max_bytes=MAX_JSON_BYTES, fix=fix)
    units = result.get("units", []) if isinstance(result, dict) else None
    if not isinstance(units, list) or not all(isinstance(u, dict) for u in units):
        raise EngineError(f"{image}:{IMAGE_DIR}/probe.json: no list of units; fix: {fix}")
    write_output(out_dir / "probe.json", data, "probe results")
    for name in ("configure.log",):
        text = engine.read_image_file(image, f"{IMAGE_DIR}/{name}")
        if text is not None:
            write_output(out_dir / name, text, "probe results")
    for unit in units:
        if unit.get("object"):
            # A path the image printed: relative, inside out_dir, or refused (never '..' or absolute).
            rel = manifest_path(unit["object"])
            if rel is None:
                raise EngineError(f"probe.json names the object {str(unit['object'])[:120]!r}; fix: {fix}")
            blob = engine.read_image_file(image, f"{IMAGE_DIR}/{rel}")
            if blob is not None:
                write_output(out_dir / rel, blob, "probe results")
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


def run_probe(session: Session, probe: BuildPlan) -> ProbeResult:
    """The compile probe of a plan's `probe` stage: raises ProbeError for what stops it early; the report says
    what it found."""
    recipe = probe.recipe
    if recipe.model.components.vllm.source != "git":
        raise ProbeError(
            f"recipe {recipe.name} installs vLLM from a wheel: nothing is compiled, so there is nothing to probe. "
            "Fix: probe a source recipe (components.vllm.source: git), or audit the wheel with invoke audit"
        )
    report = Report(command="probe", subject=f"recipe {recipe.name}", recipe=recipe.name)
    try:
        upstream = _upstream(session, probe, report)
    except PreflightError as exc:
        raise ProbeError(f"the pinned vLLM source could not be read: {exc}") from None
    out_dir = probe.options.log_root / recipe.name / "probe"
    image = run_stage(session, probe).candidate
    result = _fetch_results(image, out_dir)
    peak = judge(recipe, result, upstream, out_dir, report)
    report.extra["objects"] = str(out_dir)
    return ProbeResult(report, out_dir, peak)

"""`invoke build`: survey the host, plan the build (stage.plan_build), then execute the plan: the gates
(preflight, then the compile probe on source recipes), then the stage (execute.run_stage)."""

from __future__ import annotations

from sparkforge.context import Session
from sparkforge.errors import PreflightError
from sparkforge.imagebuild.execute import BuildResult, run_stage
from sparkforge.imagebuild.probe import run_probe
from sparkforge.imagebuild.stage import BuildOptions, BuildPlan, plan_build, survey
from sparkforge.preflight.checks import PreflightOptions, run_preflight
from sparkforge.probe.units import ProbeError
from sparkforge.recipe.loader import Recipe
from sparkforge.report import print_report


def plan(session: Session, recipe: Recipe, options: BuildOptions) -> BuildPlan:
    """The build's plan: this host read once (survey), then every decision made (plan_build)."""
    return plan_build(recipe, options, survey(session, recipe, options))


def build(session: Session, recipe: Recipe, options: BuildOptions) -> BuildResult:
    """Plan the build, then execute it."""
    return execute(session, plan(session, recipe, options))


def execute(session: Session, plan: BuildPlan) -> BuildResult:
    """Preflight, probe, build, verify, and only then tag; a failure at any step moves no tag and keeps the logs."""
    if plan.dry:
        return run_stage(session, plan)  # prints the plan, gates included
    if plan.options.preflight:
        preflight_gate(session, plan)
    if plan.probe is not None:
        plan = plan.with_build_args(probe_gate(session, plan.probe))
    return run_stage(session, plan)


def probe_gate(session: Session, probe: BuildPlan) -> dict[str, str]:
    """Run the probe; raise when it fails; the build args it hands the build stage (the measured unit peak)."""
    result = run_probe(session, probe)
    print_report(result.report, session.echo)
    if result.report.status != "passed":
        failed = ", ".join(c.name for c in result.report.failed)
        raise ProbeError(
            f"the compile probe failed ({failed}); the full compile was not started. Fix what the table above "
            f"names (objects and logs: {result.out_dir}), or build anyway with --no-probe"
        )
    session.echo(
        f"sparkforge: probe passed; heaviest unit peaked at {result.unit_peak_mb} MB (build arg {result.unit_peak_gb} GB)"
    )
    return {"SPARKFORGE_UNIT_PEAK_GB": str(result.unit_peak_gb)}


def preflight_gate(session: Session, plan: BuildPlan) -> None:
    """Preflight before any build step; a failure stops the build before anything is built."""
    report = run_preflight(session, plan.recipe, PreflightOptions(source=plan.options.sources.get("vllm")))
    print_report(report, session.echo)
    if report.status != "passed":
        failed = ", ".join(c.name for c in report.failed)
        raise PreflightError(
            f"preflight failed ({failed}); nothing was built. Fix the recipe (see the table above), "
            "or build anyway with --no-preflight"
        )

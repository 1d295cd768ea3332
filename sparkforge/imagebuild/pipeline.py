"""`invoke build`: the gates (preflight, then the compile probe on source recipes), then the stage build."""

from __future__ import annotations

from collections.abc import Callable

from sparkforge.commands import Runner
from sparkforge.console import say
from sparkforge.context import Session
from sparkforge.errors import PreflightError
from sparkforge.imagebuild.probe import ProbeOptions, run_probe
from sparkforge.imagebuild.stage import BuildOptions, BuildResult, build_stage, check_options
from sparkforge.preflight.checks import PreflightOptions, run_preflight
from sparkforge.probe.units import ProbeError
from sparkforge.recipe.loader import Recipe
from sparkforge.report import print_report


def wants_probe(recipe: Recipe, options: BuildOptions) -> bool:
    """A real build that compiles vLLM: a source recipe built to the build or runtime stage, not --dry."""
    return (
        options.probe
        and not options.dry
        and options.target in ("build", "runtime")
        and recipe.model.components.vllm.source == "git"
    )


def probe_gate(session: Session, recipe: Recipe, options: BuildOptions) -> dict[str, str]:
    """Run the probe; raise when it fails; the build args it hands the build stage (the measured unit peak)."""
    echo = session.echo
    result = run_probe(
        recipe,
        ProbeOptions(
            platform=options.platform,
            base_image=options.base_image,
            ca_bundle=options.ca_bundle,
            sources=dict(options.sources),
            network=options.network,
            no_cache=options.no_cache,
            log_root=options.log_root,
        ),
        echo=echo,
    )
    print_report(result.report, echo)
    if result.report.status != "passed":
        failed = ", ".join(c.name for c in result.report.failed)
        raise ProbeError(
            f"the compile probe failed ({failed}); the full compile was not started. Fix what the table above "
            f"names (objects and logs: {result.out_dir}), or build anyway with --no-probe"
        )
    echo(
        f"sparkforge: probe passed; heaviest unit peaked at {result.unit_peak_mb} MB (build arg {result.unit_peak_gb} GB)"
    )
    return {"SPARKFORGE_UNIT_PEAK_GB": str(result.unit_peak_gb)}


def run_preflight_gate(session: Session, recipe: Recipe, options: BuildOptions) -> None:
    """Preflight before any build step; a failure stops the build before anything is built."""
    report = run_preflight(session, recipe, PreflightOptions(source=options.sources.get("vllm")))
    print_report(report, session.echo)
    if report.status != "passed":
        failed = ", ".join(c.name for c in report.failed)
        raise PreflightError(
            f"preflight failed ({failed}); nothing was built. Fix the recipe (see the table above), "
            "or build anyway with --no-preflight"
        )


def build(recipe: Recipe, options: BuildOptions, *, echo: Callable[[str], None] = say) -> BuildResult:
    """Preflight, probe, build, verify, and only then tag; a failure at any step moves no tag and keeps the logs.

    One Session for the build's gates (echo, the build's --ca-bundle); each stage logs under its own folder."""
    check_options(recipe, options)
    session = Session(echo=echo, runner=Runner(stream=False), ca_bundle=options.ca_bundle)
    if options.preflight:
        run_preflight_gate(session, recipe, options)
    probe_args = probe_gate(session, recipe, options) if wants_probe(recipe, options) else {}
    return build_stage(recipe, options, echo=echo, build_args=probe_args)

"""The probe before a source build (`invoke build` unless --no-probe): minutes to the first compile error."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkforge.probe.run import ProbeOptions, run_probe
from sparkforge.probe.units import ProbeError
from sparkforge.recipe import Recipe
from sparkforge.report import print_report

if TYPE_CHECKING:
    from sparkforge.build import BuildOptions


def wants_probe(recipe: Recipe, options: BuildOptions) -> bool:
    """A real build that compiles vLLM: a source recipe built to the build or runtime stage, not --dry."""
    return (
        options.probe
        and not options.dry
        and options.target in ("build", "runtime")
        and recipe.model.components.vllm.source == "git"
    )


def probe_gate(recipe: Recipe, options: BuildOptions, echo: Callable[[str], None]) -> dict[str, str]:
    """Run the probe; raise when it fails; the build args it hands the build stage (the measured unit peak)."""
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

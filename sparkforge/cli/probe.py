"""`invoke probe`: vLLM's real CMake configure + chosen kernels compiled and audited. Thin: parse, call, print."""

from __future__ import annotations

from invoke import Context

from sparkforge.cli import task, user_errors
from sparkforge.cli.build import STAGE_HELP
from sparkforge.cli.families import JSON_REPORT, NETWORK, Outputs
from sparkforge.context import Session


@task(
    families=(NETWORK, JSON_REPORT),
    iterable=["source"],
    help=dict(STAGE_HELP),
)
@user_errors
def probe(
    c: Context,
    session: Session,
    outputs: Outputs,
    recipe: str,
    platform: str = "",
    base_image: str = "",
    source: list[str] | None = None,
    network: str = "",
    no_cache: bool = False,
) -> None:
    """Compile probe: vLLM's own configure on the patched source, the recipe's probe units compiled, audited."""
    from sparkforge.imagebuild.pipeline import plan
    from sparkforge.imagebuild.probe import run_probe
    from sparkforge.imagebuild.stage import (
        BuildOptions,
        parse_base_image,
        parse_sources,
        probe_options,
        source_built,
    )
    from sparkforge.oci import check_platform
    from sparkforge.recipe.loader import load_recipe

    if platform:
        check_platform("--platform", platform)  # the boundary: before the engine
    loaded = load_recipe(recipe)
    options = BuildOptions(
        platform=platform or None,
        bases=parse_base_image(base_image),
        sources=parse_sources(source or [], source_built(loaded)),
        network=network or None,
        no_cache=no_cache,
    )
    result = run_probe(session, plan(session, loaded, probe_options(options)))  # the build's probe stage
    session.out(f"objects and logs: {result.out_dir}")
    outputs.finish(session, result.report)

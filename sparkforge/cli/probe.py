"""`invoke probe`: vLLM's real CMake configure + chosen kernels compiled and audited. Thin: parse, call, print."""

from __future__ import annotations

from invoke import Context

from sparkforge.cli import finish_report, task, user_errors
from sparkforge.cli.families import NETWORK
from sparkforge.context import Session

RECIPE_HELP = "recipe name in recipes/ or path to a recipe file"


@task(
    families=(NETWORK,),
    iterable=["source"],
    help={
        "recipe": RECIPE_HELP,
        "json": "write the JSON report here",
        "platform": "linux/arm64 or linux/amd64 (default: the recipe's first platform)",
        "base_image": "override the base images: REF, or builder=REF,runtime=REF (mirrors, offline bases)",
        "source": "component=URL: fetch a component's source tarball from URL (e.g. vllm=http://127.0.0.1:8000/v.tar.gz)",
        "network": "network mode for RUN steps (e.g. host, to reach a local source server)",
        "no_cache": "do not use the build cache",
    },
)
@user_errors
def probe(
    c: Context,
    session: Session,
    recipe: str,
    json: str = "",
    platform: str = "",
    base_image: str = "",
    source: list[str] | None = None,
    network: str = "",
    no_cache: bool = False,
) -> None:
    """Compile probe: vLLM's own configure on the patched source, the recipe's probe units compiled, audited."""
    from sparkforge.boundary import check_output
    from sparkforge.imagebuild.pipeline import plan
    from sparkforge.imagebuild.probe import run_probe
    from sparkforge.imagebuild.stage import BuildOptions, parse_base_image, parse_sources, source_built
    from sparkforge.oci import check_platform
    from sparkforge.recipe.loader import load_recipe

    if platform:
        check_platform("--platform", platform)  # the boundary: before the engine
    check_output(json, "--json")
    loaded = load_recipe(recipe)
    options = BuildOptions(
        platform=platform or None,
        target="probe",
        bases=parse_base_image(base_image),
        sources=parse_sources(source or [], source_built(loaded)),
        network=network or None,
        no_cache=no_cache,
        verify=False,
        preflight=False,
        probe=False,
    )
    result = run_probe(session, plan(session, loaded, options))
    session.out(f"objects and logs: {result.out_dir}")
    finish_report(result.report, json)

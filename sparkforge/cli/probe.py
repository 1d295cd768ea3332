"""`invoke probe`: vLLM's real CMake configure + chosen kernels compiled and audited. Thin: parse, call, print."""

from __future__ import annotations

from pathlib import Path

from invoke import Context

from sparkforge.cli import echo, finish_report, task, user_errors

RECIPE_HELP = "recipe name in recipes/ or path to a recipe file"


@task(
    iterable=["source"],
    help={
        "recipe": RECIPE_HELP,
        "json": "write the JSON report here",
        "platform": "linux/arm64 or linux/amd64 (default: the recipe's first platform)",
        "base_image": "override the base images: REF, or builder=REF,runtime=REF (mirrors, offline bases)",
        "ca_bundle": "PEM CA bundle passed as the BuildKit secret 'ca' (default: $SPARKFORGE_CA_BUNDLE)",
        "source": "component=URL: fetch a component's source tarball from URL (e.g. vllm=http://127.0.0.1:8000/v.tar.gz)",
        "network": "network mode for RUN steps (e.g. host, to reach a local source server)",
        "no_cache": "do not use the build cache",
    },
)
@user_errors
def probe(
    c: Context,
    recipe: str,
    json: str = "",
    platform: str = "",
    base_image: str = "",
    ca_bundle: str = "",
    source: list[str] | None = None,
    network: str = "",
    no_cache: bool = False,
) -> None:
    """Compile probe: vLLM's own configure on the patched source, the recipe's probe units compiled, audited."""
    from sparkforge.boundary import check_output
    from sparkforge.imagebuild.probe import ProbeOptions, run_probe
    from sparkforge.imagebuild.stage import parse_sources
    from sparkforge.oci import check_platform
    from sparkforge.recipe.loader import load_recipe

    if platform:
        check_platform("--platform", platform)  # the boundary: before the engine
    check_output(json, "--json")
    options = ProbeOptions(
        platform=platform or None,
        base_image=base_image or None,
        ca_bundle=Path(ca_bundle) if ca_bundle else None,
        sources=parse_sources(source or []),
        network=network or None,
        no_cache=no_cache,
    )
    result = run_probe(load_recipe(recipe), options, echo=echo)
    echo(f"objects and logs: {result.out_dir}")
    finish_report(result.report, json)

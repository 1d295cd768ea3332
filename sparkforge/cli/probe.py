"""`invoke probe`: vLLM's real CMake configure + chosen kernels compiled and audited. Thin: parse, call, print."""

from __future__ import annotations

from invoke import Context

from sparkforge.cli import task, user_errors
from sparkforge.cli.build import STAGE, StageFlags
from sparkforge.cli.families import JSON_REPORT, NETWORK, RECIPE_HELP, Outputs
from sparkforge.context import Session


@task(families=(NETWORK, STAGE, JSON_REPORT), iterable=["source"], help={"recipe": RECIPE_HELP})
@user_errors
def probe(c: Context, session: Session, stage: StageFlags, outputs: Outputs, recipe: str) -> None:
    """Compile probe: vLLM's own configure on the patched source, the recipe's probe units compiled, audited."""
    from sparkforge.imagebuild.pipeline import plan
    from sparkforge.imagebuild.probe import run_probe
    from sparkforge.imagebuild.stage import probe_options
    from sparkforge.recipe.loader import load_recipe

    loaded = load_recipe(recipe)
    result = run_probe(
        session, plan(session, loaded, probe_options(stage.options(loaded)))
    )  # the build's probe stage
    session.out(f"objects and logs: {result.out_dir}")
    outputs.finish(session, result.report)

"""sparkforge's command line (Invoke). Each task parses options, calls the library and prints the result."""

from __future__ import annotations

from pathlib import Path

from invoke import Collection, Context

from sparkforge.cli import bench as cli_bench
from sparkforge.cli import build as cli_build
from sparkforge.cli import cluster as cli_cluster
from sparkforge.cli import community as cli_community
from sparkforge.cli import conform as cli_conform
from sparkforge.cli import diff as cli_diff
from sparkforge.cli import docs as cli_docs
from sparkforge.cli import engine as cli_engine
from sparkforge.cli import memory as cli_memory
from sparkforge.cli import nvperf as cli_nvperf
from sparkforge.cli import overlay as cli_overlay
from sparkforge.cli import probe as cli_probe
from sparkforge.cli import publish as cli_publish
from sparkforge.cli import rebuild as cli_rebuild
from sparkforge.cli import run as cli_run
from sparkforge.cli import sbom as cli_sbom
from sparkforge.cli import sign as cli_sign
from sparkforge.cli import size as cli_size
from sparkforge.cli import task, user_errors
from sparkforge.cli import trust as cli_trust
from sparkforge.cli.families import JSON, NETWORK, RECIPE_HELP, Outputs
from sparkforge.context import Session


@task(
    families=(NETWORK, JSON),
    help={
        "catalog": "instead: a folder (or https:// file) of community recipes, each checked for import",
        "recipe": "with --catalog: the sparkforge recipe whose pinned vLLM they are checked against",
        "json": "with --catalog: write the rows as JSON here",
    },
)
@user_errors
def recipes(c: Context, session: Session, outputs: Outputs, catalog: str = "", recipe: str = "") -> None:
    """List the recipes with their one-line descriptions (or, with --catalog, a community catalog)."""
    from sparkforge.recipe.loader import list_recipe_names, load_recipe

    if catalog:
        return cli_community.catalog(session, catalog, recipe, outputs)
    for name in list_recipe_names():
        session.out(f"{name:28} {load_recipe(name).model.description}")


@task(help={"recipe": RECIPE_HELP})
@user_errors
def show(c: Context, session: Session, recipe: str) -> None:
    """Print the resolved recipe (after extends) as YAML, with its hash."""
    import yaml

    from sparkforge.recipe.loader import load_recipe

    loaded = load_recipe(recipe)
    session.out(f"# {loaded.name} ({loaded.path}); extends: {' -> '.join(p.name for p in loaded.chain)}")
    session.out(f"# recipe hash: {loaded.hash}")
    session.out(yaml.safe_dump(loaded.resolved(), sort_keys=False).rstrip())


@task(help={"recipe": RECIPE_HELP, "out": "directory to write <recipe>/ into (default: build/)"})
@user_errors
def render(c: Context, session: Session, recipe: str, out: str = "") -> None:
    """Write the build context build/<recipe>/ (Dockerfile, patches, image tests, lock, build.sh)."""
    from sparkforge.imagebuild.render import render_context
    from sparkforge.recipe.loader import load_recipe

    context = render_context(load_recipe(recipe), Path(out) if out else None)
    session.out(f"rendered {context.path}")


ci_ns = Collection("ci")
ci_ns.add_task(cli_publish.ci_matrix, "matrix")

ns = Collection(recipes, show, render)
ns.add_task(cli_build.preflight)
ns.add_task(cli_build.build)
ns.add_task(cli_build.verify)
ns.add_task(cli_build.audit)
ns.add_task(cli_build.lint)
ns.add_task(cli_build.test)
# `invoke lock` pins a recipe; `invoke lock.update` the project's own uv.lock
ns.add_collection(cli_build.lock_ns)
ns.add_task(cli_probe.probe)
ns.add_task(cli_publish.push)
ns.add_task(cli_publish.publish)
ns.add_task(cli_publish.pull)
ns.add_task(cli_publish.images)
ns.add_collection(cli_sign.ns)  # signing hook: sign, sign.attest, sign.install
ns.add_collection(cli_trust.ns)  # a publisher's TUF root: trust.init, rotate, recover, status
ns.add_task(cli_size.size)
ns.add_task(cli_sbom.sbom)
ns.add_task(cli_diff.diff)
ns.add_task(cli_diff.history)
ns.add_task(cli_diff.kernels)
ns.add_task(cli_rebuild.rebuild)
ns.add_task(cli_community.import_, "import")
ns.add_task(cli_community.export)
ns.add_collection(cli_engine.ns)
ns.add_collection(ci_ns)
ns.add_collection(cli_run.serve_ns)
ns.add_collection(cli_cluster.cluster_ns)
cli_bench.ns.add_task(cli_nvperf.baseline)  # bench.baseline: against NVIDIA's performance file
ns.add_collection(cli_bench.ns)
ns.add_task(cli_conform.conform)
ns.add_task(cli_memory.memory)
ns.add_collection(cli_docs.ns)
ns.add_collection(cli_overlay.ns)  # overlay (write), overlay.preflight, overlay.build

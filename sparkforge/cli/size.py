"""Invoke task `size`: where an image's bytes go (by layer, largest files and packages, libraries shipped twice)."""

from __future__ import annotations

from pathlib import Path

from invoke import Context
from invoke.exceptions import Exit

from sparkforge.cli import Whole, task, user_errors
from sparkforge.cli.families import JSON_REPORT, RECIPE_HELP, Outputs
from sparkforge.console import cell
from sparkforge.context import Session


def _gb(size: int) -> str:
    return f"{size / 1e9:7.3f} GB"


@task(
    families=(JSON_REPORT,),
    help={
        "image": "image reference in the local engine (default: the recipe's candidate tag)",
        "recipe": RECIPE_HELP + " (to find its candidate image)",
        "top": "how many of the largest files and packages to list",
    },
)
@user_errors
def size(
    c: Context, session: Session, outputs: Outputs, image: str = "", recipe: str = "", top: int = Whole(15)
) -> None:
    """Size report of an image: bytes per layer, largest files and packages, and CUDA libraries shipped twice."""
    from sparkforge.boundary import check_number
    from sparkforge.oci import check_reference
    from sparkforge.recipe import plan
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.verify.size import size_report

    if image:
        check_reference("--image", image)  # the boundary: before any engine call
    check_number("--top", top, low=1, high=10_000, integer=True)
    if not image:
        if not recipe:
            raise Exit("sparkforge: size needs --image REF or --recipe R", code=2)
        loaded = load_recipe(recipe)
        image = plan.candidate_tag(loaded, loaded.model.platforms[0])
    report = size_report(image, top=top)
    data = report.extra["size"]
    session.out(
        f"{image}: {_gb(data['image_bytes'])} ({data['files']} files; {_gb(data['hidden_bytes'])} hidden by later layers)"
    )
    for layer in data["layers"]:
        session.out(f"  layer {layer['index']:2} {_gb(layer['bytes'])}  {(layer['created_by'] or '?')[:90]}")
    session.out("largest packages:")
    for item in data["packages"][:top]:
        session.out(f"  {_gb(item['bytes'])}  {cell(item['name'])}")
    session.out("largest files:")
    for item in data["largest_files"][:top]:
        session.out(f"  {_gb(item['bytes'])}  {cell(item['path'])}")  # an image's file name: escaped
    for dup in data["duplicates"][:top]:
        session.out(
            f"  twice{' (CUDA)' if dup['cuda'] else ''}: {dup['name']} {dup['wasted_bytes'] / 1e6:.1f} MB at {len(dup['paths'])} paths"
        )
    check = report.checks[0]
    session.out(f"{check.name}: {check.status.upper()} - {check.reason}")
    if outputs.json:
        report.write_json(Path(outputs.json))
        session.out(f"report: {outputs.json}")
    if report.status != "passed":
        raise Exit(f"sparkforge: size: {check.reason}", code=1)

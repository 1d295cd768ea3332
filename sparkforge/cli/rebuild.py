"""Invoke task `rebuild --check IMAGE`: rebuild an image from its own labels, lock and time; compare digests."""

from __future__ import annotations

from invoke import Context
from invoke.exceptions import Exit

from sparkforge.cli import task, user_errors
from sparkforge.cli.families import JSON_REPORT, NETWORK, Outputs
from sparkforge.context import Session


@task(
    families=(NETWORK, JSON_REPORT),
    help={
        "check": "rebuild IMAGE and compare config and layer digests (the only mode)",
        "recipe": "the recipe file the image was built from, when it is not among the checkout's recipes",
        "network": "BuildKit --network for the rebuild's RUN steps (e.g. host on an engine without a bridge)",
        "keep": "keep the rebuilt image (tagged sparkforge-rebuild/<recipe>:check-<id>)",
        "allow_template_drift": "rebuild even when this checkout's templates differ from the image's revision",
        "keep_cache_mounts": "do not prune BuildKit's cache mounts (ccache, pip) first: a pass then does not "
        "prove that a cold build matches",
    },
)
@user_errors
def rebuild(
    c: Context,
    session: Session,
    outputs: Outputs,
    check: str = "",
    recipe: str = "",
    network: str = "",
    keep: bool = False,
    allow_template_drift: bool = False,
    keep_cache_mounts: bool = False,
) -> None:
    """Rebuild IMAGE (local or a registry reference) from its labels, lock and provenance; name what differs."""
    from sparkforge.imagebuild.rebuild import RebuildOptions, difference_lines, rebuild_check

    if not check:
        raise Exit("sparkforge: rebuild needs --check IMAGE (a local image or a registry reference)", code=2)
    from sparkforge.boundary import check_build_network, check_pem
    from sparkforge.oci import check_reference
    from sparkforge.recipe.loader import load_recipe

    check_reference("--check", check)  # the boundary: before any engine or registry call
    check_build_network("--network", network)
    if session.ca_bundle:
        check_pem(str(session.ca_bundle), "--ca-bundle")
    if recipe:
        load_recipe(recipe)  # the whole recipe checked now, not after the image was pulled
    report = rebuild_check(
        session,
        RebuildOptions(
            image=check,
            recipe=recipe or None,
            network=network or None,
            keep=keep,
            allow_template_drift=allow_template_drift,
            keep_cache_mounts=keep_cache_mounts,
        ),
    )
    for line in difference_lines(report):
        session.out(line)
    outputs.finish(session, report, hint="the rebuild is not identical: see the files above")

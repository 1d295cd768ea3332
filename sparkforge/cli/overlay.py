"""Invoke tasks `overlay` (write an overlay recipe for a patch or a pull request), `overlay.preflight` and
`overlay.build`. Thin: parse, call sparkforge.imagebuild.overlay, print."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from invoke import Collection, Context

from sparkforge.cli import finish_report, task, user_errors
from sparkforge.cli.families import DRY, JSON, Family, Outputs, opt
from sparkforge.context import Session

OVERLAY_HELP = "overlay recipe: a name in recipes/overlays/ or a path"


def _base_image(recipe, image: str) -> str:
    from sparkforge.errors import InputError
    from sparkforge.imagebuild.overlay.write import local_base_image

    found = local_base_image(recipe, image)
    if found is None:
        raise InputError(
            f"--image {image or '(the recipe candidate)'}: not on this engine; fix: build or 'invoke pull' the "
            "verified image, or name it with --image"
        )
    return found


@dataclass(frozen=True)
class Writing:
    """What the overlay is made of (the patch, or a pull request from a local clone) and where it goes."""

    image: str = opt(
        "", "the verified base image (default: the recipe's local candidate); pinned by digest in the overlay"
    )
    patch: str = opt("", "a patch file ('git diff' or 'git format-patch' output)")
    pr: int = opt(
        0, "instead: a pull request number, read from --checkout (its squash or merge commit; no network)"
    )
    checkout: str = opt("", "a local git clone of the package's repository (with --pr)")
    package: str = opt(
        "vllm", "the installed package the patch changes: vllm, transformers or flashinfer (default vllm)"
    )
    name: str = opt("", "the overlay's name (default <recipe>-pr<N> or <recipe>-<patch name>)")
    out: str = opt("", "where to write the overlay recipe (default recipes/overlays/<name>.yaml)")
    no_preflight: bool = opt(False, "write without checking the patch applies to the base image")


WRITING = Family.of(Writing, "writing")


@task(
    name="write",
    families=(WRITING,),
    help={"recipe": "the recipe the base image was built from (name in recipes/ or a path)"},
)
@user_errors
def write(c: Context, session: Session, writing: Writing, recipe: str) -> None:
    """Write an overlay recipe: a verified image plus a patch (a file, or a pull request from a local clone)."""
    from sparkforge.boundary import check_output
    from sparkforge.imagebuild.overlay.model import load_overlay
    from sparkforge.imagebuild.overlay.preflight import run_overlay_preflight
    from sparkforge.imagebuild.overlay.write import OverlayRequest, OverlaySource, write_overlay
    from sparkforge.recipe.loader import load_recipe

    w = writing
    check_output(w.out, "--out")
    loaded = load_recipe(recipe)
    source = OverlaySource(
        Path(w.patch) if w.patch else None, int(w.pr) or None, Path(w.checkout) if w.checkout else None
    )
    base = _base_image(loaded, w.image)
    request = OverlayRequest(loaded, base, w.package, source, w.name, Path(w.out) if w.out else None)
    written = write_overlay(session, request)
    session.out(
        f"wrote {written.path} and {written.patch} ({len(written.kept)} file(s): {', '.join(written.kept)})"
    )
    if written.dropped:
        session.out(f"left out (not installed in the image): {', '.join(written.dropped)}")
    if not w.no_preflight:
        report = run_overlay_preflight(session, load_overlay(written.path)).report
        finish_report(
            report,
            out=session.out,
            hint=f"the overlay was written; fix the patch or the base, then 'invoke overlay.preflight --overlay {written.path}'",
        )


@task(families=(JSON,), help={"overlay": OVERLAY_HELP, "json": "write the preflight report (JSON) here"})
@user_errors
def preflight(c: Context, session: Session, outputs: Outputs, overlay: str) -> None:
    """Check an overlay in seconds: patch rules, the pinned base, every patch applies at the image's versions."""
    from sparkforge.imagebuild.overlay.model import load_overlay
    from sparkforge.imagebuild.overlay.preflight import run_overlay_preflight

    outputs.finish(session, run_overlay_preflight(session, load_overlay(overlay)).report)


@task(
    families=(DRY,),
    help={
        "overlay": OVERLAY_HELP,
        "gpus": "verify's GPU mode: all, none or auto",
        "no_verify": "build only (the image is not tagged)",
        "no_cache": "build without BuildKit's cache",
    },
)
@user_errors
def build(
    c: Context,
    session: Session,
    overlay: str,
    gpus: str = "auto",
    no_verify: bool = False,
    no_cache: bool = False,
) -> None:
    """Build an overlay on its verified base (minutes), verify it like any image, then tag it."""
    import datetime as dt

    from sparkforge.imagebuild.overlay.build import OverlayBuildOptions, build_overlay
    from sparkforge.imagebuild.overlay.model import load_overlay
    from sparkforge.recipe.plan import LOG_ROOT
    from sparkforge.verify.suite import gpu_mode

    loaded = load_overlay(overlay)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    dry = session.runner.dry
    logged = session.logged(LOG_ROOT / loaded.name / f"{stamp}-overlay")
    options = OverlayBuildOptions(verify=not no_verify, gpus=gpu_mode(gpus), no_cache=no_cache, dry=dry)
    result = build_overlay(logged, loaded, options)
    if result.tagged:
        session.out(f"sparkforge: overlay {loaded.name} verified and tagged {', '.join(result.tagged)}")
        session.out(f"compare: invoke diff {loaded.model.base.image} {result.tagged[0]}")


ns = Collection("overlay")
ns.add_task(write, "write", default=True)
ns.add_task(preflight)
ns.add_task(build)

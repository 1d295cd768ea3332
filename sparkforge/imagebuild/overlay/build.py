"""Build an overlay: preflight, render build/<name>/ from dockerfiles/overlay.Dockerfile.j2, one BuildKit build on
the pinned base, a check that the result really derives from that image, verify (the same checks as any image,
judged by the base recipe's pins under the overlay's name and hash), and only then the final tag.

Two steps, as every build: `plan_overlay` (pure: context values, labels, lock, argv) and `build_overlay` (runs it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sparkforge import engine
from sparkforge.boundary import parse_json, read_bytes, write_output
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.errors import VerifyError
from sparkforge.imagebuild.buildkit import BuildRequest, build_command
from sparkforge.imagebuild.overlay import unidiff
from sparkforge.imagebuild.overlay.model import Overlay
from sparkforge.imagebuild.overlay.preflight import (
    PreflightResult,
    file_hashes,
    require_passed,
    run_overlay_preflight,
)
from sparkforge.imagebuild.render import DEFAULT_BUILD_ROOT, TEMPLATES_DIR, template_environment
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe
from sparkforge.report import Report, print_report
from sparkforge.verify.suite import GpuMode, VerifyOptions, verify_recorded

TEMPLATE = "overlay.Dockerfile.j2"
STAGE = "overlay"
LABEL = plan.LABEL_PREFIX + ".overlay"
# The in-image applier and the very module the preflight applied the series with (one algorithm).
APPLY_FILES = {
    "apply-patches.py": TEMPLATES_DIR / "files" / "apply-patches.py",
    "unidiff.py": Path(unidiff.__file__),
}


@dataclass(frozen=True)
class OverlayRecipe(Recipe):
    """The base recipe seen under the overlay's name and hash: what verify judges an overlay image by (same pins,
    same models, same budget; the overlay's own recipe hash in labels and lock)."""

    overlay_hash: str = ""

    @property
    def hash(self) -> str:
        return self.overlay_hash


def verify_view(overlay: Overlay) -> OverlayRecipe:
    base = overlay.base_recipe
    return OverlayRecipe(overlay.name, overlay.path, base.model, base.chain, overlay_hash=overlay.hash)


@dataclass(frozen=True)
class OverlayBuildOptions:
    verify: bool = True
    gpus: GpuMode = "auto"
    no_cache: bool = False
    dry: bool = False
    out_root: Path = DEFAULT_BUILD_ROOT  # build/<overlay>/ is written here
    revision: str = (
        "unknown"  # the sparkforge commit (org.opencontainers.image.revision); the executor reads it
    )


@dataclass(frozen=True)
class OverlayPlan:
    overlay: Overlay
    context: Path
    base_tag: str  # the engine's local name of the pinned base (BASE_IMAGE)
    candidate: str
    final: str
    labels: dict[str, str]
    lock: dict[str, object]
    request: BuildRequest


@dataclass(frozen=True)
class OverlayResult:
    plan: OverlayPlan
    preflight: Report
    image_id: str | None = None
    verify: Report | None = None
    tagged: tuple[str, ...] = ()


def overlay_labels(overlay: Overlay) -> dict[str, str]:
    """The labels an overlay adds over its base's: its own name and hash, the base digest, each patch's hash."""
    out = {
        "org.opencontainers.image.title": overlay.name,
        "org.opencontainers.image.description": overlay.model.description,
        f"{plan.LABEL_PREFIX}.recipe": overlay.name,
        f"{plan.LABEL_PREFIX}.recipe-hash": overlay.hash,
        f"{LABEL}.base": overlay.model.base.image,
        f"{LABEL}.base-recipe": overlay.base_recipe.name,
        f"{LABEL}.base-recipe-hash": overlay.base_recipe.hash,
    }
    for index, patch in enumerate(overlay.model.patches, 1):
        out[f"{LABEL}.patch.{index}"] = f"{patch.package}:{patch.sha256}"
    return out


def overlay_lock(overlay: Overlay, pre: PreflightResult) -> dict[str, object]:
    """The base image's lock with the overlay's name and hash, and an `overlay` section (base, patches, files)."""
    base = (
        parse_json(pre.base_lock.decode("utf-8"), "the base image's /opt/sparkforge/lock.json")
        if pre.base_lock
        else {}
    )
    assert pre.installed is not None
    return {
        **base,
        "recipe": overlay.name,
        "recipe_hash": overlay.hash,
        "overlay": {
            "base": {
                "image": overlay.model.base.image,
                "image_id": pre.image_id,
                "recipe": overlay.base_recipe.name,
                "recipe_hash": overlay.base_recipe.hash,
            },
            "site_packages": pre.installed.site,
            "patches": [p.model_dump(mode="json", exclude_none=True) for p in overlay.model.patches],
            "files": file_hashes(pre.installed),
        },
    }


def render_overlay(
    overlay: Overlay,
    pre: PreflightResult,
    labels: dict[str, str],
    lock: dict[str, object],
    root: Path,
    base_tag: str,
) -> None:
    """Write the context afresh (the same overlay and base give the same bytes), swapped in by rename."""
    assert pre.installed is not None
    values = {
        "name": overlay.name,
        "overlay_hash": overlay.hash,
        "description": overlay.model.description,
        "base_image": base_tag,
        "site": pre.installed.site,
        "patches": [{"name": Path(p.file).name} for p in overlay.model.patches],
        "labels": labels,
    }
    text = template_environment().get_template(TEMPLATE).render(**values)
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{overlay.name}.", dir=root.parent))
    try:
        context = staging / "context"
        files = {
            "Dockerfile": text.encode(),
            "lock.json": (json.dumps(lock, indent=2, sort_keys=True) + "\n").encode(),
        }
        files |= {f"patches/{Path(patch.file).name}": data for patch, data in pre.patches}
        files |= {
            f"files/{name}": read_bytes(source, "", 1 << 20, named=False)
            for name, source in APPLY_FILES.items()
        }
        for name, data in files.items():
            write_output(context / name, data, "build context")
        if root.exists():
            root.rename(staging / "old")
        context.rename(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def plan_overlay(
    overlay: Overlay, pre: PreflightResult, platform: str, options: OverlayBuildOptions
) -> OverlayPlan:
    """Every value of the build decided: names, labels, lock, the BuildKit request (no I/O)."""
    arch = platform.split("/")[-1]
    base_tag = f"sparkforge-overlay-base/{overlay.name}:{pre.image_id.removeprefix('sha256:')[:12]}"
    context = options.out_root / overlay.name
    request = BuildRequest(
        context=context,
        platform=platform,
        target=STAGE,
        tags=(f"sparkforge-candidate/{overlay.name}:{overlay.hash[:12]}-{arch}",),
        build_args={
            "BASE_IMAGE": base_tag,
            "SPARKFORGE_CREATED": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "SPARKFORGE_REVISION": options.revision,
        },
        no_cache=options.no_cache,
        progress="plain",
    )
    return OverlayPlan(
        overlay,
        context,
        base_tag,
        request.tags[0],
        f"sparkforge/{overlay.name}:{overlay.hash[:12]}-{arch}",
        overlay_labels(overlay),
        overlay_lock(overlay, pre),
        request,
    )


def check_derives(base_id: str, image_id: str) -> None:
    """The overlay's layers are the base's, unchanged, plus its own on top (it was built on that very image)."""
    base = (engine.inspect_image(base_id).get("RootFS") or {}).get("Layers") or []
    built = (engine.inspect_image(image_id).get("RootFS") or {}).get("Layers") or []
    if not base or built[: len(base)] != base or len(built) <= len(base):
        raise VerifyError(
            f"the built image {image_id[:19]} does not sit on the base {base_id[:19]} (its layers differ); "
            "fix: rebuild with --no-cache, and check nothing retagged the base"
        )


def build_overlay(session: Session, overlay: Overlay, options: OverlayBuildOptions) -> OverlayResult:
    """Preflight, render, build on the pinned base, check the derivation, verify; tag only a verified image."""
    pre = run_overlay_preflight(session, overlay)
    print_report(pre.report, session.echo)
    require_passed(pre)
    platform = engine.image_platform(pre.image_id)
    head = session.runner.capture(
        Command.of("git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"), "revision", check=False
    )
    if head.returncode == 0:
        options = dataclasses.replace(options, revision=head.output.strip())
    built = plan_overlay(overlay, pre, platform, options)
    render_overlay(overlay, pre, built.labels, built.lock, built.context, built.base_tag)
    eng = engine.buildx_driver(session.runner, engine.detect_engine(session.runner))
    command = build_command(eng, built.request)
    if options.dry:
        session.echo(f"# context: {built.context}")
        session.echo(f"# tag {pre.image_id} as {built.base_tag}, then:")
        session.runner.run(command, "overlay-build")
        return OverlayResult(built, pre.report)
    engine.tag_image(pre.image_id, built.base_tag)
    session.echo(f"sparkforge: building overlay {overlay.name} on {overlay.model.base.image} ({platform})")
    session.runner.run(command, "overlay-build")
    image_id = str(engine.inspect_image(built.candidate)["Id"])
    check_derives(pre.image_id, image_id)
    if not options.verify:
        session.warn(f"--no-verify: {built.candidate} is built but UNVERIFIED and not tagged {built.final}")
        return OverlayResult(built, pre.report, image_id)
    report = verify_recorded(verify_view(overlay), image_id, VerifyOptions(gpus=options.gpus))
    print_report(report, session.echo)
    if report.status != "passed":
        failed = ", ".join(c.name for c in report.failed)
        raise VerifyError(
            f"overlay {overlay.name} built as {built.candidate} but verify failed ({failed}); not tagged"
        )
    engine.tag_image(image_id, built.final)
    return dataclasses.replace(OverlayResult(built, pre.report, image_id, report), tagged=(built.final,))

"""`invoke rebuild --check IMAGE`: rebuild an image from its own labels, lock and time, and compare digests.

What the image says of itself is the whole input: its recipe hash (found among the checkout's recipes), the
base images it was built on, its stage, its lock (/opt/sparkforge/lock.json), its sparkforge revision and its
creation time (the build's SOURCE_DATE_EPOCH). The rebuild runs with no cache, after BuildKit's cache mounts
(ccache, pip) are pruned so that nothing compiled or downloaded by an earlier build reaches it (a pass means a
cold build matches); the config digest and every layer's diff ID are compared, and on a difference both images
are saved and compared file by file (imagebuild/layerdiff.py). A template changed since the image's revision
and a base override recorded in its labels are named (imagebuild/drift.py).
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkforge import engine
from sparkforge.boundary import parse_json
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.errors import CommandError, EngineError, RecipeError, SparkforgeError
from sparkforge.imagebuild import drift, epoch, layerdiff
from sparkforge.imagebuild.execute import run_stage
from sparkforge.imagebuild.stage import BuildOptions, plan_build, survey
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe, load_recipe
from sparkforge.report import Check, Report

LOCK_PATH = "/opt/sparkforge/lock.json"
HASH_LABEL = f"{plan.LABEL_PREFIX}.recipe-hash"
NAME_LABEL = f"{plan.LABEL_PREFIX}.recipe"
STAGE_LABEL = f"{plan.LABEL_PREFIX}.stage"
EPOCH_LABEL = f"{plan.LABEL_PREFIX}.source-date-epoch"
REVISION_LABEL = "org.opencontainers.image.revision"
# Where the checkout keeps recipes an image may name (test recipes included: CI's images are built from them).
RECIPE_DIRS = (REPO_ROOT / "recipes", REPO_ROOT / "tests" / "recipes")
REBUILD_REPO = "sparkforge-rebuild"
CACHE_MOUNTS = "type=exec.cachemount"  # BuildKit's record type of a RUN --mount=type=cache


class RebuildRefused(SparkforgeError):
    """The image does not say enough about itself to be rebuilt."""


@dataclass(frozen=True)
class RebuildOptions:
    image: str
    recipe: str | None = None  # a recipe file to use instead of searching the checkout
    network: str | None = None  # BuildKit --network for the rebuild's RUN steps (e.g. host)
    keep: bool = False  # keep the rebuilt image (tagged sparkforge-rebuild/<recipe>:<id>)
    allow_template_drift: bool = False  # rebuild even when the checkout's templates are not the image's
    keep_cache_mounts: bool = False  # leave BuildKit's cache mounts: then a pass does not prove a cold build
    log_root: Path = plan.LOG_ROOT


@dataclass(frozen=True)
class Subject:
    """What an image says of itself, read before anything is rebuilt."""

    ref: str
    image_id: str
    recipe: Recipe
    stage: str
    platform: str
    bases: plan.Bases
    epoch: int
    revision: str | None
    lock: dict[str, Any] | None
    labels: dict[str, str]


def find_recipe(recipe_hash: str, name: str, explicit: str | None = None) -> Recipe:
    """The recipe in the checkout (or `explicit`) whose hash is the image's; RebuildRefused naming the hash."""
    candidates: Iterable[Path | str]
    if explicit:
        candidates = [explicit]
    else:
        files = [p for d in RECIPE_DIRS for p in sorted(d.glob("*.yaml")) if not p.name.startswith("_")]
        candidates = sorted(files, key=lambda p: p.stem != name)  # the labelled name first
    for candidate in candidates:
        try:
            recipe = load_recipe(candidate)
        except RecipeError:
            continue
        if recipe.hash == recipe_hash:
            return recipe
    where = explicit or ", ".join(str(d.relative_to(REPO_ROOT)) + "/" for d in RECIPE_DIRS)
    raise RebuildRefused(
        f"the image names recipe {name!r} with hash {recipe_hash[:12]}, which is not in this checkout "
        f"(searched {where}): the recipe changed since the image was built, or the image was built from "
        "another checkout; fix: check out the sparkforge revision the image names (its "
        f"{REVISION_LABEL} label) or pass --recipe PATH to the recipe file it was built from"
    )


def read_subject(session: Session, ref: str, explicit_recipe: str | None = None) -> Subject:
    """The image's labels, lock and time, or RebuildRefused naming what is missing."""
    if not engine.image_exists(ref):
        _pull(session, ref)
    attrs = engine.inspect_image(ref)
    labels = dict((attrs.get("Config") or {}).get("Labels") or {})
    missing = [label for label in (NAME_LABEL, HASH_LABEL) if not labels.get(label)]
    if missing:
        raise RebuildRefused(
            f"{ref} carries no sparkforge labels ({', '.join(missing)} missing): it was not built by "
            "'invoke build', so nothing says which recipe, bases and pins made it; fix: rebuild-check an image "
            "built by sparkforge (its labels name the recipe hash and bases)"
        )
    stage = labels.get(STAGE_LABEL, "runtime")
    raw = engine.read_image_file(ref, LOCK_PATH)
    lock = (
        parse_json(raw.decode("utf-8", "replace"), f"{ref}:{LOCK_PATH}") if raw else None
    )  # a file of the image
    if lock is None and stage == "runtime":
        raise RebuildRefused(
            f"{ref} has sparkforge labels but no lock at {LOCK_PATH}: its resolved pins are unknown, so a "
            "rebuild could not be compared with it; fix: rebuild-check an image built by 'invoke build' "
            "(the runtime stage carries its lock)"
        )
    if lock is not None and lock.get("recipe_hash") != labels[HASH_LABEL]:
        raise RebuildRefused(
            f"{ref}: its lock ({LOCK_PATH}) names recipe hash {str(lock.get('recipe_hash'))[:12]} but its "
            f"label {HASH_LABEL} says {labels[HASH_LABEL][:12]}; the image was altered after its build; "
            "fix: rebuild-check the image as built"
        )
    recipe = find_recipe(labels[HASH_LABEL], labels[NAME_LABEL], explicit_recipe)
    pinned = plan.bases(recipe)
    bases = plan.Bases(
        labels.get(plan.BASE_LABELS["builder"], pinned.builder),
        labels.get(plan.BASE_LABELS["runtime"], pinned.runtime),
    )
    platform = f"{attrs.get('Os', 'linux')}/{attrs.get('Architecture', 'amd64')}"
    if attrs.get("Variant"):
        platform += f"/{attrs['Variant']}"
    return Subject(
        ref,
        str(attrs["Id"]),
        recipe,
        stage,
        platform,
        bases,
        _epoch(labels, attrs),
        labels.get(REVISION_LABEL),
        lock,
        labels,
    )


def _epoch(labels: dict[str, str], attrs: dict[str, Any]) -> int:
    """The build's SOURCE_DATE_EPOCH: its label, else the config's created time (BuildKit 0.11+ set it so)."""
    if labels.get(EPOCH_LABEL, "").isdigit():
        return int(labels[EPOCH_LABEL])
    return epoch.parse_created(str(attrs.get("Created") or "1970-01-01T00:00:00Z"))


def _pull(session: Session, ref: str) -> None:
    try:
        engine.run_cli(session.runner, session.container_engine, "pull", "pull", ref)
    except EngineError as exc:
        raise RebuildRefused(
            f"{ref} is not a local image and could not be pulled ({str(exc).splitlines()[0][:200]}); fix: "
            "name a local image ('docker images') or a registry reference this engine can pull"
        ) from None


def lock_check(subject: Subject) -> Check:
    """The image's lock against the checkout's lock of the same recipe and bases."""
    if subject.lock is None:
        return Check(
            "lock", "skipped", f"stage {subject.stage} carries no lock; the checkout's recipe is used"
        )
    ours = plan.lock(subject.recipe, subject.bases)
    differs = layerdiff.config_differences(subject.lock, ours)
    if differs:
        return Check(
            "lock",
            "failed",
            f"the image's lock differs from the checkout's in {', '.join(differs)}",
            {"differs": differs},
        )
    return Check("lock", "passed", "the image's lock is the checkout's lock for this recipe")


def rebuild(session: Session, subject: Subject, options: RebuildOptions, original: str) -> str:
    """Rebuild the subject's stage with no cache; the rebuilt image's ID (tagged sparkforge-rebuild/...)."""
    holding = f"{REBUILD_REPO}/{subject.recipe.name}:check-{subject.image_id.split(':')[-1][:12]}"
    build_options = BuildOptions(
        platform=subject.platform,
        target=subject.stage,
        bases={"builder": subject.bases.builder, "runtime": subject.bases.runtime},
        tags=(holding,),
        no_cache=True,
        verify=False,
        preflight=False,
        probe=False,
        network=options.network,
        log_root=options.log_root,
    )
    candidate = plan.candidate_tag(subject.recipe, subject.platform)
    candidate += "" if subject.stage == "runtime" else f"-{subject.stage}"
    # The build moves the candidate tag to the rebuild: it names what it named before (held as a tag, since an
    # image store may drop an image left without a name), or nothing.
    previous = candidate if engine.image_exists(candidate) else None
    if previous is not None and str(engine.inspect_image(candidate)["Id"]) != subject.image_id:
        previous = f"{REBUILD_REPO}/{subject.recipe.name}:previous"
        engine.tag_image(candidate, previous)
    elif previous is not None:
        previous = original
    session.echo(
        f"sparkforge: rebuilding {subject.ref} (stage {subject.stage}, {subject.platform}) with no cache"
    )
    host = survey(session, subject.recipe, build_options)
    # The image's own time and revision, not this checkout's: the rebuild must reproduce it.
    host = dataclasses.replace(
        host,
        epoch=epoch.Epoch(subject.epoch, f"{subject.ref}'s created time"),
        revision=subject.revision or host.revision,
    )
    result = run_stage(session, plan_build(subject.recipe, build_options, host))
    rebuilt = str(engine.inspect_image(result.candidate)["Id"])
    if result.candidate != holding:
        engine.tag_image(rebuilt, holding)
        if previous:
            engine.tag_image(previous, result.candidate)
            if previous != original:
                engine.remove_image(previous)
        else:
            engine.remove_image(result.candidate)
    return holding


def prune_cache_mounts(session: Session, keep: bool) -> Check:
    """Prune the engine's BuildKit cache mounts (every `RUN --mount=type=cache`: ccache, pip, uv) before a
    rebuild, naming each; a warm ccache would hand the rebuild objects an earlier build compiled."""
    if keep:
        return Check(
            "cache-mounts",
            "skipped",
            "kept (--keep-cache-mounts): the rebuild's --no-cache gave every RUN fresh cache mounts on BuildKit "
            "0.8 and 0.13 (measured, benchmarks/repro.md); on other BuildKit versions a warm ccache or pip cache "
            "could reach the rebuild, and a pass would not prove that a cold build gives the same image",
        )
    eng = session.container_engine
    head = ("buildx", "prune", "--verbose") if eng.mode == "buildx" else ("builder", "prune")
    session.echo("sparkforge: pruning BuildKit's cache mounts (ccache, pip) so that the rebuild starts cold")
    out = engine.run_cli(
        session.runner, eng, "prune-cache-mounts", *head, "--force", "--filter", CACHE_MOUNTS
    )
    mounts = [m.split(" from exec ")[0] for m in re.findall(r"^Description:\s*(.*)$", out, re.M)]
    total = re.search(r"^Total(?: reclaimed space)?:\s*(\S+)", out, re.M)
    named = sorted(set(mounts))
    return Check(
        "cache-mounts",
        "passed",
        f"pruned {len(mounts)} cache mount(s) of the engine ({total.group(1) if total else '0B'}): "
        + (", ".join(named[:8]) or "none held")
        + "; the rebuild compiles and downloads everything again",
        {"pruned": mounts, "reclaimed": total.group(1) if total else "0B", "filter": CACHE_MOUNTS},
    )


def _save(session: Session, ref: str, path: Path) -> layerdiff.SavedImage:
    try:
        session.runner.run(Command.of(engine.docker_cli(), "save", "--output", str(path), ref), "save")
    except CommandError as exc:
        raise EngineError(f"could not save {ref} to compare its files: {exc}") from None
    return layerdiff.read_saved(path)


def compare(
    session: Session, original: str, rebuilt: str, report: Report, revision: str | None = None
) -> list[layerdiff.LayerDiff]:
    """Config digest and layer diff IDs; on a difference, the files (saved archives compared)."""
    a, b = engine.inspect_image(original), engine.inspect_image(rebuilt)
    same_config = a["Id"] == b["Id"]
    a_layers, b_layers = (tuple((x.get("RootFS") or {}).get("Layers") or ()) for x in (a, b))
    if same_config and a_layers == b_layers:
        report.add(Check("config", "passed", f"same image ID {a['Id']}", {"id": a["Id"]}))
        report.add(
            Check(
                "layers", "passed", f"all {len(a_layers)} layer digests equal", {"diff_ids": list(a_layers)}
            )
        )
        return []
    with tempfile.TemporaryDirectory(prefix="sparkforge-rebuild-") as tmp:
        saved_a = _save(session, original, Path(tmp) / "original.tar")
        saved_b = _save(session, rebuilt, Path(tmp) / "rebuild.tar")
        keys = layerdiff.config_differences(saved_a.config, saved_b.config)
        layers = layerdiff.compare_images(saved_a, saved_b)
    steps = drift.steps_check(saved_a.config, saved_b.config, revision)
    if steps is not None:
        report.add(steps)
    report.add(
        Check(
            "config",
            "passed" if same_config else "failed",
            f"same image ID {a['Id']}"
            if same_config
            else f"{a['Id']} != {b['Id']}; differs in " + (", ".join(keys) or "the layer list only"),
            {"original": a["Id"], "rebuild": b["Id"], "differs": keys},
        )
    )
    files = sum(len(layer.files) for layer in layers)
    report.add(
        Check(
            "layers",
            "failed" if layers else "passed",
            f"{len(layers)} of {max(len(a_layers), len(b_layers))} layers differ ({files} files)"
            if layers
            else f"all {len(a_layers)} layer digests equal",
            {"layers": [layer.to_dict() for layer in layers]},
        )
    )
    return layers


def rebuild_check(session: Session, options: RebuildOptions) -> Report:
    """Read the image, rebuild it, compare; the report (command 'rebuild') with the differing layers and files."""
    subject = read_subject(session, options.image, options.recipe)
    report = Report(command="rebuild", subject=options.image, recipe=subject.recipe.name)
    report.add(
        Check(
            "subject",
            "passed",
            f"recipe {subject.recipe.path} (hash {subject.recipe.hash[:12]}), stage {subject.stage}, "
            f"{subject.platform}, epoch {subject.epoch}",
            {
                "recipe": str(subject.recipe.path),
                "stage": subject.stage,
                "platform": subject.platform,
                "bases": {"builder": subject.bases.builder, "runtime": subject.bases.runtime},
                "source_date_epoch": subject.epoch,
                "revision": subject.revision,
                "image_id": subject.image_id,
            },
        )
    )
    report.add(lock_check(subject))
    report.add(drift.bases_check(subject.recipe, subject.labels))
    report.add(drift.template_check(session, subject.revision, options.allow_template_drift))
    report.add(prune_cache_mounts(session, options.keep_cache_mounts))
    began = time.monotonic()
    original = f"{REBUILD_REPO}/{subject.recipe.name}:original-{subject.image_id.split(':')[-1][:12]}"
    engine.tag_image(subject.image_id, original)  # held by name while the rebuild moves tags
    rebuilt = None
    try:
        rebuilt = rebuild(session, subject, options, original)
        report.add(
            Check("rebuild", "passed", f"rebuilt as {rebuilt}", {"image": rebuilt}, time.monotonic() - began)
        )
        compare(session, original, rebuilt, report, subject.revision)
    finally:
        if rebuilt and not options.keep:
            engine.remove_image(rebuilt)
        engine.remove_image(original)
    return report


def difference_lines(report: Report, per_layer: int = 25) -> list[str]:
    """The table of a report's differing layers and files (content changes first), then small-file diffs."""
    layers = next((c.details.get("layers") for c in report.checks if c.name == "layers"), None) or []
    lines: list[str] = []
    diffs: list[str] = []
    for layer in layers:
        files = sorted(layer.get("files") or [], key=lambda f: ("content" not in f["differs"], f["path"]))
        kinds: dict[str, int] = {}
        for item in files:
            for what in item["differs"]:
                kinds[what] = kinds.get(what, 0) + 1
        counts = ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())) or "a layer only one image has"
        lines.append(
            f"layer {layer['index']} ({str(layer.get('step') or '?')[:70]}): {len(files)} files ({counts})"
        )
        for item in files[:per_layer]:
            package = f"  [{item['package']}]" if item.get("package") else ""
            lines.append(f"  {','.join(item['differs']):<18} /{item['path']}{package}")
            if item.get("diff"):
                diffs.append(item["diff"])
        if len(files) > per_layer:
            lines.append(f"  ... and {len(files) - per_layer} more (all are in the JSON report)")
    return lines + diffs

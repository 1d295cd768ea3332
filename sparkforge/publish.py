"""Registry side: push one platform by digest, merge every platform into one multi-arch index, pull and check.

Manifest work goes through `sparkforge.manifests` (the engine's own tools). A multi-arch tag is
all-or-nothing: publishing refuses when any platform of the recipe is missing. Immutable tags never move;
moving tags move only through `promote`.
"""

from __future__ import annotations

import datetime as dt
import json
import platform as _platform
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkforge import engine, plan
from sparkforge.commands import Runner
from sparkforge.engine import Engine
from sparkforge.errors import EngineError, PublishError
from sparkforge.manifests import DIGEST, Manifests, index_platforms, manifest_content, repo_digest

# Re-exported: tests and older callers reach these through this module.
from sparkforge.manifests import _json_in as _json_in
from sparkforge.manifests import is_local_registry as is_local_registry
from sparkforge.recipe import REPO_ROOT, Recipe

DIGESTS_DIR = REPO_ROOT / "build" / "digests"
LOG_ROOT = REPO_ROOT / "logs"
RUNNERS = {"linux/amd64": "ubuntu-24.04", "linux/arm64": "ubuntu-24.04-arm"}
HOST_PLATFORMS = {
    "x86_64": "linux/amd64",
    "amd64": "linux/amd64",
    "aarch64": "linux/arm64",
    "arm64": "linux/arm64",
}

Echo = Callable[[str], None]


# ---- records of pushed platform images ----------------------------------------------------------


@dataclass(frozen=True)
class PushedImage:
    """One platform's image in the registry, addressed by digest: what `publish` merges."""

    recipe: str
    recipe_hash: str
    platform: str
    repository: str
    digest: str

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.recipe}-{_arch(self.platform)}.json"
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        return path


def load_digests(recipe: Recipe, directory: Path) -> dict[str, str]:
    """platform -> digest from the records `push` wrote for this recipe; a stale record is an error."""
    out: dict[str, str] = {}
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            record = PushedImage(**{k: data[k] for k in PushedImage.__dataclass_fields__})
        except (ValueError, KeyError, TypeError):
            raise PublishError(f"{path}: not a digest record written by 'invoke push'; remove it") from None
        if record.recipe != recipe.name:
            continue
        if record.recipe_hash != recipe.hash or record.repository != recipe.model.publish.repository:
            raise PublishError(
                f"{path}: written for recipe hash {record.recipe_hash[:12]} / {record.repository}, but recipe "
                f"{recipe.name} is now {recipe.hash[:12]} / {recipe.model.publish.repository}; fix: build and "
                f"push {record.platform} again from this recipe, or remove the stale record"
            )
        out[record.platform] = record.digest
    return out


def _arch(platform: str) -> str:
    return platform.split("/")[-1]


def _recipe_ref(recipe: Recipe) -> str:
    """What `--recipe` takes for this recipe on a CI checkout: its name in recipes/, else its repo path."""
    if recipe.path.parent == REPO_ROOT / "recipes":
        return recipe.name
    return (
        str(recipe.path.relative_to(REPO_ROOT)) if recipe.path.is_relative_to(REPO_ROOT) else str(recipe.path)
    )


# ---- tags and references ------------------------------------------------------------------------


def expand_tag(recipe: Recipe, template: str, when: dt.date) -> str:
    """One tag template of the recipe's scheme with its placeholders filled (no repository)."""
    return template.format(**plan.tag_values(recipe, when))


def default_tag(recipe: Recipe) -> str:
    """The tag `pull` uses without --tag: the first immutable tag that names no date (it names the recipe)."""
    publish = recipe.model.publish
    for template in [*publish.tags, *publish.moving_tags]:
        if "{date}" not in template:
            return expand_tag(recipe, template, dt.date.today())
    raise PublishError(
        f"recipe {recipe.name}: every tag carries {{date}}, so there is no tag to pull without one; fix: pass "
        "--tag TAG (or --tag sha256:DIGEST), or add a tag like '{vllm}-{hash}' to publish.tags"
    )


def reference_for(recipe: Recipe, tag: str | None = None) -> str:
    """repository:tag, or repository@digest when `tag` is a digest."""
    repo = recipe.model.publish.repository
    tag = tag or default_tag(recipe)
    if DIGEST.fullmatch(tag):
        return f"{repo}@{tag}"
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise PublishError(
            f"--tag {tag!r} is neither a tag nor a sha256:<64 hex> digest; fix: e.g. --tag latest"
        )
    return f"{repo}:{tag}"


def label_drift(recipe: Recipe, labels: Mapping[str, str]) -> dict[str, tuple[str | None, str]]:
    """label -> (image's value, recipe's value) for every sparkforge label that differs."""
    expected = {k: v for k, v in plan.labels(recipe).items() if k.startswith(plan.LABEL_PREFIX + ".")}
    return {k: (labels.get(k), v) for k, v in sorted(expected.items()) if labels.get(k) != v}


def _require_platforms(recipe: Recipe, have: Sequence[str], what: str, action: str = "publish") -> None:
    wanted = list(recipe.model.platforms)
    missing = [p for p in wanted if p not in have]
    extra = sorted({p for p in have if p not in wanted or list(have).count(p) > 1})
    if missing or extra:
        problems = [f"no image for {', '.join(missing)}"] if missing else []
        problems += [f"unexpected or repeated {', '.join(extra)}"] if extra else []
        fix = (
            " ".join(
                f"'invoke build --recipe {_recipe_ref(recipe)} --platform {p}' then 'invoke push --recipe {_recipe_ref(recipe)} "
                f"--platform {p}';"
                for p in missing
            )
            or "pass one digest per platform of the recipe;"
        )
        raise PublishError(
            f"refusing to {action} {recipe.model.publish.repository}: {what} has {'; '.join(problems)} "
            f"(have: {', '.join(sorted(have)) or 'nothing'}). A multi-arch tag must carry every platform of the "
            f"recipe ({', '.join(wanted)}) and nothing else; nothing was tagged. Fix: {fix} or change the "
            "recipe's platforms"
        )


def _tools(recipe: Recipe, runner: Runner | None, eng: Engine | None, echo: Echo, step: str) -> Manifests:
    if runner is None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        runner = Runner(log_dir=LOG_ROOT / recipe.name / f"{stamp}-{step}", echo=echo)
    return Manifests(eng or engine.detect_engine(), runner, recipe.model.publish.repository)


# ---- push ---------------------------------------------------------------------------------------


def push(
    recipe: Recipe,
    platform: str | None = None,
    *,
    image: str | None = None,
    metadata_file: Path | None = None,
    digests_dir: Path | None = DIGESTS_DIR,
    runner: Runner | None = None,
    eng: Engine | None = None,
    echo: Echo = print,
    allow_unverified: bool = False,
) -> PushedImage:
    """Push one platform's image to the recipe's repository and record its digest for `publish`.

    With `metadata_file` (BuildKit's, from `invoke build --push-by-digest`) the image is already in the
    registry: only its digest is recorded. Otherwise the local image (default: the verified candidate) must
    carry the recipe's labels and platform; it is pushed under a per-platform staging tag.
    """
    platform = platform or recipe.model.platforms[0]
    if platform not in recipe.model.platforms:
        raise PublishError(
            f"recipe {recipe.name} does not build {platform}; fix: use one of {', '.join(recipe.model.platforms)}"
        )
    repo = recipe.model.publish.repository
    if metadata_file is not None:
        try:
            digest = str(json.loads(metadata_file.read_text())["containerimage.digest"])
        except (OSError, ValueError, KeyError):
            raise PublishError(
                f"{metadata_file}: no 'containerimage.digest'; fix: pass the --metadata-file written by "
                "'invoke build --push-by-digest' (buildx)"
            ) from None
    else:
        tools = _tools(recipe, runner, eng, echo, f"push-{_arch(platform)}")
        source = image or plan.candidate_tag(recipe, platform)
        found = engine.image_platform(source)
        if found != platform:
            raise PublishError(f"{source} is a {found} image, not {platform}; fix: pass the {platform} image")
        drift = label_drift(recipe, engine.image_labels(source))
        if drift:
            raise PublishError(
                f"refusing to push {source}: {_drift_text(drift)}; fix: rebuild it from this recipe"
            )
        from sparkforge.verify import verified_record

        if verified_record(source) is None:
            if not allow_unverified:
                raise PublishError(
                    f"refusing to push {source}: this exact image (by ID) has no passed verify; fix: "
                    f"invoke verify --recipe {recipe.name} --image {source} (or push with --unverified)"
                )
            echo(f"sparkforge: WARNING: pushing {source} without a passed verify (--unverified)")
        staging = f"{repo}:{recipe.hash[:12]}-{_arch(platform)}"
        engine.tag_image(source, staging)
        output = engine.run_cli(tools.runner, tools.engine, "push", "push", staging)
        found_digests = re.findall(r"digest: (sha256:[0-9a-f]{64})", output)
        digest = found_digests[-1] if found_digests else repo_digest(staging, repo)
    if not DIGEST.fullmatch(digest):
        raise PublishError(f"not a sha256 digest: {digest!r}")
    pushed = PushedImage(recipe.name, recipe.hash, platform, repo, digest)
    if digests_dir is not None:
        echo(f"sparkforge: {pushed.reference} ({platform}) recorded in {pushed.write(digests_dir)}")
    return pushed


# ---- publish and promote ------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    """An index in the registry and the tags that name it."""

    recipe: str
    repository: str
    index: str
    platforms: dict[str, str]  # platform -> image manifest digest inside the index
    tags: tuple[str, ...]  # tags written now
    unchanged: tuple[str, ...]  # immutable tags that already named this same content
    date: str  # YYYYMMDD the {date} placeholders were filled with (promote later with the same)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "reference": f"{self.repository}@{self.index}"}


def publish(
    recipe: Recipe,
    digests: Mapping[str, str],
    *,
    when: dt.date | None = None,
    moving: bool = False,
    runner: Runner | None = None,
    eng: Engine | None = None,
    echo: Echo = print,
) -> Published:
    """Merge one digest per platform into one index under the recipe's immutable tags (all-or-nothing).

    Refuses before writing anything when a platform is missing or extra, when a digest is not the platform it
    claims, or when an immutable tag already names other content. `moving` also moves the moving tags
    (use `promote` for that after verification instead).
    """
    _require_platforms(recipe, list(digests), "the set of pushed digests")
    bad = [d for d in digests.values() if not DIGEST.fullmatch(d)]
    if bad:
        raise PublishError(
            f"not sha256 digests: {', '.join(bad)}; fix: use the digests 'invoke push' recorded"
        )
    tools = _tools(recipe, runner, eng, echo, "publish")
    repo = recipe.model.publish.repository
    sources = [f"{repo}@{digests[p]}" for p in recipe.model.platforms]
    when = when or dt.datetime.now(dt.UTC).date()
    tags = plan.final_tags(recipe, when)
    draft = tools.draft(tags.immutable[0], sources)
    _require_platforms(recipe, [p for p, _ in index_platforms(draft)], "the merged index")
    content = manifest_content(draft)
    new, unchanged = [], []
    keyed = {
        plan.final_tags(recipe, when).immutable[i]
        for i, template in enumerate(recipe.model.publish.tags)
        if "{hash}" in template
    }
    for tag in tags.immutable:
        existing = tools.fetch(tag)
        if existing is None:
            new.append(tag)
        elif manifest_content(existing) == content:
            unchanged.append(tag)
        elif tag in keyed:
            # A {hash} tag names a build of this very recipe; image bytes are not bit-reproducible, so a
            # rebuild differs. The first published build keeps the tag; the rebuild gets the other tags.
            unchanged.append(tag)
            echo(f"sparkforge: {tag} already names a build of this recipe hash; kept as it is")
        else:
            raise PublishError(
                f"refusing to move immutable tag {tag}: it already names other content "
                f"({', '.join(p + '=' + d[:19] for p, d in index_platforms(existing)) or 'a single image'}). "
                "Immutable tags never move; nothing was tagged. Fix: publish from a changed recipe (new hash), "
                "or delete the tag in the registry by hand if it was published in error"
            )
    for tag in unchanged:
        echo(f"sparkforge: {tag} already names this index (unchanged)")
    index = tools.create(new, sources) if new else tools.digest_of(unchanged[0])
    if new:
        target = "(dry run: nothing written)" if tools.runner.dry else f"{repo}@{index}"
        echo(f"sparkforge: {target} ({', '.join(recipe.model.platforms)}) -> {', '.join(new)}")
    stamp = when.strftime("%Y%m%d")
    result = Published(
        recipe.name, repo, index, dict(index_platforms(draft)), tuple(new), tuple(unchanged), stamp
    )
    if moving and tags.moving and index:
        moved = promote(recipe, index, when=when, runner=tools.runner, eng=tools.engine, echo=echo)
        return Published(
            recipe.name, repo, index, result.platforms, (*new, *moved.tags), tuple(unchanged), stamp
        )
    return result


def promote(
    recipe: Recipe,
    index: str,
    *,
    when: dt.date | None = None,
    runner: Runner | None = None,
    eng: Engine | None = None,
    echo: Echo = print,
) -> Published:
    """Point the recipe's moving tags at an already published (and verified) index, after checking it."""
    if not DIGEST.fullmatch(index):
        raise PublishError(f"--promote {index!r}: pass the index digest (sha256:<64 hex>) that was verified")
    tools = _tools(recipe, runner, eng, echo, "promote")
    repo = recipe.model.publish.repository
    when = when or dt.datetime.now(dt.UTC).date()
    moving = plan.final_tags(recipe, when).moving
    if not moving:
        raise PublishError(f"recipe {recipe.name} has no publish.moving_tags to move")
    manifest = tools.fetch(f"{repo}@{index}")
    if manifest is None:
        raise PublishError(f"{repo}@{index} is not in the registry; fix: publish it first ('invoke publish')")
    if "manifests" not in manifest:
        raise PublishError(
            f"refusing to move {', '.join(moving)}: {repo}@{index} is a single image, not a multi-arch index; "
            "fix: pass the index digest that 'invoke publish' printed (its --json 'index')"
        )
    images = index_platforms(manifest)
    _require_platforms(recipe, [p for p, _ in images], f"index {index[:19]}", "move tags of")
    if tools.buildx:
        tools.create(moving, [f"{repo}@{index}"])  # one index source: imagetools makes a carbon copy
        got = index if tools.runner.dry else tools.digest_of(moving[0])
    else:
        got = tools.create(moving, [f"{repo}@{d}" for _, d in images]) or index
    if got != index:
        raise PublishError(
            f"{', '.join(moving)} now name index {got}, an equivalent of {index} with other bytes; re-run "
            "'invoke publish --promote' with the new digest after verifying it"
        )
    echo(f"sparkforge: moved {', '.join(moving)} -> {repo}@{index}")
    return Published(recipe.name, repo, index, dict(images), tuple(moving), (), when.strftime("%Y%m%d"))


# ---- pull ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pulled:
    reference: str  # what was asked for
    platform: str
    image: str  # the local reference of the pulled platform image (repository@digest)
    drift: dict[str, tuple[str | None, str]]
    trust: dict[str, Any] = field(default_factory=dict)  # signing hook: signing_check.Trusted as JSON

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "drift": {k: {"image": a, "recipe": b} for k, (a, b) in self.drift.items()}}


def host_platform() -> str:
    machine = _platform.machine().lower()
    if machine not in HOST_PLATFORMS:
        raise PublishError(
            f"unknown machine type {machine!r}; fix: pass --platform linux/arm64 or linux/amd64"
        )
    return HOST_PLATFORMS[machine]


def pull(
    recipe: Recipe,
    tag: str | None = None,
    *,
    allow_drift: bool = False,
    platform: str | None = None,
    runner: Runner | None = None,
    eng: Engine | None = None,
    echo: Echo = print,
    warn: Echo = print,
    allow_unsigned: bool = False,
) -> Pulled:
    """Pull the recipe's published image for one platform and check its labels against the recipe's pins.

    A label that differs raises PublishError naming each one, or only warns with `allow_drift`. The platform's
    image is pulled by its digest from the index, so the image checked is exactly the one the tag names.
    """
    platform = platform or host_platform()
    ref = reference_for(recipe, tag)
    repo = recipe.model.publish.repository
    tools = _tools(recipe, runner, eng, echo, f"pull-{_arch(platform)}")
    manifest = tools.fetch(ref)
    if manifest is None:
        raise PublishError(
            f"{ref} does not exist; fix: check --tag (the recipe publishes "
            f"{', '.join(plan.final_tags(recipe, dt.date.today()).all)}), log in to the registry, or publish it"
        )
    if "manifests" in manifest:
        images = dict(index_platforms(manifest))
        if platform not in images:
            raise PublishError(
                f"{ref} has no {platform} image (it has {', '.join(images) or 'none'}); fix: pass --platform, "
                "or publish every platform of the recipe"
            )
        local = f"{repo}@{images[platform]}"
    else:
        local = ref
    from sparkforge import signing_check  # signing hook: verify signatures before pulling anything

    trusted = signing_check.verify_remote(
        recipe, ref, local, platform, tools, allow_unsigned=allow_unsigned, warn=warn
    )
    local = f"{repo}@{trusted.digest}"  # signing hook: pull exactly the digest that was verified
    echo(f"sparkforge: pulling {ref} for {platform}")
    try:
        engine.run_cli(tools.runner, tools.engine, "pull", "pull", "--platform", platform, local)
    except EngineError as exc:
        raise PublishError(f"pull of {ref} failed; log in to the registry if it is private.\n{exc}") from None
    # signing hook: the labels claim the commit the signed provenance names, before any tag is written
    signing_check.check_labels(trusted, engine.image_labels(local), lambda: engine.remove_image(local))
    if local != ref and "@" not in ref:
        engine.tag_image(local, ref)  # `docker run REPO:TAG` then means the image that was checked
    found = engine.image_platform(local)
    if found != platform:
        raise PublishError(f"{ref} gave a {found} image where {platform} was asked for")
    drift = label_drift(recipe, engine.image_labels(local))
    if drift:
        message = (
            f"{ref} ({platform}) was not built from recipe {recipe.name} as it is here: {_drift_text(drift)}. "
            f"Fix: pull the tag built from this recipe ('invoke pull --recipe {_recipe_ref(recipe)}' pulls "
            f"{reference_for(recipe)}), check out the sparkforge revision the image names (label "
            f"org.opencontainers.image.revision={engine.image_labels(local).get('org.opencontainers.image.revision')}"
            f"), or rebuild ('invoke build --recipe {_recipe_ref(recipe)}')"
        )
        if not allow_drift:
            raise PublishError(message + "; --allow-drift accepts the image with a warning")
        warn(f"sparkforge: WARNING (--allow-drift): {message}")
    else:
        echo(
            f"sparkforge: {local} ({platform}) matches recipe {recipe.name} (hash {recipe.hash[:12]}, all pins)"
        )
    return Pulled(ref, platform, local, drift, trusted.to_json())  # signing hook: what was proven


def _drift_text(drift: Mapping[str, tuple[str | None, str]]) -> str:
    items = "; ".join(
        f"{k}: image {a if a is not None else '(missing)'}, recipe {b}" for k, (a, b) in drift.items()
    )
    return f"{len(drift)} label(s) differ ({items})"


# ---- CI ----------------------------------------------------------------------------------------


def ci_matrix(recipes: Sequence[Recipe]) -> list[dict[str, Any]]:
    """One GitHub Actions matrix entry per recipe and platform.

    arm64 builds on a native arm64 runner, amd64 on x86; a recipe with `publish.qemu: true` builds arm64 on
    the x86 runner under QEMU instead (for repositories without arm64 runners).
    """
    entries = []
    for recipe in recipes:
        repo = recipe.model.publish.repository
        for platform in recipe.model.platforms:
            arch = _arch(platform)
            qemu = recipe.model.publish.qemu and platform != "linux/amd64"
            cache = f"{repo}:buildcache-{recipe.name}-{arch}"
            entries.append(
                {
                    "recipe": recipe.name,
                    "path": _recipe_ref(recipe),
                    "platform": platform,
                    "arch": arch,
                    "runner": RUNNERS["linux/amd64"] if qemu else RUNNERS[platform],
                    "qemu": qemu,
                    "repository": repo,
                    "cache_from": f"type=registry,ref={cache}",
                    "cache_to": f"type=registry,ref={cache},mode=max,image-manifest=true,oci-mediatypes=true",
                }
            )
    return entries

"""Registry side: push one platform by digest, merge every platform into one multi-arch index, pull and check.

Manifest work goes through `sparkforge.manifests` (the engine's own tools). A multi-arch tag is
all-or-nothing: publishing refuses when any platform of the recipe is missing. Immutable tags never move;
moving tags move only through `promote`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sparkforge import engine, oci
from sparkforge.context import Session
from sparkforge.errors import EngineError, PublishError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import Recipe, recipe_ref
from sparkforge.registry import history, tagtrust
from sparkforge.registry.manifests import DIGEST, Manifests, index_platforms, manifest_content, repo_digest
from sparkforge.registry.pushed import DIGESTS_DIR, PushedImage, read_build_metadata
from sparkforge.verify import verified

# ---- evidence ------------------------------------------------------------------------------------


def _evidence_problems(
    recipe: Recipe, record: dict[str, Any] | None, what: str, allow_base_override: bool
) -> list[str]:
    """Why `what` may not be published: no passed verify, or built on a base the recipe does not pin."""
    if record is None or record.get("status") != "passed":
        state = "no verify record" if record is None else "its latest verify FAILED (the pass is revoked)"
        return [
            f"{what}: {state}; fix: invoke verify --recipe {recipe_ref(recipe)} --image IMAGE, then push it "
            "(or pass --unverified: loudly warned, and never enough for moving tags)"
        ]
    if record.get("base_override") and not allow_base_override:
        return [
            f"{what}: built on other base images than the recipe pins (see the verify report's 'base' check); "
            "fix: build without --base-image, or pass --allow-base-override (test images only)"
        ]
    return []


def _refuse_or_warn(session: Session, problems: list[str], action: str, allow_unverified: bool) -> None:
    if not problems:
        return
    only_unverified = all("no verify record" in p or "verify FAILED" in p for p in problems)
    if allow_unverified and only_unverified:
        session.echo(
            f"sparkforge: WARNING (--unverified): {action} without a passed verify: " + " | ".join(problems)
        )
        return
    raise PublishError(f"refusing to {action}; nothing was written: " + " | ".join(problems))


def require_platforms(recipe: Recipe, have: Sequence[str], what: str, action: str = "publish") -> None:
    """Refuses (PublishError naming the fix) unless `have` holds each of the recipe's platforms exactly once."""
    wanted = list(recipe.model.platforms)
    missing = [p for p in wanted if p not in have]
    extra = sorted({p for p in have if p not in wanted or list(have).count(p) > 1})
    if missing or extra:
        problems = [f"no image for {', '.join(missing)}"] if missing else []
        problems += [f"unexpected or repeated {', '.join(extra)}"] if extra else []
        fix = (
            " ".join(
                f"'invoke build --recipe {recipe_ref(recipe)} --platform {p}' then 'invoke push --recipe {recipe_ref(recipe)} "
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


def _require_labels(recipe: Recipe, tools: Manifests, sources: Sequence[str]) -> None:
    """Every platform image in the registry carries this recipe's labels (hash and pins), before any write."""
    for source in sources:
        for platform, config in tools.image_configs(source).items():
            drift = plan.label_drift(recipe, (config.get("config") or {}).get("Labels") or {})
            if drift:
                raise PublishError(
                    f"refusing to publish {recipe.model.publish.repository}: {source} ({platform}) was not built "
                    f"from this recipe: {plan.drift_text(drift)}; nothing was tagged. Fix: rebuild and push that "
                    "platform from this recipe, or remove its stale digest record"
                )


def session_tools(session: Session, recipe: Recipe, step: str) -> Manifests:
    """One step's registry tools: the session's runner when it logs or is dry, else one that logs under the
    recipe's folder for `step` (every registry command replayable beside its log)."""
    logs = session.runner.log_dir is not None or session.runner.dry
    run = session if logs else session.logged(plan.log_dir(recipe, step))
    return Manifests(session.engine or engine.detect_engine(), run.runner, recipe.model.publish.repository)


# ---- push ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PushOptions:
    """What one push was told (`invoke push`): the platform, the image or BuildKit's metadata, the records."""

    platform: str | None = None  # None: the recipe's first
    image: str | None = None  # None: the verified candidate for the platform
    metadata_file: Path | None = None  # BuildKit's (build --push-by-digest): the image is in the registry
    digests_dir: Path | None = DIGESTS_DIR  # where the pushed digest is recorded (None: not recorded)
    allow_unverified: bool = False
    allow_base_override: bool = False
    evidence_dir: Path = verified.VERIFIED_DIR


def push_image(session: Session, recipe: Recipe, options: PushOptions) -> PushedImage:
    """Push one platform's image to the recipe's repository and record its digest for `publish`.

    With `metadata_file` (BuildKit's, from `invoke build --push-by-digest`) the image is already in the
    registry: only its digest is recorded. Otherwise the local image (default: the verified candidate) must
    carry the recipe's labels and platform; it is pushed under a per-platform staging tag. Either way the image
    needs a passed verify record (by image ID) unless `allow_unverified`, and the pushed digest is linked to it.
    """
    echo, metadata_file, evidence_dir = session.echo, options.metadata_file, options.evidence_dir
    allow_unverified, allow_base_override = options.allow_unverified, options.allow_base_override
    platform = plan.recipe_platform(recipe, options.platform, PublishError)
    repo = recipe.model.publish.repository
    if metadata_file is not None:
        try:
            meta = read_build_metadata(metadata_file)
        except EngineError as exc:
            raise PublishError(str(exc)) from None
        digest, image_id = meta.digest, meta.config_digest
        record = verified.read_record(image_id, evidence_dir)
        problems = _evidence_problems(recipe, record, f"{repo}@{digest[:19]}", allow_base_override)
        _refuse_or_warn(session, problems, f"record {digest[:19]}", allow_unverified)
    else:
        tools = session_tools(session, recipe, f"push-{oci.arch(platform)}")
        source = options.image or plan.candidate_tag(recipe, platform)
        image_id = str(engine.inspect_image(source)["Id"])
        found = engine.image_platform(image_id)
        if found != platform:
            raise PublishError(f"{source} is a {found} image, not {platform}; fix: pass the {platform} image")
        labels = engine.image_labels(image_id)
        drift = plan.label_drift(recipe, labels)
        if drift:
            raise PublishError(
                f"refusing to push {source}: {plan.drift_text(drift)}; fix: rebuild it from this recipe"
            )
        record = verified.read_record(image_id, evidence_dir)
        problems = _evidence_problems(recipe, record, f"{source} ({image_id[:19]})", allow_base_override)
        override = plan.base_override(recipe, labels)
        if override and not allow_base_override and not any("other base images" in p for p in problems):
            problems.append(
                f"{source}: built on other base images than the recipe pins ("
                + "; ".join(f"{stage}: {a}" for stage, (a, _) in override.items())
                + "); fix: build without --base-image, or pass --allow-base-override (test images only)"
            )
        _refuse_or_warn(session, problems, f"push {source}", allow_unverified)
        staging = f"{repo}:{recipe.hash[:12]}-{oci.arch(platform)}"
        engine.tag_image(image_id, staging)
        output = engine.run_cli(tools.runner, tools.engine, "push", "push", staging)
        found_digests = re.findall(r"digest: (sha256:[0-9a-f]{64})", output)
        digest = found_digests[-1] if found_digests else repo_digest(staging, repo)
    if not DIGEST.fullmatch(digest):
        raise PublishError(f"not a sha256 digest: {digest!r}")
    pushed = PushedImage(recipe.name, recipe.hash, platform, repo, digest)
    if record is not None and record.get("status") == "passed":
        verified.link_digest(digest, image_id, repo, evidence_dir)  # publish and promote follow this link
    if options.digests_dir is not None:
        echo(f"sparkforge: {pushed.reference} ({platform}) recorded in {pushed.write(options.digests_dir)}")
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


@dataclass(frozen=True)
class PublishOptions:
    """What one publish was told (`invoke publish`): the date of {date} tags, moving tags, the overrides."""

    when: dt.date | None = None  # None: today (UTC)
    moving: bool = False  # also move the moving tags (only when every platform image is GPU-verified)
    allow_unverified: bool = False
    allow_base_override: bool = False
    evidence_dir: Path = verified.VERIFIED_DIR


def publish_index(
    session: Session, recipe: Recipe, digests: Mapping[str, str], options: PublishOptions
) -> Published:
    """Merge one digest per platform into one index under the recipe's immutable tags (all-or-nothing).

    Refuses before writing anything when a platform is missing or extra, when a digest has no passed verify
    record (unless `allow_unverified`) or was built on an override base (unless `allow_base_override`), when a
    digest is not the platform it claims, or when an immutable tag already names other content. `moving` also
    moves the moving tags, only when every platform's image is GPU-verified (else nothing is written).
    """
    echo, evidence_dir, allow_base_override = session.echo, options.evidence_dir, options.allow_base_override
    require_platforms(recipe, list(digests), "the set of pushed digests")
    bad = [d for d in digests.values() if not DIGEST.fullmatch(d)]
    if bad:
        raise PublishError(
            f"not sha256 digests: {', '.join(bad)}; fix: use the digests 'invoke push' recorded"
        )
    problems: list[str] = []
    for platform, digest in sorted(digests.items()):
        record = verified.record_for_digest(digest, evidence_dir)
        problems += _evidence_problems(recipe, record, f"{platform} {digest[:19]}", allow_base_override)
    _refuse_or_warn(session, problems, f"publish {recipe.model.publish.repository}", options.allow_unverified)
    if options.moving:
        require_gpu_verified(recipe, digests, evidence_dir)
    tools = session_tools(session, recipe, "publish")
    repo = recipe.model.publish.repository
    sources = [f"{repo}@{digests[p]}" for p in recipe.model.platforms]
    when = options.when or dt.datetime.now(dt.UTC).date()
    tags = plan.final_tags(recipe, when)
    draft = tools.draft(tags.immutable[0], sources)
    require_platforms(recipe, [p for p, _ in index_platforms(draft)], "the merged index")
    if tools.buildx:
        _require_labels(recipe, tools, sources)
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
    if options.moving and tags.moving and index:
        moved = move_tags(
            replace(session, runner=tools.runner, engine=tools.engine),
            recipe,
            index,
            PromoteOptions(when, evidence_dir),
        )
        return Published(
            recipe.name, repo, index, result.platforms, (*new, *moved.tags), tuple(unchanged), stamp
        )
    return result


def require_gpu_verified(
    recipe: Recipe, digests: Mapping[str, str], evidence_dir: Path = verified.VERIFIED_DIR
) -> None:
    """THE gate of moving tags: every platform -> digest is GPU-verified for this recipe, or PublishError.

    Each digest's verify record (followed through the link push or pull wrote) must be of this repository,
    recipe, recipe hash, platform and this checkout's suite, and its own checks must pass the one GPU-verified
    rule (verified.record_verdict) for the recipe's GPU on the GPU the host passed in. No waiver exists.
    """
    problems = []
    for platform, digest in sorted(digests.items()):
        why = _not_gpu_verified(recipe, platform, digest, evidence_dir)
        if why:
            problems.append(f"{platform} {digest[:19]}: {why}")
    if problems:
        moving = ", ".join(recipe.model.publish.moving_tags) or "(none)"
        raise PublishError(
            f"refusing to move the moving tags ({moving}) of {recipe.model.publish.repository}: every platform "
            f"image they name must be GPU-verified for {recipe.model.gpu} (every vLLM FP8 kernel check passed "
            f"on a GPU of that capability). Not: {' | '.join(problems)}. Nothing was moved. Fix: on the target "
            "GPU (DGX Spark for sm_121), 'invoke verify --gpus all' the pushed image, then 'invoke publish "
            "--promote'; a platform without that GPU (e.g. linux/amd64 for sm_121) cannot carry moving tags"
        )


def _not_gpu_verified(recipe: Recipe, platform: str, digest: str, evidence_dir: Path) -> str:
    """Why the record of `digest` does not make it GPU-verified for `recipe` on `platform` ('' when it does)."""
    link = verified.digest_link(digest, evidence_dir)
    if link is None:
        return "no verify record for this digest (pushed from another machine, or --unverified)"
    record = verified.read_record(str(link["image_id"]), evidence_dir)
    if record is None:
        return "no verify record for this digest (pushed from another machine, or --unverified)"
    from sparkforge.verify.evidence import suite_digest
    from sparkforge.verify.suite import SUITE_DIR

    expected = {
        "repository": (link.get("repository"), recipe.model.publish.repository),
        "recipe": (record.get("recipe"), recipe.name),
        "recipe hash": (record.get("recipe_hash"), recipe.hash),
        "platform": (record.get("platform"), platform),
        "suite": ((record.get("suite") or {}).get("sha256"), suite_digest(SUITE_DIR)),
    }
    wrong = [f"{what} {found!r}, not {want!r}" for what, (found, want) in expected.items() if found != want]
    if wrong and record.get("status") == "passed":
        return "its verify record is of something else (" + "; ".join(wrong) + "); verify it with this recipe"
    return (
        verified.record_verdict(record, recipe.model.gpu).reason
        if not verified.is_gpu_verified(record, recipe.model.gpu)
        else ""
    )


@dataclass(frozen=True)
class PromoteOptions:
    """What one move of the moving tags was told (`invoke publish --promote`)."""

    when: dt.date | None = None  # the date of {date} tags (None: today, UTC)
    evidence_dir: Path = verified.VERIFIED_DIR


def move_tags(session: Session, recipe: Recipe, index: str, options: PromoteOptions) -> Published:
    """Point the recipe's moving tags at a published index, only when every platform image in it is GPU-verified."""
    echo, evidence_dir = session.echo, options.evidence_dir
    if not DIGEST.fullmatch(index):
        raise PublishError(f"--promote {index!r}: pass the index digest (sha256:<64 hex>) that was verified")
    tools = session_tools(session, recipe, "promote")
    repo = recipe.model.publish.repository
    when = options.when or dt.datetime.now(dt.UTC).date()
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
    require_platforms(recipe, [p for p, _ in images], f"index {index[:19]}", "move tags of")
    from sparkforge.registry.cosign import Policy

    signing = Policy.of(recipe) is not None and Policy.for_verify(recipe) is not None
    if not signing:  # signing recipes: the signed GPU claims decide (below), on any machine
        require_gpu_verified(recipe, dict(images), evidence_dir)
    if tools.buildx:  # the same label-drift rule as publish and pull, read from the registry
        _require_labels(recipe, tools, [f"{repo}@{index}"])
    before = {} if tools.runner.dry else history.current_digests(tools, moving)
    claims = {}
    if not tools.runner.dry and tagtrust.before_move(recipe, tools, index, dict(images)) is not None:
        claims = tagtrust.signed_claims(recipe, tools, dict(images))  # the GPU claims the targets will pin
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
    move = history.TagMove("promote", recipe.name, recipe.hash, index, dict(images), before, claims)
    tagtrust.record_move(recipe, tools, moving, move, evidence_dir)
    return Published(recipe.name, repo, index, dict(images), tuple(moving), (), when.strftime("%Y%m%d"))

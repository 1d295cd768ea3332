"""Invoke tasks for the registry side: push, publish, pull, images, ci.matrix. Thin: parse, call
sparkforge.registry, print."""

from __future__ import annotations

import datetime as dt
import json as _json
from dataclasses import dataclass
from pathlib import Path

from invoke import Context

from sparkforge.cli import task, user_errors
from sparkforge.cli.families import DRY, JSON, PLATFORM, PULL, RECIPE_HELP, Family, Outputs, PullChoice, opt
from sparkforge.context import Session
from sparkforge.errors import PublishError


@dataclass(frozen=True)
class Evidence:
    """push's and publish's records: where the pushed digests are, and what may be published without its
    evidence (no passed verify, loudly; a base the recipe does not pin, for test images)."""

    digests: str = opt("", "directory of digest records written by 'invoke push' (default: build/digests)")
    unverified: bool = opt(
        False, "publish digests that have no passed verify record (loudly warned; never moves tags)"
    )
    allow_base_override: bool = opt(
        False, "publish images built on other base images than the recipe pins (test images)"
    )

    @property
    def digests_dir(self) -> Path:
        from sparkforge.registry.pushed import DIGESTS_DIR

        return Path(self.digests) if self.digests else DIGESTS_DIR


EVIDENCE = Family.of(Evidence, "evidence")


@dataclass(frozen=True)
class TagMoves:
    """publish's moves of tags: the {date} of the tags, the moving tags too, or only a promote or a rollback."""

    date: str = opt("", "date for {date} tags, YYYYMMDD (default: today, UTC)")
    moving: bool = opt(False, "also move the moving tags (only when every platform image is GPU-verified)")
    promote: str = opt(
        "", "move the moving tags to this verified index digest (sha256:...) and do nothing else"
    )
    rollback: str = opt(
        "", "move this moving tag back to the previous GPU-verified index in its history, nothing else"
    )

    @property
    def when(self) -> dt.date | None:
        """--date YYYYMMDD (None: today, UTC)."""
        if not self.date:
            return None
        try:
            return dt.datetime.strptime(self.date, "%Y%m%d").date()
        except ValueError:
            raise PublishError(f"--date {self.date!r}: use YYYYMMDD, e.g. 20261129") from None


MOVES = Family.of(TagMoves, "moves")


@task(
    families=(PLATFORM, EVIDENCE),
    help={
        "recipe": RECIPE_HELP,
        "image": "local image to push (default: the recipe's verified candidate for the platform)",
        "metadata_file": "record the digest from this BuildKit metadata file ('invoke build --push-by-digest')",
        "unverified": "push even though this image has no passed 'invoke verify' (loudly warned)",
        "allow_base_override": "push an image built on other base images than the recipe pins (test images)",
    },
)
@user_errors
def push(
    c: Context,
    session: Session,
    platform: str | None,
    evidence: Evidence,
    recipe: str,
    image: str = "",
    metadata_file: str = "",
) -> None:
    """Push one platform's image to the recipe's repository by digest and record it for 'invoke publish'."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry import publish as pub

    if image:
        from sparkforge.oci import check_reference

        check_reference("--image", image)
    options = pub.PushOptions(
        platform,
        image=image or None,
        metadata_file=Path(metadata_file) if metadata_file else None,
        digests_dir=evidence.digests_dir,
        allow_unverified=evidence.unverified,
        allow_base_override=evidence.allow_base_override,
    )
    pub.push_image(session, load_recipe(recipe), options)


@task(
    families=(DRY, JSON, EVIDENCE, MOVES),
    iterable=["digest"],
    help={
        "recipe": RECIPE_HELP,
        "digest": "PLATFORM=sha256:... for one platform (repeatable; overrides the records)",
        "json": "write the result (index digest, tags) here",
        "dry": "read the registry, print what would be written, write nothing",
    },
)
@user_errors
def publish(
    c: Context,
    session: Session,
    outputs: Outputs,
    evidence: Evidence,
    moves: TagMoves,
    recipe: str,
    digest: list[str] | None = None,
) -> None:
    """Merge every platform's digest into one multi-arch index under the immutable tags (all or nothing)."""
    from sparkforge.boundary import check_exclusive
    from sparkforge.oci import check_digest, check_platform, check_tag
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry import publish as pub
    from sparkforge.registry.cosign import plan_digest
    from sparkforge.registry.pushed import load_digests

    rollback, promote = moves.rollback, moves.promote
    check_exclusive(
        rollback=rollback, promote=promote, digest=digest, moving=moves.moving and (rollback or promote)
    )
    if rollback:
        check_tag("--rollback", rollback)  # the boundary: before the registry is contacted
        check_exclusive(
            rollback=rollback, date=moves.date, digests=evidence.digests, unverified=evidence.unverified
        )
    if promote:
        check_digest("--promote", promote)
    loaded = load_recipe(recipe)
    when = moves.when
    # with --dry the session's runner prints every registry command and runs none
    if rollback:
        from sparkforge.registry.rollback import roll_back

        result = roll_back(session, loaded, rollback)
    elif promote:
        result = pub.move_tags(session, loaded, promote, pub.PromoteOptions(when))
    else:
        found = load_digests(loaded, evidence.digests_dir)
        for item in digest or []:
            platform, _, value = item.partition("=")
            if not value or not plan_digest(value):
                raise PublishError(
                    f"--digest {item!r}: use PLATFORM=sha256:<64 lowercase hex digits>, e.g. linux/arm64=sha256:..."
                )
            check_platform("--digest", platform)
            found[platform] = value
        options = pub.PublishOptions(when, moves.moving, evidence.unverified, evidence.allow_base_override)
        result = pub.publish_index(session, loaded, found, options)
    outputs.write(session, result.to_json())


def _check_pull_tag(tag: str) -> None:
    """`pull --tag`: an OCI tag or sha256:DIGEST (empty: the recipe's default)."""
    from sparkforge.recipe.plan import OCI_TAG
    from sparkforge.registry.cosign import plan_digest

    if tag and not (OCI_TAG.fullmatch(tag) or plan_digest(tag)):
        raise PublishError(
            f"--tag {tag[:80]!r} is neither a tag (letters, digits, _ . -, at most 128) nor sha256:<64 hex digits>; "
            "fix: pass one of the recipe's tags or a digest"
        )


@task(families=(JSON,), help={"recipe": RECIPE_HELP, "json": "write the listing (JSON) here"})
@user_errors
def images(c: Context, session: Session, outputs: Outputs, recipe: str) -> None:
    """The published images of a recipe from its signed TUF metadata: tags, digests, verdicts, GPU claims, dates."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry import tagtrust, tufclient

    loaded = load_recipe(recipe)
    state = tufclient.refresh(loaded.model.publish.repository, root_file=tufclient.root_file_of(loaded))
    rows = tagtrust.published(state)
    session.out(
        f"{loaded.model.publish.repository}: signed TUF targets v{state.version}, {len(rows)} move(s)"
    )
    for row in rows:
        now = "now " if row["names_now"] else "was "
        images_ = ", ".join(f"{p} {d[:19]}" for p, d in sorted(row["platforms"].items()))
        claims = sum(len(c) for c in row["claims"].values())
        session.out(
            f"  {row['date'][:10]}  {now}{row['tag']:12} {row['index'][:19]}  {images_}  {row['verdict']}"
        )
        if claims:
            session.out(
                f"      {claims} signed GPU claim(s) pinned; pull: invoke pull --recipe {recipe} --tag {row['tag']}"
            )
    outputs.write(
        session, {"repository": loaded.model.publish.repository, "version": state.version, "images": rows}
    )


@task(
    families=(PULL, JSON),
    help={
        "recipe": RECIPE_HELP,
        "tag": "tag or sha256:DIGEST to pull (default: the recipe's first tag without {date})",
        "digest": "pull this earlier release (index or image sha256:...; 'invoke history' lists them), verified",
        "platform": "linux/arm64 or linux/amd64 (default: this machine's)",
        "allow_unverified": "take an image without a signed GPU-verified claim for the platform (any path), LOUDLY: prints what is missing",
        "json": "write what was pulled (local image reference, drift) here",
    },
)
@user_errors
def pull(
    c: Context,
    session: Session,
    pulling: PullChoice,
    outputs: Outputs,
    recipe: str,
    tag: str = "",
    digest: str = "",
) -> None:
    """Pull the recipe's published image and check its labels against the recipe's hash and pins.

    Every path (default tag, --tag, --digest, moving tags) needs a signed GPU-verified claim for the platform and
    an image the signed TUF metadata does not revoke; moving tags resolve through that metadata (docs/trust.md).
    """
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry.pull import PullOptions, pull_image

    _check_pull_tag(tag)  # before the engine or the registry is contacted
    if digest and (tag or not digest.startswith("sha256:") or len(digest) != 71):
        raise PublishError(
            f"--digest {digest!r}: pass one sha256:<64 hex> digest and no --tag; fix: copy it from 'invoke history "
            f"--recipe {recipe}'"
        )
    loaded = load_recipe(recipe)
    options = PullOptions(
        digest or tag or None,
        pulling.platform,
        pulling.allow_drift,
        pulling.allow_unsigned,
        pulling.allow_unverified,
    )
    result = pull_image(session, loaded, options)
    session.out(f"image: {result.image}")
    from sparkforge.registry import releases

    release = releases.pulled(session, loaded, result.image, result.reference if digest else "")
    for line in release["lines"]:
        session.out(line)
    outputs.write(session, {**result.to_json(), "release": release})


@task(
    iterable=["recipe"],
    help={
        "recipe": "recipe to include (repeatable; default: every recipe in recipes/)",
        "github_output": "append matrix=<json> and recipes=<json> to this file (GitHub's $GITHUB_OUTPUT)",
    },
)
@user_errors
def ci_matrix(c: Context, session: Session, recipe: list[str] | None = None, github_output: str = "") -> None:
    """The GitHub Actions build matrix (recipe x platform, runner, qemu, cache) as JSON."""
    import os

    from sparkforge.recipe.loader import list_recipe_names, load_recipe
    from sparkforge.registry.matrix import ci_matrix as matrix

    names = list(recipe or []) or list_recipe_names()
    recipes = [load_recipe(name) for name in names]
    ref = os.environ.get("GITHUB_REF") or "refs/heads/main"  # the run's ref decides which cache it may write
    entries = {"include": matrix(recipes, ref)}
    session.out(_json.dumps(entries, sort_keys=True))
    if github_output:
        with Path(github_output).open("a") as out:
            out.write(f"matrix={_json.dumps(entries, sort_keys=True)}\n")
            recipes_json = _json.dumps(
                [{"name": r.name, "path": e} for r, e in zip(recipes, names, strict=True)]
            )
            out.write(f"recipes={recipes_json}\n")

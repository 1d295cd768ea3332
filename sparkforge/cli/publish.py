"""Invoke tasks for the registry side: push, publish, pull, ci.matrix. Thin: parse, call sparkforge.publish, print."""

from __future__ import annotations

import datetime as dt
import json as _json
from pathlib import Path

from invoke import Context

from sparkforge.cli import echo, session, task, user_errors
from sparkforge.errors import PublishError

RECIPE_HELP = "recipe name in recipes/ or path to a recipe file"
DIGESTS_HELP = "directory of digest records written by 'invoke push' (default: build/digests)"


def _write_json(path: str, data: object) -> None:
    if path:
        from sparkforge.boundary import write_output  # atomic, never through a symlink out of the project

        write_output(path, _json.dumps(data, indent=2, sort_keys=True) + "\n", "--json")
        echo(f"wrote {path}")


@task(
    help={
        "recipe": RECIPE_HELP,
        "platform": "linux/arm64 or linux/amd64 (default: the recipe's first platform)",
        "image": "local image to push (default: the recipe's verified candidate for the platform)",
        "metadata_file": "record the digest from this BuildKit metadata file ('invoke build --push-by-digest')",
        "digests": DIGESTS_HELP,
        "unverified": "push even though this image has no passed 'invoke verify' (loudly warned)",
        "allow_base_override": "push an image built on other base images than the recipe pins (test images)",
    }
)
@user_errors
def push(
    c: Context,
    recipe: str,
    platform: str = "",
    image: str = "",
    metadata_file: str = "",
    digests: str = "",
    unverified: bool = False,
    allow_base_override: bool = False,
) -> None:
    """Push one platform's image to the recipe's repository by digest and record it for 'invoke publish'."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry import publish as pub
    from sparkforge.registry.pushed import DIGESTS_DIR

    _check_platform(platform)  # the boundary: before the engine or the registry
    if image:
        from sparkforge.oci import check_reference

        check_reference("--image", image)
    options = pub.PushOptions(
        platform or None,
        image=image or None,
        metadata_file=Path(metadata_file) if metadata_file else None,
        digests_dir=Path(digests) if digests else DIGESTS_DIR,
        allow_unverified=unverified,
        allow_base_override=allow_base_override,
    )
    pub.push_image(session(stream=True), load_recipe(recipe), options)


@task(
    iterable=["digest"],
    help={
        "recipe": RECIPE_HELP,
        "digests": DIGESTS_HELP,
        "digest": "PLATFORM=sha256:... for one platform (repeatable; overrides the records)",
        "date": "date for {date} tags, YYYYMMDD (default: today, UTC)",
        "moving": "also move the moving tags (only when every platform image is GPU-verified)",
        "promote": "move the moving tags to this verified index digest (sha256:...) and do nothing else",
        "rollback": "move this moving tag back to the previous GPU-verified index in its history, nothing else",
        "json": "write the result (index digest, tags) here",
        "dry": "read the registry, print what would be written, write nothing",
        "unverified": "publish digests that have no passed verify record (loudly warned; never moves tags)",
        "allow_base_override": "publish images built on other base images than the recipe pins (test images)",
    },
)
@user_errors
def publish(
    c: Context,
    recipe: str,
    digests: str = "",
    digest: list[str] | None = None,
    date: str = "",
    moving: bool = False,
    promote: str = "",
    rollback: str = "",
    json: str = "",
    dry: bool = False,
    unverified: bool = False,
    allow_base_override: bool = False,
) -> None:
    """Merge every platform's digest into one multi-arch index under the immutable tags (all or nothing)."""
    from sparkforge.boundary import check_exclusive, check_output
    from sparkforge.oci import check_digest, check_tag
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry import publish as pub
    from sparkforge.registry.cosign import plan_digest
    from sparkforge.registry.pushed import DIGESTS_DIR, load_digests

    check_exclusive(
        rollback=rollback, promote=promote, digest=digest, moving=moving and (rollback or promote)
    )
    if rollback:
        check_tag("--rollback", rollback)  # the boundary: before the registry is contacted
        check_exclusive(rollback=rollback, date=date, digests=digests, unverified=unverified)
    if promote:
        check_digest("--promote", promote)
    check_output(json, "--json")
    loaded = load_recipe(recipe)
    when = None
    if date:
        try:
            when = dt.datetime.strptime(date, "%Y%m%d").date()
        except ValueError:
            raise PublishError(f"--date {date!r}: use YYYYMMDD, e.g. 20261129") from None
    one = session(stream=True, dry=dry)  # dry: every registry command printed, none run
    if rollback:
        from sparkforge.registry.rollback import roll_back

        result = roll_back(one, loaded, rollback)
    elif promote:
        result = pub.move_tags(one, loaded, promote, pub.PromoteOptions(when))
    else:
        found = load_digests(loaded, Path(digests) if digests else DIGESTS_DIR)
        for item in digest or []:
            platform, _, value = item.partition("=")
            if not value or not plan_digest(value):
                raise PublishError(
                    f"--digest {item!r}: use PLATFORM=sha256:<64 lowercase hex digits>, e.g. linux/arm64=sha256:..."
                )
            _check_platform(platform, "--digest")
            found[platform] = value
        options = pub.PublishOptions(when, moving, unverified, allow_base_override)
        result = pub.publish_index(one, loaded, found, options)
    _write_json(json, result.to_json())


def _check_platform(platform: str, option: str = "--platform") -> None:
    """A platform from the command line: one of the table in sparkforge/oci.py (empty: the default)."""
    from sparkforge import oci

    if platform and platform not in oci.PLATFORMS:
        raise PublishError(
            f"{option} {platform[:80]!r} is not a platform sparkforge builds; fix: use one of {', '.join(oci.PLATFORMS)}"
        )


def _check_pull_tag(tag: str) -> None:
    """`pull --tag`: an OCI tag or sha256:DIGEST (empty: the recipe's default)."""
    from sparkforge.recipe.plan import OCI_TAG
    from sparkforge.registry.cosign import plan_digest

    if tag and not (OCI_TAG.fullmatch(tag) or plan_digest(tag)):
        raise PublishError(
            f"--tag {tag[:80]!r} is neither a tag (letters, digits, _ . -, at most 128) nor sha256:<64 hex digits>; "
            "fix: pass one of the recipe's tags or a digest"
        )


@task(help={"recipe": RECIPE_HELP, "json": "write the listing (JSON) here"})
@user_errors
def images(c: Context, recipe: str, json: str = "") -> None:
    """The published images of a recipe from its signed TUF metadata: tags, digests, verdicts, GPU claims, dates."""
    from sparkforge.boundary import check_output
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry import tagtrust, tufclient

    check_output(json, "--json")
    loaded = load_recipe(recipe)
    state = tufclient.refresh(loaded.model.publish.repository, root_file=tufclient.root_file_of(loaded))
    rows = tagtrust.published(state)
    echo(f"{loaded.model.publish.repository}: signed TUF targets v{state.version}, {len(rows)} move(s)")
    for row in rows:
        now = "now " if row["names_now"] else "was "
        images_ = ", ".join(f"{p} {d[:19]}" for p, d in sorted(row["platforms"].items()))
        claims = sum(len(c) for c in row["claims"].values())
        echo(f"  {row['date'][:10]}  {now}{row['tag']:12} {row['index'][:19]}  {images_}  {row['verdict']}")
        if claims:
            echo(
                f"      {claims} signed GPU claim(s) pinned; pull: invoke pull --recipe {recipe} --tag {row['tag']}"
            )
    _write_json(
        json, {"repository": loaded.model.publish.repository, "version": state.version, "images": rows}
    )


@task(
    help={
        "recipe": RECIPE_HELP,
        "tag": "tag or sha256:DIGEST to pull (default: the recipe's first tag without {date})",
        "digest": "pull this earlier release (index or image sha256:...; 'invoke history' lists them), verified",
        "platform": "linux/arm64 or linux/amd64 (default: this machine's)",
        "allow_drift": "accept an image whose labels differ from the recipe, with a warning",
        "allow_unsigned": "accept an image without a valid signature, LOUDLY (never for moving tags)",
        "allow_unverified": "take an image without a signed GPU-verified claim for the platform (any path), LOUDLY: prints what is missing",
        "json": "write what was pulled (local image reference, drift) here",
    }
)
@user_errors
def pull(
    c: Context,
    recipe: str,
    tag: str = "",
    digest: str = "",
    platform: str = "",
    allow_drift: bool = False,
    allow_unsigned: bool = False,  # signing hook
    json: str = "",
    allow_unverified: bool = False,
) -> None:
    """Pull the recipe's published image and check its labels against the recipe's hash and pins.

    Every path (default tag, --tag, --digest, moving tags) needs a signed GPU-verified claim for the platform and
    an image the signed TUF metadata does not revoke; moving tags resolve through that metadata (docs/trust.md).
    """
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry.pull import PullOptions, pull_image

    _check_platform(platform)  # before the engine or the registry is contacted
    _check_pull_tag(tag)
    from sparkforge.boundary import check_output

    check_output(json, "--json")
    if digest and (tag or not digest.startswith("sha256:") or len(digest) != 71):
        raise PublishError(
            f"--digest {digest!r}: pass one sha256:<64 hex> digest and no --tag; fix: copy it from 'invoke history "
            f"--recipe {recipe}'"
        )
    loaded = load_recipe(recipe)
    options = PullOptions(
        digest or tag or None, platform or None, allow_drift, allow_unsigned, allow_unverified
    )
    result = pull_image(session(stream=True), loaded, options)
    echo(f"image: {result.image}")
    from sparkforge.registry import releases

    release = releases.pulled(loaded, result.image, result.reference if digest else "")
    for line in release["lines"]:
        echo(line)
    _write_json(json, {**result.to_json(), "release": release})


@task(
    iterable=["recipe"],
    help={
        "recipe": "recipe to include (repeatable; default: every recipe in recipes/)",
        "github_output": "append matrix=<json> and recipes=<json> to this file (GitHub's $GITHUB_OUTPUT)",
    },
)
@user_errors
def ci_matrix(c: Context, recipe: list[str] | None = None, github_output: str = "") -> None:
    """The GitHub Actions build matrix (recipe x platform, runner, qemu, cache) as JSON."""
    import os

    from sparkforge.recipe.loader import list_recipe_names, load_recipe
    from sparkforge.registry.matrix import ci_matrix as matrix

    names = list(recipe or []) or list_recipe_names()
    recipes = [load_recipe(name) for name in names]
    ref = os.environ.get("GITHUB_REF") or "refs/heads/main"  # the run's ref decides which cache it may write
    entries = {"include": matrix(recipes, ref)}
    echo(_json.dumps(entries, sort_keys=True))
    if github_output:
        with Path(github_output).open("a") as out:
            out.write(f"matrix={_json.dumps(entries, sort_keys=True)}\n")
            recipes_json = _json.dumps(
                [{"name": r.name, "path": e} for r, e in zip(recipes, names, strict=True)]
            )
            out.write(f"recipes={recipes_json}\n")

"""`export --realize`: what a recipe of the field pins, found for real: the image's digest (its registry, else the
local engine's record of a push or pull) and the model's hub commit (looked up online, or given).
"""

from __future__ import annotations

import re

from sparkforge import engine
from sparkforge.errors import EngineError, PublishError
from sparkforge.preflight.fetch import Fetcher, hub_url, make_fetcher
from sparkforge.recipe.community.formats import Format
from sparkforge.recipe.community.fromprofile import Pins, check_export, export_document, export_text
from sparkforge.recipe.loader import Recipe
from sparkforge.recipe.profile import Profile

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
COMMIT = re.compile(r"[0-9a-f]{40}")


def _repository(ref: str) -> str:
    """`host:port/name:tag` -> `host:port/name` (a port's colon is not a tag's)."""
    name = ref.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def pin_image(ref: str) -> str:
    """`ref` pinned as `repository@sha256:...`: the registry's digest, else a RepoDigest the engine recorded."""
    if "@" in ref:
        digest = ref.rsplit("@", 1)[1]
        if not DIGEST.fullmatch(digest):
            raise PublishError(
                f"--image {ref}: {digest!r} is not a sha256 digest; fix: REPOSITORY@sha256:<64 hex>"
            )
        return ref
    repository = _repository(ref)
    problems = []
    try:
        digest = engine.registry_digest(ref)
        if DIGEST.fullmatch(digest):
            return f"{repository}@{digest}"
        problems.append(f"the registry answered {digest!r}")
    except EngineError as exc:
        problems.append(f"its registry: {str(exc).split('; fix:')[0][:300]}")
    try:
        recorded = [
            d for d in engine.inspect_image(ref).get("RepoDigests") or [] if d.startswith(f"{repository}@")
        ]
    except EngineError as exc:
        recorded = []
        problems.append(f"the local engine: {str(exc).split('; fix:')[0][:200]}")
    if recorded:
        return sorted(recorded)[0]
    raise PublishError(
        f"--realize: no digest for {ref} ({'; '.join(problems) or 'the engine recorded none'}); an image that was "
        "never pushed has no registry digest to pin; fix: push it ('invoke push --recipe R'), or pass "
        "--image REPOSITORY@sha256:..."
    )


def model_revision_of(model: str, given: str, fetcher: Fetcher | None) -> str:
    """The model's hub commit: `given` (checked), else looked up on the hub (online)."""
    if given:
        if not COMMIT.fullmatch(given):
            raise PublishError(
                f"--model-revision {given!r} is not a commit (40 lowercase hex); a branch or tag moves; fix: pass "
                f"the commit, e.g. from 'huggingface-cli repo info {model}' or the model page's history"
            )
        return given
    if fetcher is None:
        raise PublishError(
            f"--realize pins the model by its hub commit, and this run is offline; fix: pass --model-revision "
            f"COMMIT for {model} (40 hex)"
        )
    url = f"{hub_url()}/api/models/{model}/revision/main"
    try:
        sha = str(fetcher.get_json(url, what=f"{model}'s hub revision").get("sha") or "")
    except Exception as exc:  # any failure to reach the hub gets the same fix
        raise PublishError(
            f"--realize: the Hugging Face hub did not answer for {model} ({str(exc)[:200]}); the model's revision "
            "cannot be looked up from here; fix: pass --model-revision COMMIT (40 hex) of the weights you serve"
        ) from None
    if not COMMIT.fullmatch(sha):
        raise PublishError(
            f"--realize: the hub answered no commit for {model}; fix: pass --model-revision COMMIT"
        )
    return sha


def export_community(
    profile: Profile,
    recipe: Recipe,
    fmt: Format,
    image: str,
    *,
    realize: bool = False,
    model_revision: str = "",
    trust_remote_code: bool = False,
) -> str:
    """The recipe text of `fmt` serving `profile` on `image`; realized: pinned by digest, commit and recipe hash.

    The text is read back as its format and imported again before it is returned (same profile, or an error).
    """
    pins = Pins(image, model_revision or None)
    if realize:
        hub = None if model_revision else make_fetcher(timeout=10, retries=0)
        revision = model_revision_of(profile.model.model, model_revision, hub)
        pins = Pins(pin_image(image), revision, recipe.name, recipe.hash)
    elif model_revision:
        model_revision_of(profile.model.model, model_revision, None)
    header = [
        f"Exported by sparkforge from profile {profile.name} and recipe {recipe.name} (recipe hash {recipe.hash})."
    ]
    if realize:
        header.append(f"Realized: image {pins.image}, model {profile.model.model} at {pins.model_revision}.")
    # The profile's opt-ins past the allow-list, visibly: whoever imports this recipe meets the same refusals
    # and opts in for themselves (import --allow ENTRY=REASON), having read what was reviewed here.
    header += [f"opt-in: {line.split(' opts in to ', 1)[1]}" for line in profile.opt_ins()]
    # The other repositories' pins (a recipe has no place for a drafter's or an adapter's commit): visible, so
    # whoever imports it writes them back under repositories: (import lists each, waiting for its commit).
    header += [f"pinned: {repo} at {commit}" for repo, commit in profile.model.repositories.items()]
    text = export_text(export_document(profile, fmt, pins, trust_remote_code=trust_remote_code), header)
    check_export(text, fmt, profile, pins)
    return text

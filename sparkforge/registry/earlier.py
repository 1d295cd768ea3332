"""An earlier release judged from any clone: by the recipe at the revision its signed provenance names (read
from git history) and the signed GPU claims in the registry, not by this checkout's recipe or local records.

A release built from an older recipe has another recipe hash; today's recipe would refuse its claims. The signed
provenance names the source revision and the recipe hash; the recipe file is read at that revision (`git
archive` of its folder), loaded, and its hash must be the provenance's before the claims are judged by it.
Patches are read from this checkout: a release whose patches changed since cannot be re-judged here (said so).
"""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

import yaml

from sparkforge.boundary import read_text, walk_tree, write_output
from sparkforge.commands import Command
from sparkforge.errors import InputError, SparkforgeError
from sparkforge.recipe.loader import REPO_ROOT, Recipe, load_recipe
from sparkforge.recipe.yamlfile import MAX_YAML_BYTES
from sparkforge.registry.cosign import PROVENANCE, VERIFY_CLAIM, Cosign, Policy
from sparkforge.registry.manifests import Manifests
from sparkforge.registry.trust import judge_claims


def recipe_at(recipe: Recipe, revision: str, want_hash: str, tools: Manifests) -> Recipe | None:
    """`recipe` as it was at `revision` when its hash there is `want_hash` (None when it cannot be loaded)."""
    if recipe.hash == want_hash:
        return recipe
    try:
        relative = Path(recipe.path).resolve().relative_to(REPO_ROOT)
    except ValueError:
        return None  # a recipe outside the repository has no git history here
    if not revision or not all(c in "0123456789abcdef" for c in revision):
        return None
    with tempfile.TemporaryDirectory(prefix="sparkforge-recipe-at-") as tmp:
        archive = Path(tmp) / "recipes.tar"
        argv = ("git", "-C", str(REPO_ROOT), "archive", "--format=tar", "-o", str(archive), revision)
        result = tools.runner.capture(
            Command((*argv, "--", str(relative.parent))), "git-archive-recipe", check=False
        )
        if result.returncode != 0:
            return None
        with tarfile.open(archive) as tar:
            tar.extractall(Path(tmp) / "tree", filter="data")
        for path in walk_tree(Path(tmp) / "tree", "git archive"):
            if path.suffix == ".yaml":
                _without_signing(path)  # who signs is today's rule, and no input of the recipe hash
        try:
            old = load_recipe(Path(tmp) / "tree" / relative)
        except SparkforgeError:
            return None
        return old if old.hash == want_hash else None


def _without_signing(path: Path) -> None:
    try:
        data = yaml.safe_load(read_text(path, "", MAX_YAML_BYTES))
    except (InputError, yaml.YAMLError):
        return
    if isinstance(data, dict) and isinstance(data.get("publish"), dict) and "signing" in data["publish"]:
        del data["publish"]["signing"]
        write_output(path, yaml.safe_dump(data, sort_keys=False), "git archive")


def signed_gpu_claim(recipe: Recipe, tools: Manifests, platform: str, digest: str) -> tuple[str, str]:
    """(why not GPU-verified or '', the sha256 of the deciding signed claim or '') for one platform image."""
    policy, verifier = Policy.of(recipe), Policy.for_verify(recipe)
    assert policy is not None and verifier is not None
    image = f"{recipe.model.publish.repository}@{digest}"
    cosign = Cosign(tools.runner)
    statements = cosign.attestations(image, policy, PROVENANCE).statements
    params = [
        s.predicate.get("buildDefinition", {}).get("externalParameters", {})
        for s in statements
        if digest in s.subjects
    ]
    mine = [p for p in params if p.get("platform") == platform]
    if not mine:
        return "no signed provenance for this platform", ""
    want, revision = str(mine[0].get("recipeHash")), str((mine[0].get("source") or {}).get("revision"))
    old = recipe_at(recipe, revision, want, tools)
    if old is None:
        return (
            f"its signed provenance names recipe hash {want[:12]} at revision {revision[:12]}, which this clone "
            "cannot load with that hash (fetch that revision, or its patches changed since)",
            "",
        )
    claims = cosign.attestations(image, verifier, VERIFY_CLAIM).statements
    judged = judge_claims(old, platform, digest, tools.config_digest(image), claims)
    return ("", judged.claim_digest) if judged.verdict.verified else (judged.reason, "")

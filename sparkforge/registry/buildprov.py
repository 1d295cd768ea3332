"""BuildKit's own SLSA provenance (`--provenance mode=max`, buildx builds): signed at publish, checked at pull.

A buildx build pushes its provenance with the image, as an attestation manifest in the image's index
(`vnd.docker.reference.type: attestation-manifest`). `invoke sign` re-attests that very predicate with cosign,
by the same identity as the image, on the platform digest. `pull` then requires that signed statement wherever
the index carries BuildKit's provenance, and that it names what the labels claim: the source revision (the
SPARKFORGE_REVISION build argument), the recipe hash (the label line of the Dockerfile mode=max records) and the
base images (its materials). Images built without buildx (Docker 20.10's embedded BuildKit makes no provenance)
carry only sparkforge's own signed provenance (registry/trust.py), which pull always requires.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkforge import engine
from sparkforge.boundary import parse_json
from sparkforge.context import Session
from sparkforge.errors import PublishError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import Recipe
from sparkforge.registry.cosign import Cosign, Policy, Signed, Signer, SigningError
from sparkforge.registry.ocidist import Registry

BUILDKIT_PROVENANCE = "https://slsa.dev/provenance/v0.2"
REVISION_ARG = "build-arg:SPARKFORGE_REVISION"
REVISION_LABEL = "org.opencontainers.image.revision"
HASH_LINE = re.compile(r'dev\.sparkforge\.recipe-hash="?([0-9a-f]{64})"?')
BUILDKIT_METADATA = "https://mobyproject.org/buildkit@v1#metadata"
MAX_STATEMENT = 16 << 20  # mode=max carries the LLB definition and the Dockerfile: well under this


@dataclass(frozen=True)
class BuildFacts:
    """What BuildKit's provenance says of one build."""

    revision: str  # the SPARKFORGE_REVISION build argument ("" when not given)
    recipe_hashes: tuple[str, ...]  # the recipe-hash label lines of the Dockerfile(s) it recorded
    bases: tuple[tuple[str, str], ...]  # materials: (image name as docker writes it, sha256:digest)


def facts_of(predicate: Mapping[str, Any]) -> BuildFacts:
    """The revision, recipe hashes and base images a SLSA v0.2 predicate of BuildKit names."""
    args = ((predicate.get("invocation") or {}).get("parameters") or {}).get("args") or {}
    metadata = (predicate.get("metadata") or {}).get(BUILDKIT_METADATA) or {}
    hashes: list[str] = []
    for info in (metadata.get("source") or {}).get("infos") or []:
        text = base64.b64decode(str(info.get("data", ""))).decode("utf-8", "replace")
        hashes += [h for h in HASH_LINE.findall(text) if h not in hashes]
    bases = []
    for material in predicate.get("materials") or []:
        uri, digest = str(material.get("uri", "")), (material.get("digest") or {}).get("sha256")
        if uri.startswith("pkg:docker/") and digest:
            bases.append((_material_ref(uri), f"sha256:{digest}"))
    return BuildFacts(str(args.get(REVISION_ARG, "")), tuple(hashes), tuple(bases))


def _material_ref(uri: str) -> str:
    """`pkg:docker/NAME@TAG?...` or `pkg:docker/NAME?digest=sha256:...` as docker writes the reference."""
    path, _, query = uri[len("pkg:docker/") :].partition("?")
    path = urllib.parse.unquote(path)
    name, _, version = path.rpartition("@") if "@" in path else (path, "", "")
    version = version or (urllib.parse.parse_qs(query).get("digest") or [""])[0]
    return f"{name}@{version}" if version.startswith("sha256:") else f"{name}:{version}" if version else name


def label_problems(facts: BuildFacts, labels: Mapping[str, str]) -> list[str]:
    """Where BuildKit's provenance and the image's labels disagree: revision, recipe hash, base images."""
    problems = []
    if facts.revision != labels.get(REVISION_LABEL):
        problems.append(
            f"it names source revision {facts.revision or '(none)'}, the label {REVISION_LABEL} says "
            f"{labels.get(REVISION_LABEL)}"
        )
    claimed = labels.get(f"{plan.LABEL_PREFIX}.recipe-hash", "")
    if claimed not in facts.recipe_hashes:
        seen = ", ".join(h[:12] for h in facts.recipe_hashes) or "none"
        problems.append(f"its Dockerfile carries recipe hash {seen}, the label says {claimed[:12]}")
    digests = {d for _, d in facts.bases}
    names = {n for n, _ in facts.bases}
    for stage, label in sorted(plan.BASE_LABELS.items()):
        base = labels.get(label, "")
        pinned = base.rpartition("@")[2] if "@sha256:" in base else ""
        if base and not (pinned in digests if pinned else base in names):
            problems.append(
                f"the {stage} base {base} is not among the images it was built from "
                f"({', '.join(f'{n} {d[:19]}' for n, d in facts.bases) or 'none'})"
            )
    return problems


def registry_statement(registry: Registry, top: str, digest: str) -> dict[str, Any] | None:
    """BuildKit's provenance statement for platform image `digest` in the index `top` (None: it has none)."""
    found = registry.manifest(top)
    index = parse_json(found[0].decode("utf-8", "replace"), f"{registry.repository}@{top}") if found else {}
    for entry in index.get("manifests") or []:
        notes = entry.get("annotations") or {}
        if notes.get("vnd.docker.reference.type") != "attestation-manifest":
            continue
        if notes.get("vnd.docker.reference.digest") != digest:
            continue
        got = registry.manifest(str(entry["digest"]))
        where = f"{registry.repository}@{entry['digest']}"
        manifest = parse_json(got[0].decode("utf-8", "replace"), where) if got else {}
        for layer in manifest.get("layers") or []:
            if (layer.get("annotations") or {}).get("in-toto.io/predicate-type") == BUILDKIT_PROVENANCE:
                blob = registry.blob(str(layer["digest"]), MAX_STATEMENT).decode("utf-8", "replace")
                statement = parse_json(blob, f"BuildKit's provenance beside {digest}")
                subjects = {f"sha256:{s['digest'].get('sha256')}" for s in statement.get("subject") or []}
                if digest not in subjects:
                    raise PublishError(
                        f"BuildKit's provenance beside {digest[:19]} is about {subjects}, not it"
                    )
                return dict(statement)
    return None


def attest_published(
    recipe: Recipe, index: str, platforms: Mapping[str, str], cosign: Cosign, signer: Signer
) -> list[Signed]:
    """The publish job's step: sign BuildKit's provenance of each platform image where the index carries one."""
    repo = recipe.model.publish.repository
    registry = Registry(repo)
    done = []
    for _, digest in sorted(platforms.items()):
        statement = registry_statement(registry, index, digest)
        if statement is None:
            continue  # built without buildx: sparkforge's own provenance (cosign.sign_published) stands alone
        cosign.attest(f"{repo}@{digest}", BUILDKIT_PROVENANCE, statement["predicate"], signer)
        done.append(Signed(f"{repo}@{digest}", BUILDKIT_PROVENANCE))
    return done


def check_pulled(session: Session, recipe: Recipe, pulled: PulledImage, allow_unverified: bool) -> None:
    """After the download, before any tag: BuildKit's provenance, where the index has it, is signed by the
    recipe's signer and names the revision, recipe hash and bases the labels claim. A refusal removes the image."""
    if pulled.unsigned:
        return
    repo = recipe.model.publish.repository
    policy = Policy.of(recipe)
    assert policy is not None
    ref = f"{repo}@{pulled.digest}"
    in_index = registry_statement(Registry(repo), pulled.top, pulled.digest) is not None
    found = Cosign(session.runner).attestations(ref, policy, BUILDKIT_PROVENANCE)
    signed = [s for s in found.statements if pulled.digest in s.subjects]
    if not signed and not in_index:
        session.echo(
            f"sparkforge: {ref}: no BuildKit provenance (built without buildx); sparkforge's own checked"
        )
        return
    labels = engine.image_labels(ref)
    problems = (
        [f"its index carries BuildKit's provenance, but none signed by {policy.describe()} ({found.reason})"]
        if not signed
        else [
            f"its signed BuildKit provenance: {p}"
            for s in signed
            for p in label_problems(facts_of(s.predicate), labels)
        ]
    )
    if not problems:
        session.echo(
            f"sparkforge: {ref}: BuildKit's provenance signed by {policy.describe()} names the labels' revision, "
            "recipe hash and base images"
        )
        return
    if allow_unverified:
        session.warn(
            f"sparkforge: WARNING (--allow-unverified): {ref} has NO VERIFIED BUILD PROVENANCE: "
            + "; ".join(problems)
        )
        return
    engine.remove_image(ref)
    raise SigningError(
        f"refusing {ref}: "
        + "; ".join(problems)
        + "; the pulled image was removed. Nothing was tagged. Fix: pull "
        "an image whose publish job signed its provenance ('invoke sign'), or pass --allow-unverified, loudly"
    )


@dataclass(frozen=True)
class PulledImage:
    """The platform image pull is checking: its digest, what the reference named, and whether it is unsigned."""

    digest: str
    top: str
    unsigned: bool

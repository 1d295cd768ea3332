"""Signatures and in-toto attestations of published images, through stock cosign (no crypto of our own).

Two ways to sign, chosen by the recipe's `publish.signing`: a cosign key pair (the public key is a file in
the repository; signing needs the private key and COSIGN_PASSWORD) or keyless (the CI job's OIDC identity,
certified by Sigstore's Fulcio and logged in Rekor). Key signatures are not uploaded to a transparency log
and are verified without one (`--tlog-upload=false`, `--insecure-ignore-tlog=true`): the key is the trust.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkforge.boundary import parse_json, write_output
from sparkforge.commands import Command, Result, Runner
from sparkforge.errors import CommandError, PublishError
from sparkforge.recipe import plan
from sparkforge.recipe.identity import MAIN, TRIGGERS, Identity, parse_identity
from sparkforge.recipe.loader import REPO_ROOT, Recipe

PROVENANCE = "https://slsa.dev/provenance/v1"
VERIFY_CLAIM = "https://sparkforge.dev/attestations/verify/v1"
KERNELS_CLAIM = "https://sparkforge.dev/attestations/kernels/v1"  # sparkforge.registry.releases
BUILD_TYPE = "https://sparkforge.dev/build/v1"
KEY_ENV = "SPARKFORGE_SIGNING_KEY"  # path (or cosign key URI) of the private key; unset means keyless


class SigningError(PublishError):
    """A signature or attestation is missing, made by someone else, or says something else."""


# ---- who signs, and who is trusted -------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """Whose signatures `pull` accepts for a recipe: one public key, or one keyless allow-list (identity.py)."""

    key: Path | None = None
    identity: str | None = None  # the recipe's text; cosign gets the parsed allow-list (`allowed`)
    issuer: str | None = None
    allowed: Identity | None = None

    @classmethod
    def of(cls, recipe: Recipe, *, verify: bool = False) -> Policy | None:
        """Whose image signatures count (the recipe signs with exactly one of a key or keyless); `verify`: whose
        GPU verify attestations count (`verify_key`, else the key; keyless: `verify_identity`, its own job)."""
        signing = recipe.model.publish.signing
        if signing is None:
            return None
        if signing.keyless is not None:
            identity = signing.keyless.verify_identity if verify else signing.keyless.identity
            allowed = parse_identity(identity, verify=verify)
            return cls(identity=identity, issuer=signing.keyless.issuer, allowed=allowed)
        key = Path((signing.verify_key if verify else None) or str(signing.key))
        return cls(key=key if key.is_absolute() else REPO_ROOT / key)

    @classmethod
    def for_verify(cls, recipe: Recipe) -> Policy | None:
        return cls.of(recipe, verify=True)

    def describe(self) -> str:
        if self.key:
            return f"key {self.key}"
        assert self.allowed is not None
        return (
            f"keyless identity {self.allowed.regexp()} of repository {self.allowed.repository} (issuer "
            f"{self.issuer})"
        )

    def verify_argsets(self) -> list[tuple[str, ...]]:
        """cosign's flags, one set per allowed (ref, trigger): a signature passes when any set accepts it.

        Keyless pins the certificate's workflow repository (a caller in another repository gets certificates
        naming our reusable workflow, never our repository), the trigger, and for main the exact ref.
        """
        if self.key is not None:
            if not self.key.is_file():
                raise SigningError(
                    f"the recipe's publish.signing.key {self.key} does not exist; fix: commit the cosign public "
                    "key there (cosign generate-key-pair writes cosign.pub)"
                )
            return [("--key", str(self.key), "--insecure-ignore-tlog=true")]
        assert self.allowed is not None and self.issuer
        out = []
        for ref in self.allowed.refs:
            for trigger in TRIGGERS[ref]:
                flags = ("--certificate-identity-regexp", self.allowed.regexp(ref))
                flags += ("--certificate-oidc-issuer", self.issuer)
                flags += ("--certificate-github-workflow-repository", self.allowed.repository)
                flags += ("--certificate-github-workflow-trigger", trigger)
                out.append(flags + (("--certificate-github-workflow-ref", ref) if ref == MAIN else ()))
        return out


@dataclass(frozen=True)
class Signer:
    """How this process signs: a private key (COSIGN_PASSWORD from the environment), or keyless (CI OIDC)."""

    key: str | None

    @classmethod
    def from_env(cls, key: str = "") -> Signer:
        return cls(key or os.environ.get(KEY_ENV) or None)

    def sign_args(self) -> tuple[str, ...]:
        # Keyless needs the public log (short-lived certificates); a key signature stays off it.
        return ("--key", self.key, "--tlog-upload=false") if self.key else ()

    def describe(self) -> str:
        return f"key {self.key}" if self.key else "keyless (this job's OIDC identity)"


# ---- what is attested --------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where an image came from: the project's repository, the commit, and the build run."""

    repository: str
    revision: str
    builder: str
    invocation: str

    @classmethod
    def detect(cls, runner: Runner, local: str = "") -> Source:
        """From GitHub Actions' environment in CI, else this checkout (git) and `local` (the recipe's source
        repository, default the project's URL)."""
        env = os.environ
        if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_SHA"):
            server = env.get("GITHUB_SERVER_URL", "https://github.com")
            repo = f"{server}/{env.get('GITHUB_REPOSITORY', '')}"
            workflow = env.get("GITHUB_WORKFLOW_REF", "").split("@", 1)[0]
            return cls(
                repo,
                env["GITHUB_SHA"],
                f"{server}/{workflow}" if workflow else repo,
                f"{repo}/actions/runs/{env.get('GITHUB_RUN_ID', '')}",
            )
        head = runner.capture(Command.of("git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"), "git-revision")
        return cls(local or plan.PROJECT_SOURCE, head.output.strip(), "sparkforge-local", "")


def source_of(recipe: Recipe) -> str:
    """The source repository a recipe's images are built from (and pull requires in the signed provenance):
    publish.signing.source, else sparkforge's own."""
    signing = recipe.model.publish.signing
    return (signing.source if signing and signing.source else None) or plan.PROJECT_SOURCE


def provenance(recipe: Recipe, platform: str, source: Source) -> dict[str, Any]:
    """A SLSA v1 provenance predicate naming the recipe (and its hash), the platform and the source commit."""
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "recipe": recipe.name,
                "recipeHash": recipe.hash,
                "platform": platform,
                "source": {"repository": source.repository, "revision": source.revision},
            },
            "resolvedDependencies": [
                {"uri": f"git+{source.repository}", "digest": {"gitCommit": source.revision}}
            ],
        },
        "runDetails": {"builder": {"id": source.builder}, "metadata": {"invocationId": source.invocation}},
    }


def verify_claim(recipe: Recipe, report: Mapping[str, Any]) -> dict[str, Any]:
    """The verify-report predicate: what the report itself says (recipe hash, suite hash, image ID, the GPU the
    host passed in), stamped with the time it is signed (pull lets the newest claim win)."""
    if report.get("command") != "verify" or report.get("recipe") != recipe.name:
        raise SigningError(
            f"the report is a {report.get('command')!r} report of recipe {report.get('recipe')!r}, not a verify "
            f"report of {recipe.name}; fix: pass the --report that 'invoke verify --recipe {recipe.name}' wrote"
        )
    if report.get("recipe_hash") != recipe.hash:
        raise SigningError(
            f"the report verified recipe hash {str(report.get('recipe_hash'))[:12]}, not {recipe.name}'s "
            f"{recipe.hash[:12]}; fix: verify the image with this recipe, then attest that report"
        )
    gpus = report.get("gpus") or {}
    gpu = report.get("gpu") or {}
    return {
        "recipe": recipe.name,
        "recipeHash": report.get("recipe_hash"),
        "platform": report.get("platform"),
        "status": report.get("status"),
        "imageId": report.get("image_id"),
        "gpu": {
            "used": gpus.get("used") is True,
            "why": gpus.get("why", ""),
            "name": gpu.get("name"),
            "capability": gpu.get("capability"),
            "driver": gpu.get("driver"),
            "devices": [str(gpu["name"])] if gpu.get("name") else [],
        },
        "suiteHash": (report.get("suite") or {}).get("sha256"),
        "attestedAt": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "checks": [{"name": c.get("name"), "status": c.get("status")} for c in report.get("checks", [])],
        "report": dict(report),
    }


# ---- cosign -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    """One verified in-toto statement attached to an image digest."""

    predicate_type: str
    subjects: tuple[str, ...]  # sha256:... digests the statement is about
    predicate: dict[str, Any]
    digest: str = ""  # sha256 (hex) of the statement's bytes: what the TUF targets pin a claim by
    payload: str = ""  # the DSSE payload as cosign printed it (base64), to find its bundle in the registry


@dataclass(frozen=True)
class Verdict:
    """A cosign verification: ok, or the reason it failed (cosign's own words)."""

    ok: bool
    reason: str = ""
    statements: tuple[Statement, ...] = ()


@dataclass(frozen=True)
class Cosign:
    """cosign through the command seam; every reference given to it is repository@sha256:digest."""

    runner: Runner
    binary: str = "cosign"

    def sign(self, ref: str, signer: Signer) -> None:
        argv = (self.binary, "sign", "--yes", *signer.sign_args(), ref)
        self.runner.run(Command(argv), "cosign-sign", quiet=True)

    def attest(self, ref: str, predicate_type: str, predicate: Mapping[str, Any], signer: Signer) -> None:
        if self.runner.log_dir is not None:  # kept beside the step's log and replay script
            self._attest(self.runner.log_dir, ref, predicate_type, predicate, signer)
            return
        with tempfile.TemporaryDirectory(prefix="sparkforge-attest-") as tmp:
            self._attest(Path(tmp), ref, predicate_type, predicate, signer)

    def _attest(
        self, folder: Path, ref: str, predicate_type: str, predicate: Mapping[str, Any], signer: Signer
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        path = (
            folder / f"predicate-{hashlib.sha256(ref.encode()).hexdigest()[:12]}-{_slug(predicate_type)}.json"
        )
        write_output(path, json.dumps(predicate, indent=2, sort_keys=True) + "\n", "cosign's predicate")
        argv = (self.binary, "attest", "--yes", *signer.sign_args(), "--type", predicate_type)
        self.runner.run(Command((*argv, "--predicate", str(path), ref)), "cosign-attest", quiet=True)

    def _capture(self, argv: tuple[str, ...], step: str) -> Result:
        try:
            return self.runner.capture(Command(argv), step, check=False)
        except CommandError:
            raise SigningError(
                f"{self.binary} is not installed, so no signature can be checked; fix: 'invoke sign.install' "
                "(Debian trixie's cosign 2.5) or install cosign 2.x from sigstore.dev"
            ) from None

    def verify(self, ref: str, policy: Policy, extra: Sequence[str] = ()) -> Verdict:
        reason = ""
        for flags in policy.verify_argsets():
            argv = (self.binary, "verify", *flags, *extra, "--output", "json", ref)
            result = self._capture(argv, "cosign-verify")
            if result.returncode == 0:
                return Verdict(True)
            reason = _cosign_error(result.output)
        return Verdict(False, reason)

    def attestations(self, ref: str, policy: Policy, predicate_type: str) -> Verdict:
        """The statements of `predicate_type` on `ref` that `policy` accepts (a union over its flag sets)."""
        found: list[Statement] = []
        reason = ""
        for flags in policy.verify_argsets():
            argv = (self.binary, "verify-attestation", *flags, "--type", predicate_type, ref)
            result = self._capture(argv, "cosign-verify-attestation")
            if result.returncode != 0:
                reason = _cosign_error(result.output)
                continue
            found += [s for s in _statements(result.output, predicate_type) if s not in found]
        return Verdict(True, statements=tuple(found)) if found else Verdict(False, reason)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.rsplit("/", 2)[-2])


def _cosign_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip().startswith(("Error:", "error"))]
    return (lines[0] if lines else output.strip()[-300:]).removeprefix("Error: ")


def _statements(output: str, predicate_type: str) -> list[Statement]:
    """The in-toto statements inside cosign's DSSE envelopes (one JSON document per line)."""
    out = []
    for line in output.splitlines():
        if not line.startswith("{"):
            continue
        envelope = parse_json(line, "cosign's DSSE envelope")
        raw = base64.b64decode(envelope["payload"])
        statement = parse_json(raw.decode("utf-8", "replace"), "the envelope's in-toto statement")
        if statement.get("predicateType") != predicate_type:
            continue
        subjects = tuple(
            f"sha256:{s['digest']['sha256']}" for s in statement.get("subject", []) if "sha256" in s["digest"]
        )
        predicate = dict(statement.get("predicate") or {})
        out.append(
            Statement(
                predicate_type, subjects, predicate, hashlib.sha256(raw).hexdigest(), envelope["payload"]
            )
        )
    return out


# ---- the two signing steps of the workflow ------------------------------------------------------


@dataclass(frozen=True)
class Signed:
    reference: str
    what: str  # "index", "image", or a predicate type


def sign_published(
    recipe: Recipe,
    index: str,
    platforms: Mapping[str, str],
    cosign: Cosign,
    signer: Signer,
    source: Source | None = None,
) -> list[Signed]:
    """Sign every platform digest and the index; attest each platform's provenance (same signer)."""
    repo = recipe.model.publish.repository
    if not plan_digest(index) or not all(isinstance(d, str) and plan_digest(d) for d in platforms.values()):
        raise SigningError(
            f"refusing to sign {repo}@{index!r:.80}: digests must be sha256:<64 hex>; fix: sign what 'invoke publish' wrote"
        )
    plan_platforms = set(recipe.model.platforms)
    if set(platforms) != plan_platforms:
        raise SigningError(
            f"refusing to sign {repo}@{index}: it has {', '.join(sorted(platforms)) or 'no platforms'}, the "
            f"recipe builds {', '.join(sorted(plan_platforms))}; fix: sign what 'invoke publish' wrote"
        )
    source = source or Source.detect(cosign.runner, source_of(recipe))
    done = []
    for platform, digest in sorted(platforms.items()):
        ref = f"{repo}@{digest}"
        cosign.sign(ref, signer)
        cosign.attest(ref, PROVENANCE, provenance(recipe, platform, source), signer)
        done += [Signed(ref, "image"), Signed(ref, PROVENANCE)]
    cosign.sign(f"{repo}@{index}", signer)
    done.append(Signed(f"{repo}@{index}", "index"))
    return done


def plan_digest(text: str) -> bool:
    return len(text) == 71 and text.startswith("sha256:") and all(c in "0123456789abcdef" for c in text[7:])

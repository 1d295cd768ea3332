"""Signed images for real, offline: cosign key pairs made here, the local registry, no transparency log.

Smoke images (the template's quick 'base' stage of tests/recipes/smoke-multiarch.yaml) for amd64 and arm64
(QEMU) are pushed, merged, then signed and attested by running the images workflow's own `invoke sign` and
`invoke sign.attest` steps (with a key instead of the CI job's keyless identity). `pull` must accept them and
refuse: an unsigned image, another key's signature, a tag re-pushed with other content, provenance for another
recipe hash, and a moving tag without a GPU-verified attestation. About 60 s warm (bases and layers cached).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sparkforge import engine
from sparkforge.build.hostsetup import base_image_name
from sparkforge.build.pipeline import build
from sparkforge.build.stage import BuildOptions
from sparkforge.commands import Runner
from sparkforge.engine import Engine, detect_engine
from sparkforge.errors import EngineError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe, load_recipe
from sparkforge.registry import publish as pub
from sparkforge.registry import pull as pulling
from sparkforge.registry.cosign import PROVENANCE, Cosign, Signer, SigningError, Source, provenance
from sparkforge.registry.manifests import Manifests
from sparkforge.registry.trust import attestation_check
from sparkforge.report import Check, Report
from sparkforge.verify.suite import verify_image

try:
    from .registry import LocalRegistry, local_registry, unavailable_reason
except ImportError:
    from registry import LocalRegistry, local_registry, unavailable_reason  # type: ignore[no-redef]

pytestmark = pytest.mark.engine
SMOKE = REPO_ROOT / "tests" / "recipes" / "smoke-multiarch.yaml"
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "images.yml"
PLATFORMS = ("linux/amd64", "linux/arm64")
DAY = dt.date(2026, 11, 30)
PASSWORD = "sparkforge-test-key-password"
QUIET = {"echo": lambda _: None, "warn": lambda _: None}


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("SPARKFORGE_REQUIRE_ENGINE") == "1":
        pytest.fail(f"SPARKFORGE_REQUIRE_ENGINE=1 but {reason}")
    pytest.skip(reason)


def workflow_step(name_part: str) -> dict:
    """The images workflow's step whose name contains `name_part` (the tests run its `run` line)."""
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    steps = [s for job in jobs.values() for s in job["steps"] if name_part in s.get("name", "")]
    assert len(steps) == 1, f"{name_part!r} names {len(steps)} steps in {WORKFLOW}"
    return steps[0]


def _keypair(folder: Path) -> Path:
    folder.mkdir(parents=True)
    env = {**os.environ, "COSIGN_PASSWORD": PASSWORD}
    subprocess.run(["cosign", "generate-key-pair"], cwd=folder, env=env, check=True, capture_output=True)
    return folder


@dataclass(frozen=True)
class Signed:
    recipe: Recipe
    registry: LocalRegistry
    eng: Engine
    runner: Runner
    keys: Path
    other_keys: Path
    candidates: dict[str, str]
    published: pub.Published
    name: str  # the NAME the workflow steps see

    def run_step(self, name_part: str, **env: str) -> subprocess.CompletedProcess[str]:
        """Run a workflow step's `run` with bash, as the runner would, signing with the test key."""
        step = workflow_step(name_part)
        full = {
            **os.environ,
            **{k: v for k, v in (step.get("env") or {}).items() if "${{" not in str(v)},
            "RECIPE": str(self.recipe.path),
            "NAME": self.name,
            "PYTHONPATH": str(REPO_ROOT),
            "SPARKFORGE_SIGNING_KEY": str(self.keys / "cosign.key"),
            "COSIGN_PASSWORD": PASSWORD,
            **env,
        }
        return subprocess.run(
            ["bash", "-e", "-c", step["run"].replace("python ", f"{sys.executable} ")],
            cwd=REPO_ROOT,
            env=full,
            capture_output=True,
            text=True,
        )

    def cosign(self) -> Cosign:
        return Cosign(self.runner)

    def manifests(self) -> Manifests:
        return Manifests(self.eng, self.runner, self.recipe.model.publish.repository)


def _recipe(folder: Path, registry: LocalRegistry, key: Path, **pins: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        f"extends: {SMOKE}",
        "publish:",
        f"  repository: {registry.host}/sparkforge/signed",
        "  signing:",
        f"    key: {key}",
    ]
    if pins:
        lines.append("components:")
        lines += [x for c, v in pins.items() for x in (f"  {c}:", f"    version: {v}")]
    path = folder / "smoke-signed.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def signed(base_amd64: str, base_arm64: str, tmp_path_factory: pytest.TempPathFactory):
    """Both platforms built, pushed and merged, then signed by the workflow's sign step."""
    for reason in (
        unavailable_reason(),
        None if _has("cosign") else "cosign is not installed (invoke sign.install)",
    ):
        if reason:
            _skip_or_fail(reason)
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if not entry.exists() or "enabled" not in entry.read_text():
        _skip_or_fail("qemu-aarch64 binfmt is not registered; run 'invoke engine.up --qemu'")
    tmp = tmp_path_factory.mktemp("signing")
    keys, other = _keypair(tmp / "keys"), _keypair(tmp / "other-keys")
    name = f"signing-test-{os.getpid()}"
    published_json = REPO_ROOT / "build" / "published" / f"{name}.json"
    with local_registry(tmp / "registry") as registry:
        recipe = load_recipe(_recipe(tmp / "recipe", registry, keys / "cosign.pub"))
        eng, runner = detect_engine(), Runner(log_dir=tmp / "logs", stream=False)
        bases = {"linux/amd64": base_amd64, "linux/arm64": base_arm64}
        candidates: dict[str, str] = {}
        built: list[str] = []
        try:
            digests = {}
            for platform in PLATFORMS:
                options = BuildOptions(
                    preflight=False,
                    platform=platform,
                    target="base",
                    base_image=bases[platform],
                    verify=False,
                    log_root=tmp / "build",
                )
                base = build(recipe, options, echo=lambda _: None).candidate
                built.append(base)
                candidates[platform] = _with_revision(
                    base, platform, f"sparkforge-test/signing-{platform[6:]}", tmp
                )
                pushed = pub.push(
                    recipe,
                    platform,
                    image=candidates[platform],
                    digests_dir=None,
                    runner=runner,
                    eng=eng,
                    allow_unverified=True,
                    allow_base_override=True,
                    echo=lambda _: None,
                )
                digests[platform] = pushed.digest
            # Smoke base stages on offline bases: nothing to verify, so published explicitly unverified.
            published = pub.publish(
                recipe,
                digests,
                when=DAY,
                runner=runner,
                eng=eng,
                echo=lambda _: None,
                allow_unverified=True,
                allow_base_override=True,
            )
            published_json.parent.mkdir(parents=True, exist_ok=True)
            published_json.write_text(json.dumps(published.to_json()))
            state = Signed(recipe, registry, eng, runner, keys, other, candidates, published, name)
            result = state.run_step("Sign every platform image")
            assert result.returncode == 0, result.stdout + result.stderr
            yield state
        finally:
            published_json.unlink(missing_ok=True)
            repo = recipe.model.publish.repository
            refs = [*built, *candidates.values(), *(f"{repo}@{d}" for d in digests.values())]
            refs += [f"{repo}:{recipe.hash[:12]}-{p.split('/')[1]}" for p in PLATFORMS]
            refs += [*plan.final_tags(recipe, DAY).all, f"{repo}:stable-copy", f"{repo}:unsigned"]
            for ref in refs:
                engine.remove_image(ref)


def _head() -> str:
    argv = ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"]
    return subprocess.run(argv, capture_output=True, text=True).stdout.strip()


def _docker_build(dockerfile: str, platform: str, tag: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Dockerfile").write_text(dockerfile)
    env = {"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"}
    argv = ["/usr/bin/docker", "build", "-q", "--platform", platform, "-t", tag, str(folder)]
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-1500:]


def _with_revision(image: str, platform: str, tag: str, tmp: Path, revision: str = "") -> str:
    """The base stage with the labels the runtime stage adds at build time (revision = this checkout's HEAD)."""
    label = f"LABEL org.opencontainers.image.revision={revision or _head()}\n"
    _docker_build(f"FROM {image}\n{label}", platform, tag, tmp / tag.replace("/", "-"))
    return tag


def _has(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None


def _rebuilt(signed: Signed, tmp_path: Path, tag: str, revision: str = "") -> str:
    """The amd64 smoke image with other bytes (same labels), pushed under `tag`; returns its digest."""
    ref = f"{signed.recipe.model.publish.repository}:{tag}"
    extra = f"LABEL org.opencontainers.image.revision={revision}\n" if revision else ""
    # From the registry by digest: a local tag may be gone (other sessions clean sparkforge-test/ images).
    source = f"{signed.recipe.model.publish.repository}@{signed.published.platforms['linux/amd64']}"
    dockerfile = f"FROM {source}\nLABEL rebuilt={tag}\n{extra}"
    _docker_build(dockerfile, "linux/amd64", ref, tmp_path / tag)
    output = subprocess.run(
        ["/usr/bin/docker", "push", ref], check=True, capture_output=True, text=True
    ).stdout
    engine.remove_image(ref)
    return re.findall(r"digest: (sha256:[0-9a-f]{64})", output)[-1]


def _pull(signed: Signed, tag: str | None = None, platform: str = "linux/amd64", **kw) -> pulling.Pulled:
    return pulling.pull(
        signed.recipe, tag, platform=platform, runner=signed.runner, eng=signed.eng, **QUIET, **kw
    )


def _verify_report(signed: Signed, image: str, platform: str, gpu: bool, path: Path) -> Path:
    """A verify report as the GPU job writes it; the GPU itself is what cannot exist here (mocked: `gpus`)."""
    report = Report(command="verify", subject=image, recipe=signed.recipe.name)
    report.add(Check("labels", "passed", "recipe hash and pins match"))
    report.add(Check("fp8-gemm", "passed" if gpu else "skipped", "", {"gpu": "NVIDIA GB10"} if gpu else {}))
    report.extra["gpus"] = {"used": gpu, "why": "GPU runtime present" if gpu else "no NVIDIA runtime"}
    report.extra["platform"] = platform
    path.parent.mkdir(parents=True, exist_ok=True)
    report.write_json(path)
    return path


# ---- the round trip ----------------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
def test_pull_verifies_signature_and_provenance_for_each_platform(signed: Signed, platform: str) -> None:
    pulled = _pull(signed, platform=platform)
    assert pulled.image == f"{signed.recipe.model.publish.repository}@{signed.published.platforms[platform]}"
    assert pulled.trust["unsigned"] is False and str(signed.keys / "cosign.pub") in pulled.trust["signer"]
    assert pulled.trust["top"] == signed.published.index
    assert pulled.trust["repository"] == plan.PROJECT_SOURCE
    assert pulled.trust["revision"] == engine.image_labels(pulled.image)["org.opencontainers.image.revision"]
    assert engine.image_platform(pulled.image) == platform


def test_verify_reports_the_attestation_the_pulled_image_carried(signed: Signed, tmp_path: Path) -> None:
    pulled = _pull(signed, platform="linux/arm64")
    report = _verify_report(
        signed, pulled.image, "linux/arm64", True, REPO_ROOT / "reports" / f"{signed.name}-verify.json"
    )
    try:
        result = signed.run_step("Attest the GPU verify report", IMAGE=pulled.image)
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        report.unlink()
    found = verify_image(signed.recipe, pulled.image, gpus="none", kernels=False, carried=attestation_check)
    check = next(c for c in found.checks if c.name == "attestation")
    assert check.status == "passed", check.reason
    assert "GPU-verified on linux/arm64 (NVIDIA GB10)" in check.reason
    assert check.details["provenance"][0]["recipeHash"] == signed.recipe.hash
    other = attestation_check(signed.recipe, base_image_name("linux/amd64"))  # never in the registry
    assert other.status == "skipped"


# ---- refusals ----------------------------------------------------------------------------------


def test_refuses_an_unsigned_image_unless_allowed_loudly(signed: Signed, tmp_path: Path) -> None:
    digest = _rebuilt(signed, tmp_path, "unsigned")
    with pytest.raises(SigningError, match=rf"@{digest} has no valid signature by key .*no signatures found"):
        _pull(signed, "unsigned")
    cli = subprocess.run(  # the task: one paragraph, non-zero, no traceback
        [sys.executable, "-m", "invoke", "pull", "--recipe", str(signed.recipe.path), "--tag", "unsigned"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 1 and "Traceback" not in cli.stderr
    assert cli.stderr.startswith("sparkforge: refusing") and cli.stderr.strip().count("\n") == 0
    assert "--allow-unsigned" in cli.stderr
    warnings: list[str] = []
    pulled = pulling.pull(
        signed.recipe,
        "unsigned",
        platform="linux/amd64",
        runner=signed.runner,
        eng=signed.eng,
        echo=lambda _: None,
        warn=warnings.append,
        allow_unsigned=True,
    )
    assert pulled.trust["unsigned"] is True and "NOT VERIFIED" in warnings[0]
    engine.remove_image(pulled.image)


def test_refuses_a_signature_by_another_key(signed: Signed, tmp_path: Path) -> None:
    digest = _rebuilt(signed, tmp_path, "other-key")
    ref = f"{signed.recipe.model.publish.repository}@{digest}"
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    signed.cosign().sign(ref, Signer(str(signed.other_keys / "cosign.key")))
    with pytest.raises(SigningError, match=r"no valid signature by key .*(invalid signature|no matching)"):
        _pull(signed, "other-key")


def test_refuses_a_tag_re_pushed_with_other_content(signed: Signed, tmp_path: Path) -> None:
    repo = signed.recipe.model.publish.repository
    sources = [f"{repo}@{signed.published.platforms[p]}" for p in PLATFORMS]
    signed.manifests().create([f"{repo}:stable-copy"], sources)
    first = _pull(signed, "stable-copy")  # the same signed images under another tag: accepted
    assert first.trust["top"] == signed.published.index
    digest = _rebuilt(signed, tmp_path, "stable-copy")
    with pytest.raises(
        SigningError, match=rf"refusing {re.escape(repo)}:stable-copy .*@{digest} has no valid"
    ):
        _pull(signed, "stable-copy")


def test_refuses_provenance_for_another_recipe_hash(signed: Signed, tmp_path: Path) -> None:
    other = load_recipe(
        _recipe(tmp_path / "other", signed.registry, signed.keys / "cosign.pub", transformers="5.20.1")
    )
    assert other.hash != signed.recipe.hash
    digest = _rebuilt(signed, tmp_path, "other-hash")
    ref = f"{signed.recipe.model.publish.repository}@{digest}"
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    signer = Signer(str(signed.keys / "cosign.key"))
    signed.cosign().sign(ref, signer)
    source = Source.detect(signed.runner)
    signed.cosign().attest(ref, PROVENANCE, provenance(other, "linux/amd64", source), signer)
    with pytest.raises(SigningError, match=rf"signed provenance is for another recipe .*{other.hash[:12]}"):
        _pull(signed, "other-hash")


def test_moving_tag_needs_a_gpu_verified_attestation_for_the_platform(signed: Signed, tmp_path: Path) -> None:
    # A moving tag that reached the registry without a signed GPU attestation (by any path): pull refuses it.
    tools = Manifests(signed.eng, signed.runner, signed.recipe.model.publish.repository)
    repo = signed.recipe.model.publish.repository
    tools.create([f"{repo}:latest"], [f"{repo}@{d}" for d in signed.published.platforms.values()])
    with pytest.raises(SigningError, match=r"latest is a moving tag.*no signed GPU verify attestation"):
        _pull(signed, "latest", allow_unsigned=True)  # --allow-unsigned does not apply to moving tags
    amd64 = f"{signed.recipe.model.publish.repository}@{signed.published.platforms['linux/amd64']}"
    cpu_only = _verify_report(signed, amd64, "linux/amd64", False, tmp_path / "cpu.json")
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    from sparkforge.registry.cosign import attest_report

    signer = Signer(str(signed.keys / "cosign.key"))
    attest_report(signed.recipe, amd64, json.loads(cpu_only.read_text()), signed.cosign(), signer)
    with pytest.raises(SigningError, match=r"no signed GPU verify attestation for linux/amd64"):
        _pull(signed, "latest")
    gpu = _verify_report(signed, amd64, "linux/amd64", True, tmp_path / "gpu.json")
    attest_report(signed.recipe, amd64, json.loads(gpu.read_text()), signed.cosign(), signer)
    pulled = _pull(signed, "latest")
    assert pulled.trust["verified"]["gpu"]["used"] is True
    assert pulled.trust["verified"]["gpu"]["devices"] == ["NVIDIA GB10"]


def test_refuses_labels_that_claim_another_commit(signed: Signed, tmp_path: Path) -> None:
    digest = _rebuilt(signed, tmp_path, "other-commit", revision="0" * 40)
    ref = f"{signed.recipe.model.publish.repository}@{digest}"
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    signer = Signer(str(signed.keys / "cosign.key"))
    signed.cosign().sign(ref, signer)
    source = Source.detect(signed.runner)  # the signer vouches for this checkout's commit, not the label's
    signed.cosign().attest(ref, PROVENANCE, provenance(signed.recipe, "linux/amd64", source), signer)
    expected = rf"revision=0{{40}} is not the commit its signed provenance names \({source.revision}\)"
    with pytest.raises(SigningError, match=expected):
        _pull(signed, "other-commit")
    with pytest.raises(
        EngineError, match="is not in the local engine"
    ):  # removed again: nothing of it stays locally, nothing is tagged
        engine.inspect_image(ref)

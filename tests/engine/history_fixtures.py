"""Two signed releases of one recipe in a real local registry, for the history, diff and rollback tests.

Release 1 carries vLLM's _C and _moe_C with native sm_121 cubins; release 2 (a newer vLLM pin) ships _moe_C
as the family-only sm_120f build (real nvcc 13 fatbinaries, tests/unit/release_fixtures.py). Each is the
offline Debian base with that site-packages tree, the lock and every label of the recipe (amd64 only, no
RUN step: seconds to build), pushed,
GPU-verified on a GB10 (the one thing mocked: the record exactly as tests/engine/test_publish_moving.py
writes it), published, signed, attested (GPU verify claim, kernel report), then promoted to latest (the move
appended to latest's signed log), in the images workflow's order.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from registry import LocalRegistry, local_registry, unavailable_reason
from signing_fixtures import PASSWORD, docker_build
from test_publish_moving import GB10, _gb10_checks

from sparkforge import engine
from sparkforge.commands import Runner
from sparkforge.engine import Engine, detect_engine
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe, load_recipe
from sparkforge.registry.attest import attest_kernels, attest_report
from sparkforge.registry.cosign import Cosign, Signer
from sparkforge.registry.manifests import Manifests
from sparkforge.report import Check, Report
from sparkforge.verify import evidence, verified
from sparkforge.verify.kernels_run import KernelsQuery, for_target
from sparkforge.verify.suite import SUITE_DIR
from tests import registry_calls as calls
from tests.prerequisites import skip_or_fail
from tests.recipe_files import SMOKE, write_recipe_file
from tests.unit.audit_fixtures import nvcc_available
from tests.unit.release_fixtures import release_tree
from tests.unit.test_evidence import passing_checks
from tests.unit.tuf_fixtures import start_tuf

PLATFORM = "linux/amd64"
VERSIONS = {"native": "0.33.0", "family": "0.34.0"}  # release -> vLLM pin
JIT = [{"name": "jit.triton", "status": "passed", "reason": "compiled for sm_121"}]
QUIET = {"echo": lambda _: None}


@dataclass(frozen=True)
class Release:
    recipe: Recipe
    image: str  # local image (what was built and pushed)
    digest: str  # platform image in the registry
    index: str


@dataclass(frozen=True)
class Releases:
    registry: LocalRegistry
    eng: Engine
    runner: Runner
    evidence: Path
    keys: Path
    old: Release
    new: Release

    def tools(self) -> Manifests:
        return Manifests(self.eng, self.runner, self.old.recipe.model.publish.repository)

    @property
    def repository(self) -> str:
        return self.old.recipe.model.publish.repository


def gpu_record(release: Release, gpu: dict[str, str] | None, evidence_dir: Path) -> None:
    """What 'invoke verify' on a GB10 (when `gpu`) then 'invoke push' leave behind (test_publish_moving)."""
    image_id = str(engine.inspect_image(release.image)["Id"])
    checks = _gb10_checks()
    data = {
        "status": "passed",
        "recipe": release.recipe.name,
        "recipe_hash": release.recipe.hash,
        "platform": PLATFORM,
        "suite": {"sha256": evidence.suite_digest(SUITE_DIR)},
        "checks": checks,
        "gpus": {"used": gpu is not None},  # the host passed the GPU in and read it
        "gpu": gpu,
        "gpu_verified": evidence.gpu_verdict(checks, gpu, release.recipe.model.gpu).to_dict(),
        "base_override": True,
    }
    verified.write_record(image_id, data, evidence_dir)
    verified.link_digest(release.digest, image_id, release.recipe.model.publish.repository, evidence_dir)


def attest_gpu(release: Release, gpu: dict[str, str] | None, runner: Runner, keys: Path) -> None:
    """The GPU job's signed verify claim for `release` (what a GB10 run reports, or a run with no GPU: None)."""
    recipe = release.recipe
    image = f"{recipe.model.publish.repository}@{release.digest}"
    tools = Manifests(detect_engine(), runner, recipe.model.publish.repository)
    report = Report(command="verify", subject=image, recipe=recipe.name)  # what the GB10 job writes (mocked)
    for check in passing_checks():
        report.add(Check.from_dict(check))
    report.extra.update(
        {
            "image_id": tools.config_digest(image),
            "recipe_hash": recipe.hash,
            "gpus": {"mode": "all" if gpu else "none", "used": gpu is not None},
            "gpu": gpu,
            "suite": {"sha256": evidence.suite_digest(SUITE_DIR)},
            "platform": PLATFORM,
        }
    )
    os.environ.setdefault("COSIGN_PASSWORD", PASSWORD)
    attest_report(recipe, image, report.to_dict(), Cosign(runner), Signer(str(keys / "cosign.key")), tools)


def _recipe(folder: Path, registry: LocalRegistry, key: Path, vllm: str) -> Recipe:
    body = (
        f"platforms: [{PLATFORM}]\n"
        f"publish:\n  repository: {registry.host}/sparkforge/history\n  signing:\n    key: {key}\n"
        f"components:\n  vllm:\n    version: {vllm}\n"
    )
    return load_recipe(write_recipe_file(folder / vllm / "history.yaml", body, extends=SMOKE))


def _head() -> str:
    argv = ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"]
    return subprocess.run(argv, capture_output=True, text=True).stdout.strip()


def _release(state: dict, name: str, base: str, recipe: Recipe, tmp: Path) -> Release:
    """Add the release's libraries to the base stage, then push, GB10-verify, publish --moving, sign, attest."""
    runner, eng, evidence_dir = state["runner"], state["eng"], state["evidence"]
    context = release_tree(name, tmp / f"context-{name}")
    tag = f"sparkforge-historytest/{name}-{os.getpid()}"  # not sparkforge-test/: other test runs sweep those
    state["images"].append(tag)
    bases = plan.bases(recipe, {"builder": base, "runtime": base})  # honest: the offline base (an override)
    (context / "lock.json").write_text(
        json.dumps(plan.lock(recipe, bases))
    )  # as the runtime stage carries it
    site = context / "opt" / "venv" / "lib" / "python3.11" / "site-packages"
    for name, component in plan.lock(recipe, bases)["components"].items():  # the locked wheels, as installed
        dist, version = str(component.get("package") or name), component["version"]
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    labels = {**plan.labels(recipe, bases), "org.opencontainers.image.revision": _head()}
    dockerfile = f"FROM {base}\nCOPY opt /opt\nCOPY lock.json /opt/sparkforge/lock.json\n" + "".join(
        f"LABEL {key}={json.dumps(value)}\n" for key, value in labels.items()
    )  # the runtime stage's files and labels; no RUN step, so no network and no venv to build
    docker_build(dockerfile, PLATFORM, tag, context)
    pushed = calls.push(
        recipe, PLATFORM, image=tag, digests_dir=None, runner=runner, eng=eng, allow_unverified=True,
        allow_base_override=True, evidence_dir=evidence_dir, **QUIET,
    )  # fmt: skip
    release = Release(recipe, tag, pushed.digest, "")
    gpu_record(release, GB10, evidence_dir)
    published = calls.publish(
        recipe,
        {PLATFORM: pushed.digest},
        when=state["day"],
        runner=runner,
        eng=eng,
        allow_base_override=True,
        evidence_dir=evidence_dir,
        **QUIET,
    )  # fmt: skip  (the merge job: immutable tags; the GPU job promotes after signing and attesting)
    cosign, signer = Cosign(runner), Signer(str(state["keys"] / "cosign.key"))
    image = f"{recipe.model.publish.repository}@{pushed.digest}"
    from sparkforge.registry.cosign import sign_published
    from sparkforge.registry.manifests import Manifests
    from sparkforge.registry.sbomtrust import attest_published as attest_sboms

    sign_published(recipe, published.index, published.platforms, cosign, signer)
    attest_sboms(
        recipe, published.platforms, cosign, signer, Manifests(eng, runner, recipe.model.publish.repository)
    )
    attest_gpu(Release(recipe, tag, pushed.digest, published.index), GB10, runner, state["keys"])
    kernels = for_target(tag, recipe.model.gpu, [], KernelsQuery(recipe.name, JIT))
    attest_kernels(recipe, image, kernels.to_dict(), cosign, signer)
    calls.promote(
        recipe,
        published.index,
        when=state["day"],
        runner=runner,
        eng=eng,
        evidence_dir=evidence_dir,
        **QUIET,
    )  # fmt: skip  (appends the move to latest's signed log: SPARKFORGE_SIGNING_KEY is the verify signer)
    return Release(recipe, tag, pushed.digest, published.index)


@pytest.fixture(scope="module")
def releases(base_amd64: str, tmp_path_factory: pytest.TempPathFactory):
    for reason in (
        unavailable_reason(),
        None if shutil.which("cosign") else "cosign is not installed (invoke sign.install)",
        None if nvcc_available() else "nvcc 13 is not installed (/usr/local/cuda-13.0)",
    ):
        if reason:
            skip_or_fail(reason)
    import datetime as dt

    tmp = tmp_path_factory.mktemp("history")
    keys = tmp / "keys"
    keys.mkdir()
    env = {**os.environ, "COSIGN_PASSWORD": PASSWORD}
    subprocess.run(["cosign", "generate-key-pair"], cwd=keys, env=env, check=True, capture_output=True)
    with local_registry(tmp / "registry") as registry, pytest.MonkeyPatch.context() as patch:
        patch.setenv("COSIGN_PASSWORD", PASSWORD)
        patch.setenv("SPARKFORGE_SIGNING_KEY", str(keys / "cosign.key"))  # signs the tag log at promote
        patch.setenv(
            "SPARKFORGE_CACHE", str(tmp / "cache")
        )  # this session's registry: trusted TUF state of its own
        state = {
            "registry": registry, "eng": detect_engine(), "runner": Runner(log_dir=tmp / "logs", stream=False),
            "evidence": tmp / "verified", "keys": keys, "images": [], "day": dt.date(2026, 12, 1),
        }  # fmt: skip
        made: dict[str, Release] = {}
        try:
            for name, vllm in VERSIONS.items():
                recipe = _recipe(tmp / "recipes", registry, keys / "cosign.pub", vllm)
                if not made:  # the TUF repository of the releases' repository (dev root, online ed25519 key)
                    (tmp / "tuf").mkdir(exist_ok=True)
                    start_tuf(registry, recipe.model.publish.repository, tmp / "tuf", patch)
                made[name] = _release(state, name, base_amd64, recipe, tmp)
            yield Releases(
                registry,
                state["eng"],
                state["runner"],
                state["evidence"],
                keys,
                made["native"],
                made["family"],
            )
        finally:
            refs = list(state["images"])
            for release in made.values():
                repo = release.recipe.model.publish.repository
                refs += [f"{repo}@{release.digest}", f"{repo}:{release.recipe.hash[:12]}-amd64"]
                refs += list(plan.final_tags(release.recipe, state["day"]).all)
            for ref in refs:
                engine.remove_image(ref)

"""Signed smoke images the signing tests share: cosign key pairs made here, the local registry, no transparency log.

Smoke images (the template's quick 'base' stage of tests/recipes/smoke-multiarch.yaml) for amd64 and arm64
(QEMU) are pushed, merged, then signed by running the images workflow's own `invoke sign` step (with a key
instead of the CI job's keyless identity), once per session. The engine conftest registers the fixture; tests
import the rest. About 60 s warm (bases and layers cached).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from registry import LocalRegistry, local_registry, unavailable_reason

from sparkforge import engine
from sparkforge.commands import Runner
from sparkforge.engine import Engine, detect_engine
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe, load_recipe
from sparkforge.registry import publish as pub
from sparkforge.registry import pull as pulling
from sparkforge.registry import tufrepo
from sparkforge.registry.cosign import Cosign
from sparkforge.registry.manifests import Manifests
from sparkforge.registry.tufclient import TagTarget
from sparkforge.report import Check, Report
from sparkforge.verify.evidence import suite_digest
from sparkforge.verify.suite import SUITE_DIR
from tests import registry_calls as calls
from tests.prerequisites import skip_or_fail
from tests.recipe_files import SMOKE_PLATFORMS as PLATFORMS
from tests.recipe_files import smoke_recipe_file
from tests.unit.tuf_fixtures import start_tuf

WORKFLOWS = (
    REPO_ROOT / ".github" / "workflows" / "images.yml",
    REPO_ROOT / ".github" / "workflows" / "gpu-attest.yml",
)
DAY = dt.date(2026, 11, 30)
PASSWORD = "sparkforge-test-key-password"
QUIET = {"echo": lambda _: None, "warn": lambda _: None}


def workflow_step(name_part: str) -> dict:
    """The images workflows' step whose name contains `name_part` (the tests run its `run` line)."""
    jobs = [j for w in WORKFLOWS for j in yaml.safe_load(w.read_text())["jobs"].values()]
    steps = [s for job in jobs for s in job.get("steps", []) if name_part in s.get("name", "")]
    assert len(steps) == 1, f"{name_part!r} names {len(steps)} steps in {WORKFLOWS}"
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

    def run_step(
        self, name_part: str, swap: tuple[str, str] | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """Run a workflow step's `run` with bash, as the runner would, signing with the test key; `swap`: one text
        replaced in the step's command first (checked to be there)."""
        step = workflow_step(name_part)
        if swap is not None:
            assert swap[0] in step["run"], (swap, step["run"])
            step = {**step, "run": step["run"].replace(*swap)}
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


def signed_recipe_file(folder: Path, registry: LocalRegistry, key: Path, **versions: str) -> Path:
    """The smoke recipe published to `registry` as sparkforge/signed, its signatures checked with `key`."""
    return smoke_recipe_file(
        folder,
        registry.host,
        repository="sparkforge/signed",
        name="smoke-signed",
        signing_key=key,
        **versions,
    )


@pytest.fixture(scope="session")
def signed(base_stages, tmp_path_factory: pytest.TempPathFactory):
    """Both platforms built, pushed and merged, then signed by the workflow's sign step."""
    for reason in (
        unavailable_reason(),
        None if shutil.which("cosign") else "cosign is not installed (invoke sign.install)",
    ):
        if reason:
            skip_or_fail(reason)
    tmp = tmp_path_factory.mktemp("signing")
    keys, other = _keypair(tmp / "keys"), _keypair(tmp / "other-keys")
    name = f"signing-test-{os.getpid()}"
    published_json = REPO_ROOT / "build" / "published" / f"{name}.json"
    with local_registry(tmp / "registry") as registry:
        recipe = load_recipe(signed_recipe_file(tmp / "recipe", registry, keys / "cosign.pub"))
        # The TUF repository of the recipe's repository (dev root, online ed25519 key, a cache of this session)
        session_env = pytest.MonkeyPatch()
        session_env.setenv("SPARKFORGE_CACHE", str(tmp / "cache"))
        (tmp / "tuf").mkdir(exist_ok=True)
        start_tuf(registry, recipe.model.publish.repository, tmp / "tuf", session_env)
        eng, runner = detect_engine(), Runner(log_dir=tmp / "logs", stream=False)
        candidates: dict[str, str] = {}
        digests: dict[str, str] = {}
        try:
            with base_stages(recipe, tmp / "build") as built:
                for platform in PLATFORMS:
                    candidates[platform] = _with_revision(
                        built[platform], platform, f"sparkforge-test/signing-{platform[6:]}", tmp
                    )
                    pushed = calls.push(
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
                published = calls.publish(
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
            refs = [*candidates.values(), *(f"{repo}@{d}" for d in digests.values())]
            refs += [f"{repo}:{recipe.hash[:12]}-{p.split('/')[1]}" for p in PLATFORMS]
            refs += [*plan.final_tags(recipe, DAY).all, f"{repo}:stable-copy", f"{repo}:unsigned"]
            for ref in refs:
                engine.remove_image(ref)


def _head() -> str:
    argv = ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"]
    return subprocess.run(argv, capture_output=True, text=True).stdout.strip()


def docker_build(dockerfile: str, platform: str, tag: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Dockerfile").write_text(dockerfile)
    env = {"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"}
    argv = ["/usr/bin/docker", "build", "-q", "--platform", platform, "-t", tag, str(folder)]
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-1500:]


def _with_revision(image: str, platform: str, tag: str, tmp: Path, revision: str = "") -> str:
    """The base stage with the labels the runtime stage adds at build time (revision = this checkout's HEAD)."""
    label = f"LABEL org.opencontainers.image.revision={revision or _head()}\n"
    docker_build(f"FROM {image}\n{label}", platform, tag, tmp / tag.replace("/", "-"))
    return tag


def pull_signed(
    signed: Signed, tag: str | None = None, platform: str = "linux/amd64", **kw
) -> pulling.Pulled:
    """pull as a test of signatures: GPU claims are required (every path) only where a test says
    `require_verified=True`; otherwise --allow-unverified (the claims are tested where named)."""
    if not kw.pop("require_verified", False):
        kw.setdefault("allow_unverified", True)
    return calls.pull(
        signed.recipe, tag, platform=platform, runner=signed.runner, eng=signed.eng, **QUIET, **kw
    )


def verify_report(
    signed: Signed, image: str, platform: str, gpu: dict[str, Any] | None, path: Path, **change: Any
) -> Path:
    """A verify report as the GPU job writes it for `image` (repository@digest); the GPU run itself is what
    cannot exist here (`gpu`: the GPU the host passed in and read, None for none)."""
    from tests.unit.test_evidence import passing_checks

    report = Report(command="verify", subject=image, recipe=signed.recipe.name)
    for check in passing_checks():
        skipped = gpu is None and check["name"].startswith("fp8.")
        report.add(Check.from_dict({**check, "status": "skipped"} if skipped else check))
    report.extra.update(
        {
            "image_id": signed.manifests().config_digest(image),
            "recipe_hash": signed.recipe.hash,
            "gpus": {"mode": "all" if gpu else "none", "used": gpu is not None},
            "gpu": gpu,
            "suite": {"sha256": suite_digest(SUITE_DIR)},
            "platform": platform,
            **change,
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    report.write_json(path)
    return path


def log_move(
    signed: Signed, tag: str, index: str, platforms: dict[str, str], key: Path | None = None
) -> None:
    """What promote writes: the signed TUF targets name `index` (and its platform images) for `tag`."""
    del key  # the TUF targets are signed by the online TUF key, not a cosign key
    recipe = signed.recipe
    target = TagTarget(tag, index, dict(platforms), {}, recipe.name, recipe.hash, "", "promote")
    tufrepo.move_tag(recipe.model.publish.repository, target)

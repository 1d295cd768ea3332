"""`invoke export --realize` against a real registry (Debian's docker-registry on 127.0.0.1) and the real engine:
the image is pinned by the digest the registry serves (its HTTP API is the oracle), then, with the registry gone,
by the digest the engine recorded at push; an image never pushed is refused; the model revision is required
where the hub cannot be reached."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml
from registry import local_registry, unavailable_reason

from sparkforge import engine
from sparkforge.recipe.loader import REPO_ROOT
from tests.prerequisites import skip_or_fail

PROFILE = REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe.yaml"
RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-cpu-twin.yaml"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _tiny_image(tag: str) -> None:
    """A one-file image (docker import of a small tar): seconds to push, nothing pulled."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        body = b"sparkforge realize test\n"
        info = tarfile.TarInfo("etc/sparkforge-realize")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    subprocess.run(["docker", "import", "-", tag], input=data.getvalue(), check=True, capture_output=True)


def _export(
    image: str, out: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "invoke", "export", "--profile", str(PROFILE), "--recipe", str(RECIPE)]
    argv += ["--image", image, "--format", "sparkarena", "--out", str(out), *extra]
    return subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, env=env)


def test_realize_pins_the_registry_digest(engine_ready: None, tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    refs: list[str] = []
    try:
        with local_registry(tmp_path / "registry") as registry:
            ref = f"{registry.host}/sparkforge-tests/realize:v1"
            never = f"{registry.host}/sparkforge-tests/never-pushed:v1"  # the same image, a repository it never reached
            refs += [ref, never]
            _tiny_image(ref)
            subprocess.run(["docker", "push", ref], check=True, capture_output=True, timeout=120)
            digest, _ = registry.manifest("sparkforge-tests/realize", "v1") or ("", {})
            assert digest.startswith("sha256:")
            pinned = f"{registry.host}/sparkforge-tests/realize@{digest}"

            done = _export(ref, tmp_path / "a.yaml", "--realize", "--model-revision", REVISION)
            assert done.returncode == 0, done.stderr
            recipe = yaml.safe_load((tmp_path / "a.yaml").read_text())
            assert recipe["container"] == pinned and recipe["model_revision"] == REVISION
            assert len(recipe["metadata"]["sparkforge_recipe_hash"]) == 64
            assert f"--revision {REVISION}" in recipe["command"]

            # A hub that does not answer (as here, where huggingface.co cannot be reached): the revision is required.
            unanswering = {**os.environ, "HF_ENDPOINT": "https://127.0.0.1:9"}
            hub = _export(ref, tmp_path / "b.yaml", "--realize", env=unanswering)
            assert hub.returncode == 1 and "cannot be looked up from here" in hub.stderr
            assert "--model-revision" in hub.stderr and not (tmp_path / "b.yaml").exists()

            engine.tag_image(ref, never)
            refused = _export(never, tmp_path / "c.yaml", "--realize", "--model-revision", REVISION)
            assert refused.returncode == 1 and "never pushed has no registry digest" in refused.stderr
            assert "Traceback" not in refused.stderr and not (tmp_path / "c.yaml").exists()
        # The registry is gone: the digest the engine recorded at push.
        done = _export(ref, tmp_path / "d.yaml", "--realize", "--model-revision", REVISION)
        assert done.returncode == 0, done.stderr
        assert yaml.safe_load((tmp_path / "d.yaml").read_text())["container"] == pinned
    finally:
        for made in refs:
            engine.remove_image(made)

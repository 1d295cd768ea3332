"""The lean CI image (real vLLM 0.33.0 wheels): JIT toolchains proven for sm_121 without a GPU, the size within
the recipe's image.max_size with its declared removals absent, CUDA once (size report), and the layer-store
reader giving the export stream's verdicts.

Cost, measured on the 2-core development machine with the image's layers cached: the build is a cache hit
(< 5 s), verify ~2-3 min (FlashInfer's JIT compile is most of it), the broken-ptxas run ~30 s, the size report
~15 s; `test_layer_reader_matches_export` streams the whole 8 GB filesystem once more (~90 s, marked slow).
Cold (no layers cached) the fixture's build takes ~10 min and downloads ~5 GB from PyPI.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sparkforge import engine
from sparkforge.errors import VerifyError
from sparkforge.imagebuild.pipeline import build
from sparkforge.imagebuild.stage import BuildOptions, parse_base_image
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.verify import imagefs
from sparkforge.verify.size import size_report
from tests.engine.sessions import build_session
from tests.recipe_files import write_recipe_file

pytestmark = pytest.mark.engine
CI_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"
OLD_NVCC = "nvidia-cuda-nvcc-cu12==12.8.93"  # CUDA 12.8: knows sm_120, not sm_121 (added in 12.9)


@pytest.fixture(scope="module")
def lean_image(base_amd64: str, canary_secrets, tmp_path_factory) -> tuple[str, object]:
    """The CI recipe built (a cache hit once any test built it) and verified with the GPU-less suite."""
    ca, token = canary_secrets
    options = BuildOptions(
        platform="linux/amd64",
        bases=parse_base_image(base_amd64),
        secrets=(f"id=hf_token,src={token}",),
        gpus="none",
        preflight=False,
        log_root=tmp_path_factory.mktemp("lean") / "logs",
    )
    result = build(build_session(ca), load_recipe(str(CI_RECIPE)), options)
    return result.candidate, result.verify


def test_jit_checks_pass_in_verify(lean_image) -> None:
    _, report = lean_image
    assert report is not None and report.status == "passed", report and report.to_dict()
    by_name = {c.name: c for c in report.checks}
    for name in ("kernels", "registry", "versions", "jit.toolchain", "jit.triton", "jit.flashinfer"):
        assert by_name[name].status == "passed", (name, by_name[name].reason)
    triton = by_name["jit.triton"].details
    assert triton["ptx_target"] == "sm_121a" and triton["cubin_bytes"] > 0
    assert triton["ptxas"]["path"] == "/opt/venv/cuda/bin/ptxas"  # the image's toolkit, not Triton's copy
    assert "sm_121a" in by_name["jit.flashinfer"].details["gencode"]
    assert by_name["jit.toolchain"].details["cuda_home"] == "/opt/venv/cuda"


def test_size_within_the_recipe_budget_and_cuda_once(lean_image) -> None:
    image, verify = lean_image
    model = load_recipe(str(CI_RECIPE)).model
    budget = model.image.max_bytes
    assert budget == 8_000_000_000 and len(model.runtime.remove) >= 10  # the CI image's image.max_size: 8GB
    size = {c.name: c for c in verify.checks}["size"]
    assert size.status == "passed" and size.details["max_bytes"] == budget, size.reason
    report = size_report(image)
    data = report.extra["size"]
    assert data["image_bytes"] <= budget, f"{data['image_bytes'] / 1e9:.2f} GB > image.max_size 8GB"
    tree = imagefs.image_tree(image)
    assert tree is not None
    site = "opt/venv/lib/python3.11/site-packages/"
    paths = {f.path.removeprefix(site) for f in tree.files if f.path.startswith(site)}
    gone = (
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "tokenspeed_triton/",
        "tilelang/",
        "sympy/core/tests/",
    )
    assert not [p for p in paths if p.startswith(gone)]  # what runtime.remove declares is not in any layer
    kept = (
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
        "triton/_C/libtriton.so",
        "nvidia/cu13/lib/libnvrtc.so.13",
    )
    assert set(kept) <= paths
    check = report.checks[0]
    assert check.name == "cuda-once" and check.status == "passed", check.reason
    assert not [d for d in data["duplicates"] if d["cuda"]]
    assert sum(layer["bytes"] for layer in data["layers"]) >= data["visible_bytes"]
    assert any("pip install torch" in (layer["created_by"] or "") for layer in data["layers"])


def test_the_build_refuses_to_tag_an_image_over_its_budget(
    lean_image, base_amd64: str, canary_secrets, tmp_path
) -> None:
    """The same layers under a recipe with a smaller image.max_size: built from the cache, refused before verify."""
    tight = write_recipe_file(
        tmp_path / "ci-wheels-tight.yaml", "image:\n  max_size: 5GB\n", extends=CI_RECIPE
    )
    recipe = load_recipe(str(tight))
    ca, _ = canary_secrets
    options = BuildOptions(
        platform="linux/amd64",
        bases=parse_base_image(base_amd64),
        gpus="none",
        preflight=False,
        log_root=tmp_path / "logs",
    )
    candidate = plan.candidate_tag(recipe, "linux/amd64")
    try:
        with pytest.raises(
            VerifyError, match=r"over the recipe's image.max_size 5GB by [0-9.]+ GB.*nothing was tagged"
        ):
            build(build_session(ca), recipe, options)
        assert engine.image_exists(candidate)  # built (the candidate tag), but never given a final tag
        assert not engine.image_exists(plan.final_tags(recipe, dt.date.today()).all[0])
    finally:
        if engine.image_exists(candidate):
            engine.remove_image(candidate)


@pytest.fixture(scope="module")
def old_ptxas(tmp_path_factory) -> Path:
    """A real CUDA 12.8 ptxas from NVIDIA's wheel on PyPI: it rejects sm_121a, as Triton's bundled one did."""
    root = tmp_path_factory.mktemp("old-cuda")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(root), OLD_NVCC],
        check=True,
        timeout=600,
    )
    wheel = next(root.glob("nvidia_cuda_nvcc_cu12-*.whl"))
    target = root / "bin" / "ptxas"
    target.parent.mkdir()
    with zipfile.ZipFile(wheel) as archive:
        target.write_bytes(archive.read("nvidia/cuda_nvcc/bin/ptxas"))
    target.chmod(0o755)
    return target.parent


def test_triton_check_fails_clearly_with_a_ptxas_that_lacks_sm_121a(lean_image, old_ptxas: Path) -> None:
    image, _ = lean_image
    broken = {
        "TRITON_PTXAS_PATH": "/opt/old-cuda/ptxas",
        "TRITON_PTXAS_BLACKWELL_PATH": "/opt/old-cuda/ptxas",
    }
    result = engine.run_container(
        image,
        ["/opt/sparkforge/image-tests/checks_jit.py", "--only", "jit.triton"],
        entrypoint=["/opt/venv/bin/python3"],
        environment=broken,
        volumes={str(old_ptxas): "/opt/old-cuda"},
        timeout_s=600,
    )
    assert result.exit_code == 1, result
    checks = {c.name: c for c in _parse(result.stdout)}
    triton = checks["jit.triton"]
    assert triton.status == "failed"
    assert "Triton cannot compile for sm_121a through ptxas 12.8 at /opt/old-cuda/ptxas" in triton.reason
    assert "sm_121a" in triton.details["error"]  # the toolchain's own words (LLVM or ptxas) name the target
    assert "fix: point TRITON_PTXAS_BLACKWELL_PATH" in triton.reason


def _parse(stdout: str) -> list:
    import json

    from sparkforge.report import Check
    from sparkforge.verify.suite import MARKER

    line = next(ln for ln in reversed(stdout.splitlines()) if ln.startswith(MARKER))
    return [Check.from_dict(c) for c in json.loads(line[len(MARKER) :])["checks"]]


@pytest.mark.slow(cost_s=300, reason="exports the whole 8 GB image once to compare the two readers")
def test_layer_reader_matches_export(lean_image) -> None:
    image, _ = lean_image
    require = load_recipe(str(CI_RECIPE)).model.audit.require
    fast = imagefs.audit_image(image, "sm_121", require, reader="layers")
    slow = imagefs.audit_image(image, "sm_121", require, reader="export")
    assert fast.extra["reader"]["kind"] == "layers" and slow.extra["reader"]["kind"] == "export"
    assert fast.extra["libraries"] == slow.extra["libraries"]
    assert [(c.name, c.status, c.reason) for c in fast.checks] == [
        (c.name, c.status, c.reason) for c in slow.checks
    ]
    assert fast.extra["summary"]["by_verdict"] == slow.extra["summary"]["by_verdict"]

"""The audit on the official vLLM 0.33.0 aarch64 wheel from PyPI (333 MB, downloaded once into the cache)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from audit_fixtures import as_cuobjdump_sees, cuobjdump_counts, find_cuobjdump

from sparkforge.audit.fatbin import read_fatbin_file
from sparkforge.audit.scan import audit_target
from sparkforge.context import cache_path

# Downloads 333 MB; deselected unless -m slow (pyproject's addopts: -m 'not slow').
pytestmark = pytest.mark.slow

VLLM_VERSION = "0.33.0"
WHEEL = f"vllm-{VLLM_VERSION}-cp38-abi3-manylinux_2_28_aarch64.whl"


@pytest.fixture(scope="session")
def vllm_wheel() -> Path:
    path = cache_path("audit", "wheels", WHEEL)
    if not path.is_file():
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--platform", "manylinux_2_28_aarch64", "--python-version", "3.12",
                f"vllm=={VLLM_VERSION}", "-d", str(path.parent)]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0 or not path.is_file():
            pytest.fail(f"could not download {WHEEL}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return path


@pytest.fixture(scope="session")
def vllm_libraries(vllm_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vllm-so")
    with zipfile.ZipFile(vllm_wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".so"):
                archive.extract(name, root)
    return root


def test_gb10_coverage_of_the_official_wheel(vllm_wheel: Path) -> None:
    report = audit_target(vllm_wheel, gpu="sm_121", require=["vllm/_C*.so", "vllm/_qutlass_C*.so"])
    libs = {lib["path"]: lib for lib in report.extra["libraries"]}
    c = libs["vllm/_C_stable_libtorch.abi3.so"]
    assert c["entries"]["sass_120"] == 50 and c["entries"]["sass_120f"] == 35
    assert not any(key.startswith("sass_121") for key in c["entries"])
    assert {"ptx_80", "ptx_89", "ptx_90", "sass_90a", "sass_100f", "sass_110f"} <= set(c["entries"])
    assert c["verdict"] == "native" and c["required"] is True
    assert c["units"]["native"] > 0 and c["units"]["family"] > 0 and c["units"]["none"] > 0
    assert libs["vllm/_qutlass_C.abi3.so"]["entries"] == {"sass_100f": 6}
    assert libs["vllm/_qutlass_C.abi3.so"]["verdict"] == "none"
    assert libs["vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"]["verdict"] == "none"  # Hopper-only sm_90a
    passed, failed = report.checks
    assert passed.status == "passed" and failed.status == "failed"
    assert "vllm/_qutlass_C.abi3.so (sass_100f)" in failed.reason


def test_hopper_sees_the_same_wheel_differently(vllm_wheel: Path) -> None:
    libs = {lib["path"]: lib["verdict"] for lib in audit_target(vllm_wheel, gpu="sm_90").extra["libraries"]}
    assert libs["vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"] == "native"
    assert libs["vllm/_qutlass_C.abi3.so"] == "none"
    assert libs["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"] == "jit"  # sm_80 cubins do not run on 9.0


def test_counts_equal_cuobjdump_on_every_library(vllm_libraries: Path) -> None:
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found: pip install nvidia-cuda-cuobjdump")
    compared = 0
    for path in sorted(vllm_libraries.rglob("*.so")):
        fatbin = read_fatbin_file(path)
        ours = as_cuobjdump_sees(fatbin.entries) if fatbin else {}
        assert ours == cuobjdump_counts(cuobjdump, path), path.name
        compared += bool(ours)
    assert compared == 9


def test_wheel_and_extracted_tree_agree(vllm_wheel: Path, vllm_libraries: Path) -> None:
    assert audit_target(vllm_wheel).extra["libraries"] == audit_target(vllm_libraries).extra["libraries"]

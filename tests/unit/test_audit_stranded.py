"""A library whose generic kernels run on sm_121 but whose Blackwell-generation kernels were built for
sm_120a (the vLLM 0.17-era failure): its best verdict is native, yet a required library must fail."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sparkforge.audit.scan import audit_target

NVCC = Path("/usr/local/cuda-13.0/bin/nvcc")
SOURCE = "__global__ void k{n}(float* x) {{ x[threadIdx.x] *= {n}.0f; }}\n"

pytestmark = pytest.mark.skipif(not NVCC.exists(), reason=f"nvcc 13.0 not found at {NVCC}")


@pytest.fixture(scope="module")
def mixed_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stranded")
    objects = []
    for n, code in ((1, "sm_120"), (2, "sm_120a")):
        source = root / f"k{n}.cu"
        source.write_text(SOURCE.format(n=n))
        obj = root / f"k{n}.o"
        arch = code.replace("sm_", "compute_")
        subprocess.run(
            [
                str(NVCC),
                "-c",
                "-Xcompiler",
                "-fPIC",
                str(source),
                "-o",
                str(obj),
                "-gencode",
                f"arch={arch},code={code}",
            ],
            check=True,
            capture_output=True,
        )
        objects.append(str(obj))
    library = root / "libmixed.so"
    subprocess.run([shutil.which("g++") or "g++", "-shared", *objects, "-o", str(library)], check=True)
    return library


def test_stranded_generation_units_fail_a_requirement(mixed_library: Path) -> None:
    report = audit_target(mixed_library, gpu="sm_121", require=["libmixed.so"])
    library = report.extra["libraries"][0]
    assert library["verdict"] == "native"  # the sm_120 unit runs on 12.1 ...
    assert library["units"]["none"] == 1 and library["stranded_units"] == 1  # ... the sm_120a one cannot
    assert report.status == "failed"
    assert "cannot run on sm_121" in report.checks[0].reason


def test_same_library_passes_on_sm_120(mixed_library: Path) -> None:
    report = audit_target(mixed_library, gpu="sm_120", require=["libmixed.so"])
    assert report.status == "passed"
    assert report.extra["libraries"][0]["stranded_units"] == 0


def test_units_of_other_generations_do_not_count(tmp_path: Path) -> None:
    source = tmp_path / "h.cu"
    source.write_text(SOURCE.format(n=3))
    obj = tmp_path / "h.o"
    subprocess.run(
        [
            str(NVCC),
            "-c",
            str(source),
            "-o",
            str(obj),
            "-gencode",
            "arch=compute_90a,code=sm_90a",
            "-gencode",
            "arch=compute_120,code=sm_120",
        ],
        check=True,
        capture_output=True,
    )
    report = audit_target(obj, gpu="sm_121", require=["h.o"])
    assert report.status == "passed" and report.extra["libraries"][0]["stranded_units"] == 0

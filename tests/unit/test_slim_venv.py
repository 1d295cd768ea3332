"""dockerfiles/files/slim-venv.py, run as the image runs it, on a site-packages laid out like the real one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sparkforge.recipe import REPO_ROOT

SCRIPT = REPO_ROOT / "dockerfiles" / "files" / "slim-venv.py"


def _write(root: Path, rel: str, data: bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_slim_venv_keeps_one_copy_and_leaves_lower_layers_alone(tmp_path: Path) -> None:
    site, toolkit = tmp_path / "site", tmp_path / "site" / "nvidia" / "cu13"
    old = _write(site, "triton_old/backends/nvidia/bin/ptxas", b"older layer")  # written before the step
    time.sleep(0.05)
    stamp = tmp_path / "step-began"
    stamp.touch()
    time.sleep(0.05)
    _write(toolkit, "bin/ptxas", b"ptxas 13")
    _write(toolkit, "lib/libcupti.so.13", b"cupti 13" * 10_000)
    _write(site, "nvidia_cutlass_dsl/cu12/lib/libcute_dsl_runtime.so", b"cu12")
    _write(site, "nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so", b"cu13")
    _write(site, "cutlass/_mlir_libs/_cutlass_ir.cu12.cpython-311-x86_64-linux-gnu.so", b"ir12")
    _write(site, "cutlass/_mlir_libs/_cutlass_ir.cu13.cpython-311-x86_64-linux-gnu.so", b"ir13")
    _write(site, "triton/backends/nvidia/bin/ptxas", b"bundled ptxas 12.8")
    _write(site, "triton/backends/nvidia/bin/ptxas-blackwell", b"bundled ptxas 13.3")
    _write(site, "triton/backends/nvidia/bin/nvdisasm", b"kept")
    _write(site, "triton/backends/nvidia/lib/cupti/libcupti.so.2025.1.1", b"cupti 12" * 10_000)
    _write(site, "triton/backends/nvidia/lib/cupti/libcupti_static.a", b"archive")
    first = _write(site, "z3/lib/libz3.so", b"z" * 100_000)
    _write(site, "z3/lib/libz3.so.4.15", b"z" * 100_000)

    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--site", str(site), "--since", str(stamp), "--cuda", "13.0",
         "--toolkit", str(toolkit)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip

    assert not (site / "nvidia_cutlass_dsl/cu12").exists()
    assert (site / "nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so").read_bytes() == b"cu13"
    assert not (site / "cutlass/_mlir_libs/_cutlass_ir.cu12.cpython-311-x86_64-linux-gnu.so").exists()
    assert (site / "cutlass/_mlir_libs/_cutlass_ir.cu13.cpython-311-x86_64-linux-gnu.so").exists()
    for name in ("ptxas", "ptxas-blackwell"):
        tool = site / "triton/backends/nvidia/bin" / name
        assert tool.is_symlink() and tool.read_bytes() == b"ptxas 13"
    assert not (site / "triton/backends/nvidia/bin/nvdisasm").is_symlink()
    cupti = site / "triton/backends/nvidia/lib/cupti/libcupti.so.2025.1.1"
    assert cupti.is_symlink() and os.readlink(cupti) == str(toolkit / "lib/libcupti.so.13")
    assert not (site / "triton/backends/nvidia/lib/cupti/libcupti_static.a").exists()
    assert (site / "z3/lib/libz3.so.4.15").stat().st_ino == first.stat().st_ino  # one copy, two names
    assert (
        not old.is_symlink() and old.read_bytes() == b"older layer"
    )  # a lower layer's file is never rewritten
    assert "slim-venv: cu12 builds" in done.stdout and "identical copies" in done.stdout

"""Run cubin_load.py where a GPU is present: the driver must agree with every audit prediction."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(
    ctypes.util.find_library("cuda") is None, reason="no CUDA driver (libcuda) on this machine"
)
def test_driver_agrees_with_the_audit(tmp_path: Path) -> None:
    out = tmp_path / "cubin_load.json"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent)}
    proc = subprocess.run([sys.executable, str(HERE / "cubin_load.py"), "--out", str(out)], env=env,
                          capture_output=True, text=True)  # fmt: skip
    report = json.loads(out.read_text())
    assert report["summary"]["fixtures"] >= 19
    assert proc.returncode == 0 and report["summary"]["disagreements"] == 0, proc.stdout + proc.stderr

"""The FP8 contract's torch tests (tests/unit/test_fp8_contract.py: planted faults on real CPU tensors) run here
inside the CPU twin image, which has torch; the CI host has none, so there those tests skip.

The image gets the checkout read-only and this host's pytest (pure Python, copied into a folder on PYTHONPATH);
no conftest is loaded (the unit conftest needs sparkforge's own dependencies, which these tests do not use).
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
from cluster import DOCKER, sh
from real_fixtures import cpu_twin  # noqa: F401

from sparkforge.recipe.loader import REPO_ROOT

pytestmark = pytest.mark.engine
PURE = ("pytest", "_pytest", "pluggy", "iniconfig", "py")  # pytest and what it imports that may be missing


def _host_pytest(into: Path) -> None:
    for name in PURE:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        if origin.name == "__init__.py":
            shutil.copytree(origin.parent, into / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, into / origin.name)


def test_the_fp8_torch_tests_pass_inside_the_cpu_twin(cpu_twin: str, tmp_path: Path) -> None:
    lib = tmp_path / "pylib"
    lib.mkdir()
    _host_pytest(lib)
    sh("chmod", "-R", "a+rX", str(lib))
    proc = sh(
        DOCKER, "run", "--rm", "--network", "none", "--entrypoint", "python3",
        "--volume", f"{REPO_ROOT}:/src:ro", "--volume", f"{lib}:/pylib:ro", "--workdir", "/src",
        "--env", "PYTHONPATH=/pylib:/src", "--env", "PYTHONDONTWRITEBYTECODE=1",
        cpu_twin, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--noconftest", "-o", "addopts=",
        "tests/unit/test_fp8_contract.py",
        check=False, timeout=600,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    print(out[-3000:])
    assert proc.returncode == 0, out[-3000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and "skipped" not in out, out[-3000:]  # the torch tests ran, none skipped
    # every test of the module ran: the same count pytest collects here, where 8 of them skip
    assert int(passed.group(1)) == _collected_here(), out[-3000:]


def _collected_here() -> int:
    proc = sh(
        "python3", "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", "-o", "addopts=",
        str(REPO_ROOT / "tests" / "unit" / "test_fp8_contract.py"), check=False, timeout=120,
    )  # fmt: skip
    found = re.search(r"(\d+) tests? collected", proc.stdout + proc.stderr)
    assert found, proc.stdout[-2000:]
    return int(found.group(1))

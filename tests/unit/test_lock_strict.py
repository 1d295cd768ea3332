"""`invoke lock --check --strict`: an unverifiable pin fails with its own exit code (3), drift keeps exit 1, and
the lenient check stays for offline machines. Real git over real HTTP on 127.0.0.1, a registry port where nothing
listens (unreachable on purpose), the real command line."""

from __future__ import annotations

import subprocess
import sys

from preflight_fixtures import fixture_server, write_recipe  # noqa: F401 (pytest fixtures)
from test_preflight_lock import _git_remote

from sparkforge.preflight.lock import EXIT_UNVERIFIED
from sparkforge.recipe.loader import REPO_ROOT

UNREACHABLE = "127.0.0.1:9/nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:" + "a" * 64


def _lock(recipe, *options: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), "lock", "--recipe", str(recipe)]
    return subprocess.run([*argv, *options], capture_output=True, text=True, timeout=120)


def test_strict_fails_on_unverified_pins_lenient_reports_them(server, tmp_path):
    commit = _git_remote(tmp_path, server, "v0.31.0")
    body = {
        "images": {"builder": UNREACHABLE, "runtime": UNREACHABLE},
        "components": {"vllm": {"commit": commit, "repository": f"{server.base}/vllm-project/vllm.git"}},
    }
    recipe = write_recipe(tmp_path, body).path
    lenient = _lock(recipe, "--check")
    assert lenient.returncode == 0, lenient.stderr
    assert "2 pin(s) not verified" in lenient.stdout
    strict = _lock(recipe, "--check", "--strict")
    assert strict.returncode == EXIT_UNVERIFIED == 3, strict.stdout + strict.stderr
    message = strict.stderr.strip()
    assert "2 pin(s) that could not be verified" in message and "images.builder" in message
    assert "components.vllm.commit" not in message  # verified against the served remote
    assert "Traceback" not in strict.stderr and "fix:" in message


def test_strict_keeps_exit_1_for_drift(server, tmp_path):
    _git_remote(tmp_path, server, "v0.33.0")
    # A wheel recipe whose recorded commit is not the release tag's: drift, which outranks "not verified".
    body = {
        "images": {"builder": UNREACHABLE, "runtime": UNREACHABLE},
        "components": {"vllm": {"commit": "b" * 9, "repository": f"{server.base}/vllm-project/vllm.git"}},
    }
    recipe = write_recipe(tmp_path, body, extends="vllm-qwen35-wheels").path
    drifted = _lock(recipe, "--check", "--strict")
    assert drifted.returncode == 1, drifted.stdout + drifted.stderr
    assert "drift" in drifted.stderr

"""One way to install: uv.lock with hashes, used by the README, .ci/run and every workflow; every import declared."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from preflight_fixtures import local_server

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.imagebuild import projectlock
from sparkforge.imagebuild.lint import deptry_argv
from sparkforge.recipe.loader import REPO_ROOT

WORKFLOWS = sorted((REPO_ROOT / ".github" / "workflows").glob("*.yml"))
INSTALL = "bash .ci/install"
# Anything that puts Python packages somewhere other than through .ci/install.
OTHER_INSTALLS = re.compile(r"\bpip3?\s+install\b|-m\s+pip\s+install\b|\buv\s+(pip|sync|add|tool)\b|\bpipx\b")
LOCK_TEXT = projectlock.LOCK.read_text()
CPYTHONS = ("cp311", "cp312", "cp313", "cp314")


def _run_lines(step: dict) -> list[str]:
    return [line.strip() for line in str(step.get("run", "")).splitlines() if line.strip()]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_every_workflow_job_installs_from_the_lock_before_it_runs_python(workflow: Path) -> None:
    for job_name, job in yaml.safe_load(workflow.read_text())["jobs"].items():
        where = f"{workflow.name} job {job_name}"
        lines = [line for step in job.get("steps", []) for line in _run_lines(step)]
        installs = [i for i, line in enumerate(lines) if line.startswith(INSTALL)]
        for i in installs:  # the venv goes on PATH for the job's later steps
            venv = lines[i].split()[-1]
            assert lines[i + 1] == f'echo {venv[:-1]}/bin" >> "${{GITHUB_PATH}}"', (where, lines[i + 1])
        for i, line in enumerate(lines):
            assert not OTHER_INSTALLS.search(line), f"{where}: {line!r} bypasses uv.lock"
            if re.match(r"(sudo .*)?python3? ", line):
                assert installs and installs[0] < i, f"{where}: {line!r} runs before .ci/install"
            if ".ci/run" in line:
                assert not installs, f"{where}: .ci/run installs from the lock itself"


def test_the_install_script_takes_uv_and_every_package_with_hashes_from_the_lock() -> None:
    script = (REPO_ROOT / ".ci" / "install").read_text()
    pip_line = " ".join(script.split("\\\n"))
    assert re.search(
        r"-m pip install .*--require-hashes .*--only-binary=:all: .*-r \"\$root/\.ci/uv\.txt\"", pip_line
    )
    assert re.search(r"uv\" sync .*--locked", script)  # a lock that no longer matches pyproject is refused
    assert len(re.findall(r"pip install", script)) == 1


def test_readme_and_ci_install_only_through_the_script() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]
    assert quick.startswith(f"{INSTALL} && . .venv/bin/activate && invoke engine.up"), quick
    run = (REPO_ROOT / ".ci" / "run").read_text()
    assert not OTHER_INSTALLS.search(run)
    assert f'{INSTALL} "$fresh/venv"' in run and "--collect-only" in run  # the new-venv collection step
    assert re.search(rf"^{re.escape(INSTALL)}\n# .*\n# .*\n\. \.venv/bin/activate$", run, re.M)


def test_uv_bootstrap_requirement_is_the_locks_uv() -> None:
    assert (REPO_ROOT / ".ci" / "uv.txt").read_text() == projectlock.uv_requirement(LOCK_TEXT)
    uv = next(p for p in projectlock.locked_packages(LOCK_TEXT) if p.name == "uv")
    assert {m for name, _ in uv.wheels for m in projectlock.MACHINES if m in name} == set(
        projectlock.MACHINES
    )


def test_every_locked_package_installs_from_a_hashed_wheel_on_both_machines_and_every_python() -> None:
    lock = tomllib.loads(LOCK_TEXT)
    assert lock["requires-python"] == ">=3.11"
    missing = []
    for package in projectlock.locked_packages(LOCK_TEXT):
        assert package.wheels, package
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for _, h in package.wheels), package.name
        names = [name for name, _ in package.wheels]
        if any(n.endswith("-none-any.whl") for n in names):
            continue
        for machine in projectlock.MACHINES:
            for cp in CPYTHONS:
                # a version-specific wheel, an abi3 wheel from an older CPython, or a Python-independent binary
                ok = any(
                    machine in n and "linux" in n and (f"-{cp}-" in n or "-abi3-" in n or "-py3-none-" in n)
                    for n in names
                )
                if not ok:
                    missing.append(f"{package.name}=={package.version} {machine} {cp}")
    # a name locked twice (one version per Python range) needs its wheels only in its own range
    versions = {}
    for p in projectlock.locked_packages(LOCK_TEXT):
        versions.setdefault(p.name, []).append(p)
    missing = [m for m in missing if len(versions[m.split("==")[0]]) == 1]
    assert missing == []


def test_the_lock_matches_pyproject_and_declares_what_the_code_imports() -> None:
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    dev = " ".join(declared["optional-dependencies"]["dev"])
    assert "urllib3" in " ".join(declared["dependencies"])
    for tool in ("cryptography", "pytest-xdist", "deptry", "pip-audit", "uv"):
        assert tool in dev
    locked = subprocess.run(
        [sys.executable, "-m", "uv", "lock", "--check", "--offline", "--project", str(REPO_ROOT)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert locked.returncode == 0, locked.stderr


def test_deptry_is_clean_over_the_package_and_the_tests() -> None:
    result = subprocess.run(deptry_argv(), cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No dependency issues found" in result.stdout + result.stderr


def test_deptry_fails_on_a_transitive_import(tmp_path: Path) -> None:
    # The real configuration, with urllib3 taken out of the declared dependencies: urlfetch.py imports it
    # directly while requests still brings it, which must be an error (DEP003), not a pass.
    text = (REPO_ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(re.sub(r'\n  "urllib3>=[^\n]*', "", text))
    shutil.copytree(
        REPO_ROOT / "sparkforge", tmp_path / "sparkforge", ignore=shutil.ignore_patterns("__pycache__")
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "benchmarks").mkdir()
    result = subprocess.run(deptry_argv(tmp_path), cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1
    assert re.search(r"sparkforge/urlfetch\.py:\d+:\d+: DEP003 'urllib3'", result.stdout + result.stderr)


def test_pin_changes_lists_what_moved() -> None:
    old = {"rich==13.9.4", "pyyaml==6.0.4", "numpy==2.4.6"}
    new = {"rich==15.0.0", "pyyaml==6.0.4", "numpy==2.4.6", "numpy==2.5.5", "urllib3==2.8.0"}
    assert projectlock.pin_changes(old, new) == [
        "+ numpy==2.5.5", "- rich==13.9.4", "+ rich==15.0.0", "+ urllib3==2.8.0",
    ]  # fmt: skip
    assert projectlock.pin_changes(new, new) == []


def test_lock_update_re_resolves_and_shows_the_change(tmp_path: Path) -> None:
    # A copy of the project's metadata and lock; pinning rich lower in pyproject, then re-resolving rich only.
    (tmp_path / ".ci").mkdir()
    (tmp_path / "uv.lock").write_text(LOCK_TEXT)
    text = (REPO_ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text.replace('"rich>=13",', '"rich==13.9.4",'))
    (tmp_path / "README.md").write_text("x\n")
    before = next(p.version for p in projectlock.locked_packages(LOCK_TEXT) if p.name == "rich")
    changes = projectlock.update_lock(
        Session(echo=print, runner=Runner(stream=False)), ["rich"], root=tmp_path
    )
    assert f"- rich=={before}" in changes and "+ rich==13.9.4" in changes, changes
    assert (tmp_path / ".ci" / "uv.txt").read_text() == projectlock.uv_requirement(LOCK_TEXT)


def test_audit_says_not_checked_offline_when_the_service_does_not_answer() -> None:
    said: list[str] = []
    with local_server() as served:  # answers 404 for every release, as this machine's proxy does for PyPI's
        outcome = projectlock.audit_lock(
            Session(echo=said.append, runner=Runner(stream=False)), service=f"{served.base}/pypi"
        )
        assert served.seen, "the service was not asked"
    assert outcome is None
    assert said == [said[0]] and said[0].startswith("pip-audit: not checked: offline (http://127.0.0.1:")
    assert "answered HTTP 404" in said[0]


def test_service_reachability_is_decided_by_the_services_answer() -> None:
    package = projectlock.LockedPackage("rich", "15.0.0", ())
    with local_server() as served:
        served.routes["/pypi/rich/15.0.0/json"] = (200, {"Content-Type": "application/json"}, b"{}")
        assert projectlock.service_unreachable(package, f"{served.base}/pypi") is None
        assert "HTTP 404" in str(projectlock.service_unreachable(package, f"{served.base}/elsewhere"))
        port = served.base.rsplit(":", 1)[1]
    assert "cannot fetch the vulnerability service" in str(
        projectlock.service_unreachable(package, f"http://127.0.0.1:{port}/pypi")
    )

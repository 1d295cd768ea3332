"""`invoke conform --dry` and `invoke bench --dry`: the memory plan, then what would start or load (the launch
of the profile as profiled and the rows in the registry's order; the suite's levels and repeats); no engine is
contacted (a node that cannot exist is fine), nothing starts."""

from __future__ import annotations

import subprocess
import sys

from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run.conform.rows import ROWS


def conform_dry(*extra: str) -> subprocess.CompletedProcess[str]:
    argv = ["conform", "--recipe", "vllm-qwen35-wheels", "--allow-unpinned-model", "--dry", *extra]
    return subprocess.run(
        [sys.executable, "-m", "invoke", *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )


def test_dry_prints_the_plan_and_the_rows_and_starts_nothing() -> None:
    first, *_, last = ROWS.names()
    done = conform_dry(
        "--profile", "qwen35-35b-a3b-fp8", "--checks", f"{last},{first}", "--node", "ssh://me@spark9.invalid"
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "verdict: fits" in out  # the memory plan first
    assert "docker run --detach --pull never --name sparkforge-serve-qwen35-35b-a3b-fp8-0" in out
    rows = [line for line in out.splitlines() if line.startswith("row ")]
    assert rows == [
        f"row 1/2 {first}: {ROWS.get(first).help}",
        f"row 2/2 {last}: {ROWS.get(last).help}",
    ]  # the registry's order, not the order asked
    assert "ssh" not in done.stderr  # the node was never dialled


def test_dry_of_a_two_node_profile_prints_every_nodes_launch() -> None:
    nodes = "unix:///var/run/docker.sock,ssh://me@spark9.invalid"
    done = conform_dry(
        "--profile", "qwen35-122b-a10b-fp8-tp2", "--nodes", nodes, "--interface", "enp1s0f1np1"
    )
    assert done.returncode == 0, done.stderr
    assert "--node-rank 1" in done.stdout and "--node-rank 0" in done.stdout
    assert sum(line.startswith("row ") for line in done.stdout.splitlines()) == len(ROWS.names())


def test_bench_dry_prints_the_levels_it_would_load_and_contacts_nothing() -> None:
    argv = ["bench", "--recipe", "vllm-qwen35-wheels", "--profile", "qwen35-35b-a3b-fp8", "--concurrency", "1,8",
            "--repeats", "3", "--node", "ssh://me@spark9.invalid", "--dry"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "invoke", *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "verdict: fits" in done.stdout
    assert (
        "would load sparkforge-serve-qwen35-35b-a3b-fp8-0 on node0 (ssh://me@spark9.invalid)" in done.stdout
    )
    assert "levels c1-d0, c8-d0; per level a warm-up, then 3 repeats of at least 10 s each" in done.stdout
    assert "ssh" not in done.stderr

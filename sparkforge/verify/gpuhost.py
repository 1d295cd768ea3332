"""The GPU as the host establishes it, outside the image under test, and the suite's account checked against it.

nvidia-smi (mounted in by the NVIDIA runtime) runs in a throwaway container of the recipe's pinned runtime
base image, never in the image being verified: a verify's verdict uses this reading, and the suite's own
report of its GPU only has to agree with it.
"""

from __future__ import annotations

from typing import Any

from sparkforge import engine
from sparkforge.errors import SparkforgeError
from sparkforge.report import Check

GPU_QUERY = ("--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader")
NVIDIA_SMI = "/usr/bin/nvidia-smi"


def host_gpu(probe_image: str, use_gpus: bool, platform: str | None) -> tuple[dict[str, Any] | None, Check]:
    """The GPU as the host sees it (name, capability, driver), read outside the image under test."""
    if not use_gpus:
        return None, Check("gpu-host", "skipped", "no GPU was passed to the container: not GPU-verified")
    try:
        result = engine.run_container(
            probe_image, list(GPU_QUERY), entrypoint=[NVIDIA_SMI], gpus=True, platform=platform, timeout_s=120
        )
    except SparkforgeError as exc:
        result = engine.RunResult(1, "", str(exc))
    gpu = parse_gpu_query(result.stdout) if result.exit_code == 0 else None
    if gpu is None:
        return None, Check(
            "gpu-host",
            "failed",
            f"the host could not read the GPU it passed to the container (nvidia-smi in {probe_image} exited "
            f"{result.exit_code}: {(result.stderr or result.stdout).strip()[-300:]}); fix: check the NVIDIA "
            "runtime ('docker run --rm --gpus all IMAGE nvidia-smi')",
        )
    return gpu, Check("gpu-host", "passed", f"the host passed {gpu['name']} ({gpu['capability']})", gpu)


def parse_gpu_query(output: str) -> dict[str, Any] | None:
    """nvidia-smi's `name,compute_cap,driver_version` CSV (first GPU) -> {name, capability, driver, count}."""
    rows = [[f.strip() for f in ln.split(",")] for ln in output.strip().splitlines() if ln.strip()]
    if not rows or len(rows[0]) != 3 or not rows[0][1].replace(".", "", 1).isdigit():
        return None
    name, capability, driver = rows[0]
    return {"name": name, "capability": capability, "driver": driver, "count": len(rows)}


def compare_gpu(host: dict[str, Any] | None, suite: dict[str, Any] | None) -> Check:
    """The suite's own account of its GPU must be the GPU the host passed in (name, capability, driver)."""
    if host is None:
        claimed = f"; the suite claimed {suite.get('name')} ({suite.get('capability')})" if suite else ""
        return Check("gpu-identity", "skipped", "no GPU identified by the host" + claimed, {"suite": suite})
    if not suite:
        return Check("gpu-identity", "skipped", f"the host passed {host['name']}, the suite saw no GPU", {})
    wrong = {
        key: {"host": host.get(key), "suite": suite.get(key)}
        for key in ("name", "capability", "driver")
        if suite.get(key) is not None and str(suite.get(key)) != str(host.get(key))
    }
    if wrong or suite.get("capability") is None:
        return Check(
            "gpu-identity",
            "failed",
            "the suite reports another GPU than the host passed in ("
            + "; ".join(f"{k}: host {v['host']}, suite {v['suite']}" for k, v in wrong.items())
            + "); the host's reading counts, and this run proves nothing",
            {"mismatched": wrong},
        )
    return Check("gpu-identity", "passed", f"the suite ran on the host's {host['name']}", {"host": host})

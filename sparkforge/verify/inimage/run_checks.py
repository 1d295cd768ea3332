#!/usr/bin/env python3
"""The image test suite: runs inside a built image and prints one JSON document of checks on stdout.

Standard library + what the image ships (torch, transformers, vLLM). Expectations come from the lock file
the image carries (/opt/sparkforge/lock.json), so an image is checked against the recipe it was built from.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checklist
import checks_fp8

MARKER = "SPARKFORGE-CHECKS-JSON:"
# One stderr line as each check starts ("SPARKFORGE-PROGRESS: 3/14 pip-check"): the host shows what runs now.
PROGRESS = "SPARKFORGE-PROGRESS:"


def _check(
    name: str, fn: Callable[[dict[str, Any]], tuple[str, str, dict[str, Any]]], lock: dict[str, Any]
) -> dict:
    start = time.monotonic()
    try:
        status, reason, details = fn(lock)
    except Exception as exc:  # a check that crashes has failed, with its traceback as evidence
        status, reason, details = (
            "failed",
            f"{exc.__class__.__name__}: {exc}",
            {"traceback": traceback.format_exc()},
        )
    return {
        "name": name,
        "status": status,
        "reason": reason,
        "details": details,
        "duration_s": round(time.monotonic() - start, 3),
    }


def check_registry(lock: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    required = list(lock["models"]["architectures"])
    missing = [a for a in required if a not in supported]
    details = {"required": required, "missing": missing, "registered": len(supported)}
    if missing:
        return (
            "failed",
            f"vLLM does not register {', '.join(missing)}; use a vLLM that has them (Qwen3.5: >= 0.17.0)",
            details,
        )
    return (
        "passed",
        f"all {len(required)} required architectures registered ({len(supported)} in total)",
        details,
    )


def _base(version: str) -> str:
    return version.split("+", 1)[0]


def _commit_of_vllm() -> str | None:
    try:
        from vllm import _version

        commit = getattr(_version, "__commit_id__", None) or getattr(_version, "commit_id", None)
    except ImportError:
        commit = None
    if commit:
        return str(commit).removeprefix("g")
    record = Path("/opt/sparkforge/source.json")
    if record.is_file():
        return json.loads(record.read_text()).get("commit")
    return None


def check_versions(lock: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    from importlib.metadata import version

    import torch
    import transformers
    import vllm

    pins = lock["components"]
    problems: list[str] = []
    found = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "vllm": vllm.__version__,
        "vllm_commit": _commit_of_vllm(),
    }
    if _base(torch.__version__) != pins["torch"]["version"]:
        problems.append(f"torch {torch.__version__} != pinned {pins['torch']['version']}")
    cuda_major = lock["cuda"].split(".")[0]
    if not torch.version.cuda or torch.version.cuda.split(".")[0] != cuda_major:
        problems.append(f"torch is built for CUDA {torch.version.cuda}, the recipe needs CUDA {cuda_major}")
    if transformers.__version__ != pins["transformers"]["version"]:
        problems.append(
            f"transformers {transformers.__version__} != pinned {pins['transformers']['version']}"
        )
    if transformers.__version__.split(".")[0] != "5":
        problems.append(f"transformers {transformers.__version__} is not major 5 (Qwen3.5 needs >= 5.2.0)")
    if _base(vllm.__version__) != pins["vllm"]["version"]:
        problems.append(f"vllm {vllm.__version__} != pinned {pins['vllm']['version']}")
    pinned_commit = pins["vllm"].get("commit")
    commit = found["vllm_commit"]
    if pinned_commit and not (
        commit and (pinned_commit.startswith(commit) or commit.startswith(pinned_commit))
    ):
        problems.append(f"vllm commit {commit} != pinned {pinned_commit}")
    flashinfer = pins.get("flashinfer")
    if flashinfer:
        found["flashinfer"] = version(flashinfer.get("package", "flashinfer-python"))
        if found["flashinfer"] != flashinfer["version"]:
            problems.append(
                f"{flashinfer.get('package')} {found['flashinfer']} != pinned {flashinfer['version']}"
            )
    if problems:
        return "failed", "; ".join(problems), found
    return "passed", "torch, CUDA, transformers, vLLM (version and commit) match the lock", found


def check_serve(lock: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """`vllm serve` of a small model mounted into the container, then one completion over HTTP."""
    import subprocess
    import tempfile
    import urllib.request

    model = os.environ.get("SPARKFORGE_SMOKE_MODEL")
    if not model:
        return "skipped", "no model mounted (invoke verify --model-dir DIR mounts one)", {}
    gate = checks_fp8._gate(min_capability=(7, 0))
    if gate is not None:
        return gate
    port = 8765
    argv = [
        "vllm",
        "serve",
        model,
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--gpu-memory-utilization",
        "0.3",
        "--enforce-eager",
    ]
    # A file, not a pipe: an unread pipe fills up and blocks the server. Closed in the finally below.
    log = tempfile.NamedTemporaryFile("w+", prefix="vllm-serve-", suffix=".log")  # noqa: SIM115
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if server.poll() is not None:
                log.seek(0)
                out = log.read()
                return (
                    "failed",
                    f"vllm serve exited {server.returncode} before it was ready",
                    {"log": out[-4000:]},
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(2)
        else:
            return "failed", "vllm serve was not ready within 900 s", {}
        body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 8}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            answer = json.loads(response.read())
        text = answer["choices"][0]["text"]
        if not text.strip():
            return "failed", "the completion came back empty", {"response": answer}
        return "passed", f"served {model} and completed {len(text)} characters", {"text": text}
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def check_pip(lock: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """`pip check`: a dependency conflict in the image fails it (the build only prints pip's report)."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300, check=False
    )
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        conflicts = [ln for ln in output.splitlines() if ln.strip()]
        return (
            "failed",
            f"pip check found {len(conflicts)} conflict(s): {'; '.join(conflicts[:5])}; fix: pin compatible "
            "versions in the recipe",
            {"output": output[-4000:]},
        )
    return "passed", "pip check: no broken requirements", {"output": output[-400:]}


def gpu_info() -> dict[str, Any] | None:
    """The GPU the checks ran on (name, compute capability, driver), or None when none is visible."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    driver = None
    version_file = Path("/proc/driver/nvidia/version")
    if version_file.is_file():
        found = re.search(r"Kernel Module\s+([0-9.]+)", version_file.read_text())
        driver = found.group(1) if found else None
    if driver is None:
        import shutil
        import subprocess

        smi = shutil.which("nvidia-smi")
        if smi:
            query = [smi, "--query-gpu=driver_version", "--format=csv,noheader"]
            out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=False).stdout
            driver = out.strip().splitlines()[0] if out.strip() else None
    return {
        "name": torch.cuda.get_device_name(),
        "capability": f"{major}.{minor}",
        "driver": driver,
        "torch_cuda": torch.version.cuda,
        "count": torch.cuda.device_count(),
    }


def suite() -> list[tuple[str, Callable[[dict[str, Any]], tuple[str, str, dict[str, Any]]]]]:
    """The suite, in order: checklist.CHECKS with each row's function (the host reads the same rows)."""
    import importlib

    return [
        (
            name,
            globals()[function]
            if module == "run_checks"
            else getattr(importlib.import_module(module), function),
        )
        for name, module, function, _ in checklist.CHECKS
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lock", type=Path, default=Path("/opt/sparkforge/lock.json"))
    parser.add_argument("--only", action="append", default=[], help="run only these checks")
    parser.add_argument(
        "--nonce",
        default=os.environ.get("SPARKFORGE_NONCE", ""),
        help="echoed in the report: the host accepts only a report of the run it started",
    )
    args = parser.parse_args()
    names = [name for name, *_ in checklist.CHECKS]
    unknown = [name for name in args.only if name not in names]
    if unknown:  # a typo would run nothing and report nothing failed
        parser.error(f"--only: unknown check {', '.join(unknown)}; choose from {', '.join(names)}")
    lock = json.loads(args.lock.read_text())
    chosen = [(name, fn) for name, fn in suite() if not args.only or name in args.only]
    results = []
    for index, (name, fn) in enumerate(chosen, 1):
        print(f"{PROGRESS} {index}/{len(chosen)} {name}", file=sys.stderr, flush=True)
        results.append(_check(name, fn, lock))
    document = {
        "nonce": args.nonce,
        "checks": results,
        "gpu": gpu_info(),
        "env": {"visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES")},
    }
    print(MARKER + json.dumps(document))
    return 1 if any(r["status"] == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

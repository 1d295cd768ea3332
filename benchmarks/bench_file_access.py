"""Benchmark: which files of an image's venv the in-image suite and vLLM's kernel selection open, traced with
strace inside the containers those commands start; what was never opened, by folder and size.

    SPARKFORGE_CACHE=$(mktemp -d) PYTHONPATH=$PWD python3 benchmarks/bench_file_access.py --image REF \
        [--recipe tests/recipes/ci-wheels-amd64.yaml] [--json benchmarks/results/file_access.json]

How: the host's strace (Debian bookworm, as the image's base) and its libraries are mounted read-only into every
container `invoke verify --gpus none` and `invoke kernels` run, started through the image's own loader so only
strace sees them (the suite, then vLLM's selection for every profile in profiles/); `-f -e trace=open,openat,execve -e status=successful` logs every file opened, mapped (dlopen
opens first) or run, in every process (nvcc, ptxas and g++ of the JIT checks too). The file list is read from
the layer store. A GPU-less run never dlopens what only a GPU reaches (cuDNN's engine libraries, NCCL's
plugins, FlashInfer's cubins): "never opened" here is a candidate list, not a proof; each removal keeps its own
reason in the recipe.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from sparkforge import engine
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.verify.imagefs import image_tree

TRACE_MOUNT = "/opt/sparkforge-trace"
LOADER = "/lib64/ld-linux-x86-64.so.2"
STRACE_LIBS = ("libunwind-ptrace.so.0", "libunwind-x86_64.so.8", "libunwind.so.8", "liblzma.so.5")
SYSCALL = re.compile(r'^(?:\[pid +\d+\] |\d+ +)?(?:open|openat|execve)\((?:[A-Z_]+, )?"([^"]+)"')
SITE = re.compile(r"(?:^|/)(?:site|dist)-packages/")


def _trace_dir(root: Path) -> Path:
    """The host's strace and the libraries it needs beyond the image's libc, in one folder."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy2("/usr/bin/strace", root / "strace")
    for name in STRACE_LIBS:
        shutil.copy2(Path("/lib/x86_64-linux-gnu") / name, root / name)
    return root


def traced(trace: Path, opened: list[str], runs: list[dict[str, Any]]):
    """engine.run_container, with every container's command run under strace; paths collected in `opened`."""
    original = engine.run_container

    def run(image: str, command, *, entrypoint=None, volumes=None, **kwargs):
        argv = [*(entrypoint or []), *command]
        wrapped = ["--library-path", TRACE_MOUNT, f"{TRACE_MOUNT}/strace", "-f", "-qq", "-s", "4096"]
        wrapped += ["-e", "trace=open,openat,execve", "-e", "status=successful", *argv]
        start = time.monotonic()
        result = original(
            image,
            wrapped,
            entrypoint=[LOADER],
            volumes={**(volumes or {}), str(trace): TRACE_MOUNT},
            **kwargs,
        )
        paths = [m.group(1) for m in map(SYSCALL.match, result.stderr.splitlines()) if m]
        opened.extend(paths)
        runs.append({"argv": argv[:3], "exit": result.exit_code, "opened": len(paths),
                     "seconds": round(time.monotonic() - start, 1)})  # fmt: skip
        return result

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", required=True)
    parser.add_argument("--recipe", default=str(REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"))
    parser.add_argument("--json", default=str(REPO_ROOT / "benchmarks" / "results" / "file_access.json"))
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--opened", help="also write every opened venv path here (1-2 MB)")
    args = parser.parse_args()

    from sparkforge.verify import kernels_run, suite

    recipe = load_recipe(args.recipe)
    opened: list[str] = []
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sparkforge-trace-") as tmp:
        run = traced(_trace_dir(Path(tmp) / "strace"), opened, runs)
        engine.run_container = run  # every container verify and kernels start, traced
        report = suite.verify_image(recipe, args.image, gpus="none", kernels=False)
        kernels = {}
        for profile in sorted((REPO_ROOT / "profiles").glob("*.yaml")):  # vLLM's selection for each profile
            ask = kernels_run.selection_input(str(profile), "", "")
            kernels[profile.stem] = kernels_run.for_target(args.image, recipe.model.gpu, recipe.model.audit.require,
                                                           recipe=recipe.name, ask=ask).status  # fmt: skip
    seen = {p.lstrip("/") for p in opened}
    tree = image_tree(args.image)
    assert tree is not None, "the image's layer store is not readable here"
    venv = [f for f in tree.files if SITE.search(f.path)]
    never = [f for f in venv if f.path not in seen]
    by_folder: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for f in venv:
        rel = SITE.split(f.path, 1)[1]
        parts = rel.split("/")
        key = "/".join(parts[:3] if parts[0] == "nvidia" else parts[:2] if len(parts) > 2 else parts[:1])
        row = by_folder[key]
        row[0] += f.size
        if f.path not in seen:
            row[1] += f.size
            row[2] += 1
    folders = sorted(by_folder.items(), key=lambda kv: -kv[1][1])
    out = {
        "image": args.image,
        "runs": runs,
        "verify": {c.name: c.status for c in report.checks},
        "kernels": kernels,
        "venv_bytes": sum(f.size for f in venv),
        "opened_venv_bytes": sum(f.size for f in venv if f.path in seen),
        "never_opened_bytes": sum(f.size for f in never),
        "folders": [
            {"folder": k, "bytes": v[0], "never_opened_bytes": v[1], "never_opened_files": v[2]}
            for k, v in folders[: args.top]
        ],
        "largest_never_opened": [
            {"path": f.path, "bytes": f.size} for f in sorted(never, key=lambda f: -f.size)[: args.top]
        ],
        "opened_count": len([p for p in seen if SITE.search(p)]),
    }
    if args.opened:
        Path(args.opened).write_text("\n".join(sorted(p for p in seen if SITE.search(p))) + "\n")
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

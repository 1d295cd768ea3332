"""Benchmark: image size by layer and CUDA libraries shipped twice, and the kernel audit from the layer store vs
the export stream, on images already in the local engine. Writes benchmarks/results/size.json.

    python benchmarks/bench_size.py --image before=REF --image after=REF [--runs 3] [--export-runs 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.verify import imagefs
from sparkforge.verify.size import size_report

CI_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"
RESULTS = REPO_ROOT / "benchmarks" / "results" / "size.json"


def _audit_times(ref: str, reader: str, runs: int, require: list[str]) -> tuple[list[float], dict[str, Any]]:
    times, summary = [], {}
    for _ in range(runs):
        start = time.monotonic()
        report = imagefs.audit_image(ref, "sm_121", require, reader=reader)
        times.append(round(time.monotonic() - start, 2))
        summary = {
            "status": report.status,
            "by_verdict": report.extra["summary"]["by_verdict"],
            "libraries": {lib["path"]: lib["verdict"] for lib in report.extra["libraries"]},
        }
    return times, summary


def measure(name: str, ref: str, runs: int, export_runs: int) -> dict[str, Any]:
    require = list(load_recipe(str(CI_RECIPE)).model.audit.require)
    start = time.monotonic()
    report = size_report(ref)
    size = report.extra["size"]
    out: dict[str, Any] = {
        "image": ref,
        "size_report_s": round(time.monotonic() - start, 2),
        "image_bytes": size["image_bytes"],
        "hidden_bytes": size["hidden_bytes"],
        "files": size["files"],
        "layers": [{k: v for k, v in layer.items() if k != "diff_id"} for layer in size["layers"]],
        "cuda_twice": [d for d in size["duplicates"] if d["cuda"]],
        "packages_top": size["packages"][:12],
    }
    layer_times, layer_summary = _audit_times(ref, "layers", runs, require)
    out["kernels_layers_s"] = layer_times
    out["kernels_layers_median_s"] = statistics.median(layer_times)
    if export_runs:
        export_times, export_summary = _audit_times(ref, "export", export_runs, require)
        out["kernels_export_s"] = export_times
        out["same_verdicts"] = export_summary == layer_summary
    out["kernels"] = {"status": layer_summary["status"], "by_verdict": layer_summary["by_verdict"]}
    print(name, json.dumps({k: out[k] for k in ("image_bytes", "kernels_layers_s", "kernels_export_s")
                            if k in out}), flush=True)  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", action="append", required=True, help="NAME=REF")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--export-runs", type=int, default=1)
    args = parser.parse_args()
    results = {"machine": platform.machine(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for item in args.image:
        name, ref = item.split("=", 1)
        results[name] = measure(name, ref, args.runs, args.export_runs)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

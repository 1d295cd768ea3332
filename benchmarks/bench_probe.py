"""Wall time and memory of the compile probe for a recipe, as CI runs it (vLLM's sdist served on 127.0.0.1).

Usage: python benchmarks/bench_probe.py [--recipe tests/recipes/ci-probe-amd64.yaml] [--no-cache]
        [--base-image sparkforge-base/debian-bookworm:amd64] [--out benchmarks/results/probe_<recipe>.json]
Records the probe's total wall time, each unit's compile time and peak memory (summed RSS of the compile's
process tree and the largest single process), the configure time, and the machine's load before and after
(the development machine is shared: other builds run at the same time).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import platform
import shutil
import tempfile
import threading
import time
from pathlib import Path

from sparkforge.imagebuild.probe import ProbeOptions, run_probe
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.preflight.pypi import resolve_file
from sparkforge.recipe.loader import REPO_ROOT, load_recipe


def serve_sdist(root: Path) -> str:
    fetcher = make_fetcher()
    dist = resolve_file(fetcher, "vllm", "0.31.0", wheel=None)
    shutil.copyfile(fetcher.download(dist.url, what=dist.filename, sha256=dist.sha256), root / "vllm.tar.gz")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/vllm.tar.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipe", default=str(REPO_ROOT / "tests/recipes/ci-probe-amd64.yaml"))
    parser.add_argument("--base-image", default="sparkforge-base/debian-bookworm:amd64")
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    with tempfile.TemporaryDirectory() as tmp:
        url = serve_sdist(Path(tmp))
        load_before = os.getloadavg()
        start = time.monotonic()
        result = run_probe(
            recipe,
            ProbeOptions(
                base_image=args.base_image,
                sources={"vllm": url},
                network="host",
                no_cache=args.no_cache,
                log_root=Path(tmp) / "logs",
            ),
        )
        wall = time.monotonic() - start
    report = result.report.to_dict()
    configure = next((c for c in report["checks"] if c["name"] == "configure"), {})
    out = {
        "recipe": recipe.name,
        "status": report["status"],
        "no_cache": args.no_cache,
        "wall_s": round(wall, 1),
        "configure_s": configure.get("duration_s"),
        "units": report.get("units", []),
        "unit_peak_gb": result.unit_peak_gb,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "failed": [(c["name"], c["reason"][:300]) for c in report["checks"] if c["status"] == "failed"],
    }
    path = Path(args.out or REPO_ROOT / f"benchmarks/results/probe_{recipe.name}.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

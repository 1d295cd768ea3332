"""What verifying every byte costs `--weights shared`: the head's manifest (sha256 of every file) cold and
cached, a peer's pull with verification, and a rerun that only re-hashes what is already there.

Usage: python benchmarks/bench_weights.py [--mib 512] [--out benchmarks/results/weights.json]
Both programs are the in-image ones (sparkforge/run/weights/weightscripts.py), run as processes on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sparkforge.run.weights.weightscripts import pull_args, serve_args


def _serve(root: Path, cache: Path) -> tuple[subprocess.Popen[str], dict, float]:
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, *serve_args(str(root), "127.0.0.1", 0, "s" * 64, str(cache / "model.json"))],
        stdout=subprocess.PIPE,
        text=True,
    )
    event = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
    return proc, event, time.monotonic() - start


def _pull(event: dict, dest: Path) -> tuple[dict, float]:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, *pull_args(f"http://{event['address']}", str(dest), "s" * 64, event["manifest"])],
        capture_output=True, text=True, check=True, env={**os.environ, "SPARKFORGE_PROGRESS_S": "60"},
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1]), time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--out", default="benchmarks/results/weights.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp:
        root = Path(tmp) / "models--bench--model"
        (root / "blobs").mkdir(parents=True)
        (root / "snapshots" / "r").mkdir(parents=True)
        for index in range(4):
            (root / "blobs" / f"w{index}").write_bytes(os.urandom(args.mib << 18))  # 4 files of mib/4
            (root / "snapshots" / "r" / f"model-{index}.safetensors").symlink_to(f"../../blobs/w{index}")
        cache = Path(tmp) / ".sparkforge-manifests"
        server, event, cold = _serve(root, cache)
        server.terminate()
        server.wait()
        server, event, warm = _serve(root, cache)
        try:
            first, pull_s = _pull(event, Path(tmp) / "peer")
            second, verify_s = _pull(event, Path(tmp) / "peer")
        finally:
            server.terminate()
            server.wait()
    result = {
        "mib": args.mib,
        "manifest_cold_s": round(cold, 2),
        "manifest_cached_s": round(warm, 2),
        "pull_s": round(pull_s, 2),
        "pull_mb_s": round(first["moved"] / 1e6 / pull_s, 1),
        "rerun_verify_only_s": round(verify_s, 2),
        "rerun_moved": second["moved"],
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
        "python": platform.python_version(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

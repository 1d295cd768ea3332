#!/usr/bin/env python3
"""The in-image suite run directly on a GPU host (no Docker there) against its torch, judged by sparkforge's rule.

Used on the H200 of the device machine: `python3 benchmarks/gpu_suite.py --lock benchmarks/results/ci-wheels-amd64.lock.json
--out DIR`. It runs sparkforge/verify/inimage/run_checks.py with the CI test recipe's lock, applies the `--gpus all` rule and
sparkforge.evidence.gpu_verdict, writes the verify record the way `invoke verify` does, and saves one result JSON.
Standard library + sparkforge.evidence/records (no pydantic, no Docker).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparkforge.verify import evidence, verified  # noqa: E402

MARKER = "SPARKFORGE-CHECKS-JSON:"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lock = json.loads(args.lock.read_text())
    suite = ROOT / "sparkforge" / "verify" / "inimage"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(suite / "run_checks.py"), "--lock", str(args.lock)],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    wall = time.monotonic() - start
    line = next(ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(MARKER))
    document = json.loads(line[len(MARKER) :])
    checks = evidence.require_gpu_checks(document["checks"])  # as `invoke verify --gpus all` does
    verdict = evidence.gpu_verdict(checks, document["gpu"], lock["gpu"])
    status = (
        "failed"
        if any(c["status"] == "failed" for c in checks) or evidence.suite_problems(checks)
        else "passed"
    )
    # The same record `invoke verify` keeps per image ID; here the "image" is this host's environment.
    fake_id = "sha256:" + "0" * 63 + "1"
    record_dir = args.out / "verified"
    verified.write_record(
        fake_id,
        {"status": status, "checks": checks, "gpu": document["gpu"], "gpu_verified": verdict.to_dict()},
        record_dir,
    )
    result = {
        "what": "the in-image suite (sparkforge/verify/inimage) run directly on the GPU host against its torch, with the CI test recipe's lock",
        "host": platform.node(),
        "lock_recipe": lock["recipe"],
        "recipe_gpu": lock["gpu"],
        "gpu": document["gpu"],
        "suite_sha256": evidence.suite_digest(suite),
        "suite_exit_code": proc.returncode,
        "wall_s": round(wall, 2),
        "status": status,
        "gpu_verified": verdict.to_dict(),
        "gpu_verified_record": verified.is_gpu_verified(verified.read_record(fake_id, record_dir)),
        "checks": [{k: c[k] for k in ("name", "status", "reason", "duration_s")} for c in checks],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "verify_gpu_h200.json").write_text(json.dumps(result, indent=2) + "\n")
    for check in result["checks"]:
        print(f"{check['name']:24} {check['status']:8} {check['reason'][:140]}")
    print("verdict:", verdict.reason)
    print("GPU-verified record:", result["gpu_verified_record"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

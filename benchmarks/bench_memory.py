"""The memory plan's cache arithmetic against vLLM's own, run in an image (no GPU, no weights).

Usage: python3 benchmarks/bench_memory.py --image sparkforge-candidate/ci-cpu-twin:TAG > benchmarks/results/memory.json
For each shipped checkpoint config (profiles/checkpoints/<org>/<name>/<revision>.json) and tensor-parallel size 1 and 2,
tests/image/vllm_memory.py runs in a throwaway container (--network none, the script and input mounted
read-only) and prints what vLLM computes: the full-attention page of one token, the gated-delta-net state page,
KV heads per rank; the host-side plan (sparkforge/run/memory/kvcache.py) computes the same quantities; the
relative difference of each is reported (benchmarks/memory.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from sparkforge.run.memory.checkpoint import parse_architecture  # noqa: E402
from sparkforge.run.memory.kvcache import attn_bytes_per_token, state_bytes  # noqa: E402

SCRIPT = REPO / "tests" / "image" / "vllm_memory.py"


def ask_vllm(image: str, config: dict, tp: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        request = Path(tmp) / "request.json"
        request.write_text(json.dumps({"config": config, "tp": tp}))
        proc = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3",
             "--env", "VLLM_TARGET_DEVICE=cpu",
             "--volume", f"{SCRIPT}:/opt/vllm_memory.py:ro", "--volume", f"{request}:/opt/request.json:ro",
             image, "/opt/vllm_memory.py", "/opt/request.json"],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr).strip()[-1500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", required=True)
    args = parser.parse_args()
    rows = []
    for path in sorted((REPO / "profiles" / "checkpoints").rglob("*.json")):
        config = json.loads(path.read_text())
        arch = parse_architecture(config, str(path.relative_to(REPO)))
        for tp in (1, 2):
            vllm = ask_vllm(args.image, config, tp)
            ours = {"attn_page_bytes_per_token": attn_bytes_per_token(arch, tp, "auto"),
                    "state_page_bytes": state_bytes(arch, tp, 0)}  # fmt: skip
            diff = {
                k: (abs(ours[k] - vllm[k]) / vllm[k] if vllm.get(k) else None)
                for k in ours
                if "error" not in vllm
            }
            rows.append(
                {"checkpoint": path.name, "tp": tp, "vllm": vllm, "plan": ours, "relative_difference": diff}
            )
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(json.dumps({"image": args.image, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

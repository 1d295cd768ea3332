"""Time of the TUF client and writer against a real local registry (Debian's docker-registry on 127.0.0.1).

Usage: python benchmarks/bench_tuf.py [--moves 20] [--repeats 5] [--out benchmarks/results/tuf.json]
Measures: a move (refresh, sign targets/snapshot/timestamp with ed25519, write three artifacts, read back), a
refresh on a warm machine (nothing new), and a refresh on a fresh machine (empty cache: root from the dev root,
then timestamp, snapshot, targets) after `--moves` moves. Medians of `--repeats`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import pytest

from sparkforge.registry import tufclient, tufrepo
from tests.engine.registry import local_registry
from tests.unit.tuf_fixtures import digest, start_tuf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/tuf.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, local_registry(Path(tmp) / "registry") as local:
        patch = pytest.MonkeyPatch()
        repo = f"{local.host}/sparkforge/bench"
        world = start_tuf(local, repo, Path(tmp), patch)
        quiet = lambda _: None  # noqa: E731
        moves = []
        for n in range(args.moves):
            start = time.perf_counter()
            tufrepo.move_tag(repo, world.target("latest", digest(2 * n + 1), digest(2 * n + 2)))
            moves.append(time.perf_counter() - start)
        warm, fresh = [], []
        for n in range(args.repeats):
            start = time.perf_counter()
            tufclient.refresh(repo, warn=quiet)
            warm.append(time.perf_counter() - start)
            world.machine(f"fresh-{n}")
            start = time.perf_counter()
            state = tufclient.refresh(repo, warn=quiet)
            fresh.append(time.perf_counter() - start)
            world.machine("publisher")
        result = {
            "moves": args.moves,
            "move_s_median": round(statistics.median(moves), 3),
            "move_s_max": round(max(moves), 3),
            "refresh_warm_s_median": round(statistics.median(warm), 3),
            "refresh_fresh_s_median": round(statistics.median(fresh), 3),
            "targets_version": state.version,
            "history_entries": len(state.tags["latest"].history),
            "cpu_count": os.cpu_count(),
            "load_1min": os.getloadavg()[0],
        }
        patch.undo()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

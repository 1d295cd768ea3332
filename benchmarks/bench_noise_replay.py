"""The committed bench noise study replayed through the current comparison rule (no engine, no server).

Usage (reads benchmarks/results/bench_noise/{final,quiet}/, a few minutes on 2 cores):
  python3 benchmarks/bench_noise_replay.py > benchmarks/results/bench_noise_replay.json
  python3 benchmarks/bench_noise_replay.py --markdown      # the table in bench-noise.md
What it measures, per study (`final`: the busy machine, study 3; `quiet`: study 2), from the result files as the
live study wrote them (3 baseline benches, 10 unchanged reruns, 3 repeats a level):
- false alarms: each unchanged rerun against the pooled baseline (base-0,1,2) and against base-0 alone; and the
  larger sample: every pooled baseline of 3 of the 13 unchanged results against every other one (2,860), and
  every ordered pair of them with one baseline (156);
- detection: the same comparisons with a slowdown planted in the new result: every repeat's throughputs scaled
  by (1 - p) and its latencies by (1 + p), p = 10/20/30/40 %, so the planted change rides on the real noise;
- the live planted results (CPU quota cut, `--max-num-seqs 1`) against the pooled baseline.
A comparison is `caught`/`flagged` when its verdict is regressed; `inconclusive` is counted apart.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from sparkforge.run.bench.compare import compare_docs, pool  # noqa: E402
from sparkforge.run.bench.noise import METRICS  # noqa: E402

STUDIES = {"final": "busy (study 3)", "quiet": "quiet (study 2)"}
PLANTED = (0.10, 0.20, 0.30, 0.40)
THRESHOLD = 10.0
ROOT = REPO / "benchmarks" / "results" / "bench_noise"


def load_study(name: str) -> tuple[list[dict], list[dict], dict[str, dict]]:
    """(baselines, reruns, live planted results) of one study, as committed."""
    folder = ROOT / name
    read = lambda stem: json.loads((folder / f"{stem}.json").read_text())  # noqa: E731
    planted = {"--cpus 1.8": "cpus-1.8", "--cpus 1.6": "cpus-1.6", "--cpus 1.4": "cpus-1.4",
               "--max-num-seqs 1": "planted"}  # fmt: skip
    return (
        [read(f"base-{i}") for i in range(3)],
        [read(f"rerun-{i}") for i in range(10)],
        {k: read(v) for k, v in planted.items()},
    )


def plant(doc: dict[str, Any], slowdown: float) -> dict[str, Any]:
    """The result with every repeat slowed by `slowdown` (0.3: throughputs x 0.7, latencies x 1.3)."""
    out = copy.deepcopy(doc)
    for check in out["checks"]:
        for repeat in check["details"]["repeats"]:
            for metric, higher in METRICS.items():
                if metric in repeat:
                    repeat[metric] *= (1 - slowdown) if higher else (1 + slowdown)
    return out


def verdict(old: dict[str, Any], new: dict[str, Any], allow: bool = False) -> str:
    """The comparison's verdict: regressed, inconclusive or passed."""
    return compare_docs(old, new, ("old", "new"), THRESHOLD, allow_different=allow).extra["verdict"]


def tally(verdicts: list[str]) -> dict[str, Any]:
    n = len(verdicts)
    counts = {v: verdicts.count(v) for v in ("regressed", "inconclusive", "passed")}
    return {"n": n, **counts, "regressed_pct": round(100 * counts["regressed"] / n, 1) if n else None}


def replay(name: str, *, large: bool = True) -> dict[str, Any]:
    """Every figure of one study (large=False skips the 2,860-comparison samples)."""
    baselines, reruns, live = load_study(name)
    pooled = pool([(f"base-{i}", b) for i, b in enumerate(baselines)])
    out: dict[str, Any] = {
        "study": STUDIES[name],
        "threshold_pct": THRESHOLD,
        "reruns": {},
        "live_planted": {},
    }
    for p in (0.0, *PLANTED):
        news = [plant(r, p) if p else r for r in reruns]
        out["reruns"][f"{round(p * 100)}%"] = {
            "pooled_baseline": tally([verdict(pooled, n) for n in news]),
            "one_baseline": tally([verdict(baselines[0], n) for n in news]),
        }
    for label, doc in live.items():
        out["live_planted"][label] = verdict(pooled, doc, allow=label.startswith("--max-num-seqs"))
    if large:
        unchanged = [*baselines, *reruns]
        out["every_pooled_3_vs_every_other"] = {}
        out["every_ordered_pair_one_baseline"] = {}
        pools = {
            trio: pool([(str(i), unchanged[i]) for i in trio])
            for trio in itertools.combinations(range(13), 3)
        }
        for p in (0.0, *PLANTED):
            news = [plant(u, p) if p else u for u in unchanged]
            key = f"{round(p * 100)}%"
            out["every_pooled_3_vs_every_other"][key] = tally(
                [verdict(pools[t], news[j]) for t in pools for j in range(13) if j not in t]
            )
            out["every_ordered_pair_one_baseline"][key] = tally(
                [verdict(unchanged[i], news[j]) for i in range(13) for j in range(13) if i != j]
            )
    return out


def markdown(results: dict[str, dict[str, Any]]) -> list[str]:
    """The table in bench-noise.md: regressed verdicts (caught) of each sample, per planted slowdown."""
    rows = [
        "| study | comparison | unchanged (false alarms) | 10 % | 20 % | 30 % | 40 % |",
        "|---|---|---|---|---|---|---|",
    ]
    samples = (
        ("reruns", "pooled_baseline", "10 reruns vs pooled baseline of 3"),
        ("reruns", "one_baseline", "10 reruns vs one baseline (base-0)"),
        ("every_pooled_3_vs_every_other", None, "every pooled 3 vs every other (2,860)"),
        ("every_ordered_pair_one_baseline", None, "every ordered pair, one baseline (156)"),
    )
    for res in results.values():
        for key, sub, label in samples:
            if key not in res:
                continue
            cells = []
            for p in ("0%", "10%", "20%", "30%", "40%"):
                t = res[key][p][sub] if sub else res[key][p]
                cells.append(
                    f"{t['regressed']} of {t['n']}"
                    + (f" ({t['regressed_pct']:.1f} %)" if t["n"] > 10 else "")
                )
            rows.append(f"| {res['study']} | {label} | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the table for bench-noise.md")
    parser.add_argument("--quick", action="store_true", help="skip the 2,860-comparison samples")
    args = parser.parse_args()
    results = {name: replay(name, large=not args.quick) for name in STUDIES}
    if args.markdown:
        print("\n".join(markdown(results)))
    else:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

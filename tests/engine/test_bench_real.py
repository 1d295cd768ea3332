"""`invoke bench` for real, both suites, against one served CPU twin: vLLM's own client and llama-benchy.

No mock: the twin image sparkforge built serves the tiny trained Qwen3.5-MoE (the conform tests' session model;
serve checks its known answer) through vLLM's OpenAI server (tests/profiles/cpu-tiny-qwen35moe-bench.yaml); `vllm bench serve` (default suite) and the pinned llama-benchy
wheel from PyPI (spark-arena-v2 suite) run inside it at small sizes (prompt 128 / generate 32, depth 0 and 512,
concurrency 1 and 2, repeats 2); the files they write are read by their documented keys. Then the store,
bench.history, bench.compare (equal results pass, a different suite is refused) and bench.report's page.
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from real_fixtures import TWIN_RECIPE, cpu_twin, trained_model  # noqa: F401

from sparkforge.recipe.loader import REPO_ROOT

# CI budget (tests/engine/ci_budget.py): cost on a fresh CI machine once the core suite built the twin; benchmarks/ci.md.
pytestmark = [
    pytest.mark.engine,
]
PROFILE = str(REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe-bench.yaml")
PORT = "18481"
SIZES = (
    "--concurrency",
    "1,2",
    "--depth",
    "0,512",
    "--input-len",
    "128",
    "--output-len",
    "32",
    "--repeats",
    "2",
)
TIMINGS: dict[str, float] = {}


def invoke(*args: str, timeout: float = 1800) -> tuple[int, str]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    TIMINGS[args[0] + (f" {args[args.index('--suite') + 1]}" if "--suite" in args else "")] = round(
        time.monotonic() - start, 1
    )
    out = proc.stdout + proc.stderr
    print(f"$ invoke {' '.join(args)}\n{out}")
    return proc.returncode, out


def corpus(path: Path) -> Path:
    """A local book for llama-benchy (the machine cannot reach Project Gutenberg): the project's own docs."""
    path.write_text((REPO_ROOT / "docs" / "reference.md").read_text())  # long enough for its prompts
    return path


@pytest.fixture(scope="module")
def served(cpu_twin: str, trained_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cache = tmp_path_factory.mktemp("bench-cache")
    code, out = invoke(
        "serve", "--recipe", TWIN_RECIPE, "--profile", PROFILE, "--image", cpu_twin, "--gpus", "none",
        "--model-dir", str(trained_model), "--cache-dir", str(cache), "--port", PORT, "--ulimit", "nofile=16384",
    )  # fmt: skip
    try:
        assert code == 0, out[-3000:]
        assert "answer: 28 27 26 25 24 23 22 21 20 19 18 17 16 15 14 13\n" in out, out[-3000:]
        yield cpu_twin
    finally:
        invoke("serve.down", "--profile", Path(PROFILE).stem)
        print(f"bench test timings (s): {TIMINGS}")


def _bench(suite: str, store: Path, out: Path, *extra: str) -> dict:
    code, text = invoke(
        "bench", "--recipe", TWIN_RECIPE, "--profile", PROFILE, "--suite", suite, *SIZES,
        "--store", str(store), "--json", str(out), *extra,
    )  # fmt: skip
    assert code == 0, text[-4000:]
    assert "stored: " in text and "Traceback" not in text
    return json.loads(out.read_text())


def _levels_measured(doc: dict, metrics: set[str], rounds: int = 2) -> None:
    assert [c["name"] for c in doc["checks"]] == ["c1-d0", "c2-d0", "c1-d512", "c2-d512"]
    for check in doc["checks"]:
        d = check["details"]
        assert check["status"] == "passed" and len(d["repeats"]) == rounds, check
        assert metrics <= set(d["summary"]), d["summary"]
        for metric in metrics:
            s = d["summary"][metric]
            assert 0 < s["min"] <= s["median"] <= s["max"], (check["name"], metric, s)


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.cells: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append(dict(attrs).get("src") or "")

    def handle_data(self, data: str) -> None:
        self.cells.append(data)


@pytest.mark.must_run
@pytest.mark.slow(
    cost_s=250, rank=5, reason="a served twin (42 s), then both suites measured, compared and charted (146 s)"
)
def test_both_suites_measure_store_compare_and_chart(served: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    # --duration 3: each level's prompts scaled from its warm-up; --target-detect 11 cannot be reached with a few
    # repeats on the twin: more rounds run until the budget would be exceeded, and say so
    default = _bench("default", store, tmp_path / "default.json", "--num-prompts", "4", "--duration", "3",
                     "--target-detect", "11", "--budget", "150")  # fmt: skip
    target = default["stopping"]["target_detect"]
    # How many rounds fit in the budget depends on the machine's load (3-5 seen): the rule is that it stopped
    # on the budget, ran more than the first round, and says why.
    assert target["stopped"] == "budget" and target["rounds"] >= 2 and target["widest_floor_pct"] > 11, target
    _levels_measured(default, {"output_tok_s", "request_output_tok_s", "ttft_ms", "itl_ms"}, target["rounds"])
    assert set(default["stopping"]["prompts_per_run"]) == {"c1-d0", "c2-d0", "c1-d512", "c2-d512"}
    assert all(n >= 4 for n in default["stopping"]["prompts_per_run"].values())
    for check in default["checks"]:  # each repeat ran about --duration or longer (scaled from a cold warm-up)
        assert statistics.median(r["duration_s"] for r in check["details"]["repeats"]) >= 1.5, check
    ident = default["identity"]
    assert (
        default["schema"] == 2
        and default["model"] == "tiny-qwen35moe"
        and default["suite"]["name"] == "default"
    )
    assert (
        ident["vllm"] == "0.32.0"
        and len(ident["recipe_hash"]) == 64
        and ident["image"]["id"].startswith("sha256:")
    )
    assert ident["serve"]["argv"][0] == "serve" and "--max-num-seqs" in ident["serve"]["argv"]
    assert ident["serve"]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1" and ident["model"]["revision"].startswith(
        "config-"
    )
    assert ident["hardware"]["machine"] == "x86_64" and ident["hardware"]["gpus"] == []
    assert default["speculative"] is None  # the twin runs no speculative decoding: no acceptance counted
    # interleaved rounds with fresh prompts: every run its own seed; each repeat says the outside load it ran beside
    seeds = [s for c in default["checks"] for s in c["details"]["seeds"]]
    assert (
        len(seeds) == len(set(seeds)) == 4 * target["rounds"]
        and default["suite"]["params"]["order"] == "interleaved rounds"
    )
    assert all(0 <= r["outside_cpu_pct"] <= 100 for c in default["checks"] for r in c["details"]["repeats"])

    arena = _bench(
        "spark-arena-v2", store, tmp_path / "arena.json", "--corpus", str(corpus(tmp_path / "book.txt"))
    )
    _levels_measured(arena, {"output_tok_s", "request_output_tok_s", "ttft_ms", "prefill_tok_s"})
    assert (
        arena["suite"]["client"] == "llama-benchy" and arena["suite"]["params"]["client_version"] == "0.4.0"
    )
    assert (
        arena["suite"]["corpus"]["seeded_from"] == "book.txt"
        and len(arena["suite"]["corpus"]["sha256"]) == 64
    )

    assert len(list(store.glob("sha256-*/*.json"))) == 2  # both kept under the image's key
    code, out = invoke("bench.history", "--recipe", TWIN_RECIPE, "--store", str(store))
    assert code == 0 and out.count(ident["image"]["id"][:19]) == 2 and "spark-arena-v2" in out

    # The same result twice (a copy: one file named as both sides is refused as a mistake): ratio 1 exactly.
    shutil.copyfile(tmp_path / "default.json", tmp_path / "default-again.json")
    code, out = invoke("bench.compare", str(tmp_path / "default.json"), str(tmp_path / "default-again.json"))
    assert code == 0 and "c2-d512:output_tok_s" in out and "ratio 1.000 [" in out, out
    assert "verdict: " in out and "could detect" in out and "REGRESSED" not in out
    code, out = invoke("bench.compare", str(tmp_path / "default.json"), str(tmp_path / "arena.json"))
    assert code == 1 and "different suites measure different things" in out and "Traceback" not in out

    html = tmp_path / "report.html"
    code, out = invoke(
        "bench.report", f"{tmp_path / 'default.json'}", "--html", str(html), "--png", str(tmp_path / "png")
    )
    assert code == 0, out
    page = _Page()
    page.feed(html.read_text())
    assert len(page.images) == 2 and all(src.startswith("data:image/png;base64,") for src in page.images)
    assert (tmp_path / "png" / "by-concurrency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow(
    cost_s=600,
    rank=60,
    reason="two tags of the twin benched in turn, A B A B: four serves and four quick benches (estimated, not yet "
    "measured)",
)
def test_two_local_images_benched_interleaved_then_compared(
    cpu_twin: str, trained_model: Path, tmp_path: Path
) -> None:
    """`bench --baseline A --image B`: two tags of the twin image, each served, benched and stopped in the order
    A B A B (one server at a time), every result stored with its pairing, then the pooled comparison."""
    old, new = f"{cpu_twin}-abab-a", f"{cpu_twin}-abab-b"
    for tag in (old, new):
        subprocess.run(["docker", "tag", cpu_twin, tag], check=True, timeout=60)
    profile = tmp_path / "cpu-tiny-qwen35moe-abab.yaml"  # its own name and port beside the module's server
    profile.write_text(Path(PROFILE).read_text())
    store, out = tmp_path / "store", tmp_path / "pair.json"
    try:
        code, text = invoke(
            "bench", "--recipe", TWIN_RECIPE, "--profile", str(profile), "--baseline", old, "--image", new,
            "--benches", "2", "--suite", "quick", "--repeats", "2", "--no-warmup", "--duration", "1",
            "--gpus", "none", "--model-dir", str(trained_model), "--cache-dir", str(tmp_path / "cache"),
            "--port", "18483", "--ulimit", "nofile=16384", "--store", str(store), "--json", str(out),
            timeout=2400,
        )  # fmt: skip
    finally:
        invoke("serve.down", "--profile", profile.stem)
        subprocess.run(["docker", "rmi", old, new], check=False, timeout=60)
    assert "Traceback" not in text and "order ABAB (interleaved)" in text, text[-4000:]
    # One image under two tags: no regression can be real (exit 1 only on one).
    assert code == 0 and "REGRESSED" not in text, text[-4000:]
    said = [line for line in text.splitlines() if line.startswith("bench ") and "/4: " in line]
    assert [line.split()[2] for line in said] == ["baseline", "candidate", "baseline", "candidate"], said
    stored = sorted(store.glob("sha256-*/*.json"))
    docs = [json.loads(p.read_text()) for p in stored]
    assert len(docs) == 4 and {d["pairing"]["order"] for d in docs} == {"ABAB"}
    assert sorted((d["pairing"]["position"], d["pairing"]["role"]) for d in docs) == [
        (1, "baseline"), (2, "candidate"), (3, "baseline"), (4, "candidate"),
    ]  # fmt: skip
    assert all(c["status"] == "passed" for d in docs for c in d["checks"])
    report = json.loads(out.read_text())
    assert report["command"] == "bench.compare" and report["pairing"]["interleaved"] is True
    assert (
        len(report["pairing"]["results"]["baseline"]) == 2 == len(report["pairing"]["results"]["candidate"])
    )
    throughput = next(c for c in report["checks"] if c["name"].endswith(":output_tok_s"))
    assert throughput["details"]["benches_old"] == 2 and throughput["details"]["n_new"] == 4, throughput

"""Load suites: what each one runs (client, sizes, levels) and the exact client command lines.

The suites are the rows of SUITES (name, one line, the sizes); `--suite`, its help and the table in docs/run.md are
generated from it. `spark-arena-v2` is the field's profile (Spark Arena's benchmark v2, llama-benchy pinned); its
depth list is our reading of "0 to 100k" (powers of two from 4k, then 100k): it is recorded with the result.
Every size can be overridden (tests run prompt 128 / generate 32); what ran is recorded in the result's `suite`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

from sparkforge.errors import RunError
from sparkforge.extensions import Entry, Registry

LLAMA_BENCHY = "llama-benchy"
LLAMA_BENCHY_VERSION = "0.4.0"
# bench --harness aiperf (aiperf.py; its lock: tools/aiperf-<version>.txt)
AIPERF, AIPERF_VERSION = "aiperf", "0.13.0"
# The pinned clients' versions, recorded per result (vLLM's client: the served image's vLLM).
CLIENT_VERSIONS = {LLAMA_BENCHY: LLAMA_BENCHY_VERSION, AIPERF: AIPERF_VERSION}
# The PyPI wheels llama-benchy runs from (pure Python), by their sha256 on PyPI. Its other requirements (aiohttp,
# numpy, openai, pydantic, requests, tokenizers, transformers) are vLLM's own; tabulate is not.
CLIENT_WHEELS = (
    (
        "llama_benchy",
        LLAMA_BENCHY_VERSION,
        "9d380f97bd5ef39b03ed2f319f1ee3bdf5c983463f6ce1479f432e90db079410",
    ),
    ("tabulate", "0.9.0", "024ca478df22e9340661486f85298cff5f6dcdba14f3813e8830015b9ed1948f"),
)
LLAMA_BENCHY_BOOK = "https://www.gutenberg.org/files/1661/1661-0.txt"  # its default corpus (Sherlock Holmes)
RESULT_DIR = "/tmp/sparkforge-bench"
MARK = "SPARKFORGE-RUN "
# One process, every run: vLLM's own benchmark entry point, its own argument parser; one JSON line per run.
# Around each run it also reads how much CPU the rest of the machine used (the host's /proc/stat busy time minus this
# container's cgroup usage, as a percent of all CPUs): the outside load the run was measured under.
# A run with "scale_to_s" (a level's warm-up) sets how many times that level's later runs multiply their prompts so
# that each lasts at least that many seconds (capped at MAX_SCALE); each line says the prompts a run sent.
MAX_SCALE = 32
VLLM_DRIVER = f"""
import json, math, os, sys, time
def cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    own = None
    try:  # cgroup v2, else v1's cpuacct (nanoseconds)
        with open("/sys/fs/cgroup/cpu.stat") as f:
            own = int(dict(line.split() for line in f)["usage_usec"]) / 1e6
    except (OSError, KeyError, ValueError):
        try:
            with open("/sys/fs/cgroup/cpuacct/cpuacct.usage") as f:
                own = int(f.read()) / 1e9
        except (OSError, ValueError):
            pass
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK"), own, time.monotonic()
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
keys = ("completed", "failed", "output_throughput", "median_ttft_ms", "median_itl_ms", "output_lens", "ttfts", "itls",
        "spec_decode_acceptance_rate", "spec_decode_acceptance_length", "duration")
scale = {{}}
for run in json.loads(sys.argv[1]):
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = list(run["argv"])
    at = argv.index("--num-prompts") + 1
    argv[at] = str(int(argv[at]) * scale.get(run["level"], 1))
    try:
        before = cpu()
        main(parser.parse_args(argv))
        after = cpu()
        with open("{RESULT_DIR}/" + run["name"] + ".json") as f:
            result = json.load(f)
        line = {{"run": run["name"], "ok": True, "result": {{k: result.get(k) for k in keys}}, "num_prompts": int(argv[at])}}
        took = result.get("duration") or 0
        if run.get("scale_to_s") and took > 0:
            scale[run["level"]] = max(1, min({MAX_SCALE}, math.ceil(run["scale_to_s"] / took)))
        if before[1] is not None and after[1] is not None and after[2] > before[2]:
            outside = (after[0] - before[0]) - (after[1] - before[1])
            line["outside_cpu_pct"] = max(0.0, 100 * outside / ((after[2] - before[2]) * os.cpu_count()))
    except (Exception, SystemExit) as exc:
        line = {{"run": run["name"], "ok": False, "error": repr(exc)[-400:]}}
    print("{MARK}" + json.dumps(line), flush=True)
"""


@dataclass(frozen=True)
class Suite:
    """A load profile: the client and the sizes/levels it runs at."""

    name: str
    client: str  # "vllm bench serve" | "llama-benchy" | "aiperf" (bench --harness aiperf)
    input_len: int
    output_len: int
    depths: tuple[int, ...]
    concurrencies: tuple[int, ...]
    num_prompts: int = (
        0  # vLLM's client: prompts per run (at least the concurrency); llama-benchy: one per slot
    )
    seed: int = 0

    def params(self) -> dict[str, Any]:
        data = asdict(self)
        data["depths"], data["concurrencies"] = list(self.depths), list(self.concurrencies)
        if self.client in CLIENT_VERSIONS:
            data["client_version"] = CLIENT_VERSIONS[self.client]
        return data

    def levels(self) -> list[tuple[int, int]]:
        """(concurrency, depth) pairs, depth-major as the clients run them."""
        return [(c, d) for d in self.depths for c in self.concurrencies]


# The suites, in the order help and docs list them; a row's function builds the named suite (overrides apply after).
SUITES: Registry[Callable[[str], Suite]] = Registry(
    "bench suite",
    "--suite",
    [
        Entry(
            "default",
            "vLLM's own client (vllm bench serve): prompt 512 / generate 128, concurrency 1 and 4, 16 prompts",
            partial(
                Suite,
                client="vllm bench serve",
                input_len=512,
                output_len=128,
                depths=(0,),
                concurrencies=(1, 4),
                num_prompts=16,
            ),
        ),
        Entry(
            "quick",
            "the same client, one level: prompt 128 / generate 32, concurrency 1, 4 prompts (a smoke figure)",
            partial(
                Suite,
                client="vllm bench serve",
                input_len=128,
                output_len=32,
                depths=(0,),
                concurrencies=(1,),
                num_prompts=4,
            ),
        ),
        Entry(
            "spark-arena-v2",
            f"the field's profile (Spark Arena v2), llama-benchy {LLAMA_BENCHY_VERSION}: prompt 2048 / "
            "generate 128, concurrency 1/2/5/10, depths 0 to 100k",
            partial(
                Suite,
                client=LLAMA_BENCHY,
                input_len=2048,
                output_len=128,
                depths=(0, 4096, 8192, 16384, 32768, 65536, 100000),
                concurrencies=(1, 2, 5, 10),
            ),
        ),
    ],
    RunError,
    columns=("suite", "what it runs", "key"),
)


def level_name(concurrency: int, depth: int) -> str:
    return f"c{concurrency}-d{depth}"


def _positive(what: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RunError(f"bench: {what} {value!r} is not a whole number >= 1; fix: pass e.g. {what} 1")
    return value


def parse_levels(what: str, text: str, minimum: int) -> tuple[int, ...]:
    """A comma-separated list of whole numbers (>= minimum), e.g. '1,2,5'; a one-paragraph error otherwise."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(int(p) for p in parts if p)
    except ValueError:
        values = ()
    if not values or any(v < minimum for v in values) or any(not p for p in parts):
        raise RunError(
            f"bench: {what} {text!r} is not a comma-separated list of whole numbers >= {minimum}; "
            f"fix: pass e.g. {what} {minimum},{minimum + 1}"
        )
    if len(set(values)) != len(values):
        raise RunError(f"bench: {what} {text!r} lists a value twice; fix: list each value once")
    return values


def choose_suite(name: str, **overrides: Any) -> Suite:
    """The named suite with the given sizes overriding its own (None: keep the suite's)."""
    chosen = {k: v for k, v in overrides.items() if v not in (None, "", 0, ())}
    suite = replace(SUITES.get(name).run(name), **chosen)
    _positive("--input-len", suite.input_len)
    _positive("--output-len", suite.output_len)
    if suite.client != LLAMA_BENCHY:
        _positive("--num-prompts", suite.num_prompts)
    if not suite.concurrencies or not suite.depths:
        raise RunError("bench: an empty list of concurrencies or depths; fix: pass e.g. --concurrency 1,2")
    return suite


def check_repeats(repeats: int) -> int:
    if isinstance(repeats, float) and not math.isfinite(repeats):
        raise RunError(f"bench: --repeats {repeats!r}; fix: pass a whole number >= 1 (default 3)")
    return _positive("--repeats", repeats)


def _finite(what: str, value: Any, example: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise RunError(
            f"bench: {what} {value!r} is not a finite number >= 0; fix: pass e.g. {what} {example}"
        )
    return number


def check_seconds(what: str, value: Any, *, zero: bool = False) -> float:
    """Seconds: a finite number > 0 (>= 0 with zero=True), e.g. --duration 10, --budget 1800."""
    seconds = _finite(what, value, "10" if zero else "1800")
    if not zero and seconds == 0:
        raise RunError(f"bench: {what} 0 leaves no time; fix: pass a number of seconds > 0, e.g. {what} 1800")
    return seconds


def check_percent(what: str, value: Any) -> float:
    """A percent > 0 and < 100 (a slowdown a bench should be able to detect), e.g. --target-detect 20."""
    pct = _finite(what, value, "20")
    if not 0 < pct < 100:
        raise RunError(
            f"bench: {what} {value!r} is not a percent between 0 and 100; fix: pass e.g. {what} 20"
        )
    return pct


def run_order(suite: Suite, repeats: int, warmup: bool) -> list[tuple[tuple[int, int], str]]:
    """(level, tag) in the order they run: interleaved rounds, not level by level.

    A warm-up round over every level (discarded), then round r1 over every level, then r2, ... Each level's
    repeats are thereby spread over the whole bench: a burst of load from outside slows one repeat of several
    levels (the ranges widen) instead of every repeat of one level (which the noise rule must read as that
    level regressing). The first level after a server start is warmed at full size like every other.
    """
    tags = (["warmup"] if warmup else []) + [f"r{i + 1}" for i in range(repeats)]
    return [(level, tag) for tag in tags for level in suite.levels()]


def vllm_argv(
    suite: Suite, model: str, tokenizer: str, port: str, level: tuple[int, int], run: str, seed: int
) -> list[str]:
    """`vllm bench serve` arguments (after `vllm bench serve`) for one run of one level.

    Every run (warm-up included) sends the level's full prompt count; `seed` is the run's own (runner.py): no run
    re-sends an earlier run's prompts, so none is served from a prefix cache another run filled (the depth's
    shared prefix is still shared by the requests of one run, as it should be).
    """
    concurrency, depth = level
    prompts = max(suite.num_prompts, concurrency)
    return [
        "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
        "--random-input-len", str(suite.input_len), "--random-output-len", str(suite.output_len),
        "--random-prefix-len", str(depth), "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--seed", str(seed), "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99", "--save-result", "--save-detailed", "--result-dir", RESULT_DIR,
        "--result-filename", f"{run}.json", "--disable-tqdm",
    ]  # fmt: skip


def benchy_argv(suite: Suite, model: str, tokenizer: str, port: str, warmup: bool, out: str) -> list[str]:
    """llama-benchy's arguments for one round of the suite: every level, its own warm-up and one run each.

    The runner starts it once per repeat (round), so that, as with vLLM's client, each level's repeats are
    spread over the whole bench (run_order); llama-benchy itself would run a level's runs back to back.

    `--exact-tg` (min_tokens + ignore_eos) keeps output lengths fixed; `--skip-coherence` because answers are
    checked by `invoke conform`, and a random-weight test model cannot pass a coherence question.
    """
    return [
        "--base-url", f"http://127.0.0.1:{port}/v1", "--model", model, "--served-model-name", model,
        "--tokenizer", tokenizer, "--pp", str(suite.input_len), "--tg", str(suite.output_len),
        "--depth", *map(str, suite.depths), "--concurrency", *map(str, suite.concurrencies),
        "--runs", "1", *([] if warmup else ["--no-warmup"]), "--exact-tg", "--skip-coherence", "--latency-mode", "api",
        "--book-url", LLAMA_BENCHY_BOOK, "--format", "json", "--save-result", out,
    ]  # fmt: skip

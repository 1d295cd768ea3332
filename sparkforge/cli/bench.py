"""Invoke tasks `bench` and `bench.compare` (thin: the work is in sparkforge.run.bench and run.benchcompare)."""

from __future__ import annotations

from pathlib import Path

from invoke import Collection, Context, task
from invoke.exceptions import Exit

from sparkforge.cli import echo, finish_report, user_errors


@task(
    help={
        "recipe": "recipe name in recipes/ or path to a recipe file (its hash is recorded)",
        "profile": "serve profile name in profiles/ or path; it must be running (invoke serve / cluster.up)",
        "image": "accepted for symmetry with serve; the running container's own image is what is recorded",
        "json": "write the results here (a report: one check per concurrency, provenance at the top level)",
        "node": "the engine the profile's head runs on (default: the local one)",
        "concurrency": "comma-separated concurrencies, one vllm bench serve run each (default 1,4)",
        "num_prompts": "prompts per concurrency (at least the concurrency)",
        "input_len": "random dataset: input tokens per prompt",
        "output_len": "random dataset: output tokens per prompt (exact: --ignore-eos)",
        "seed": "random dataset seed",
    }
)
@user_errors
def bench(
    c: Context,
    recipe: str,
    profile: str,
    image: str = "",
    json: str = "",
    node: str = "",
    concurrency: str = "1,4",
    num_prompts: int = 16,
    input_len: int = 128,
    output_len: int = 64,
    seed: int = 0,
) -> None:
    """vLLM's own benchmark client against a served profile: TTFT, ITL, tok/s per concurrency, with provenance."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.bench import BenchOptions, run_bench, table
    from sparkforge.run.nodes import LOCAL, NodeEngine, parse_node

    try:
        levels = tuple(int(x) for x in concurrency.split(",") if x.strip())
    except ValueError:
        raise Exit(f"sparkforge: --concurrency {concurrency!r}: use numbers, e.g. 1,4,8", code=2) from None
    if not levels or min(levels) < 1:
        raise Exit(f"sparkforge: --concurrency {concurrency!r}: use numbers >= 1, e.g. 1,4,8", code=2)
    options = BenchOptions(levels, num_prompts, input_len, output_len, seed)
    engine = NodeEngine(parse_node(node) if node else LOCAL)
    report = run_bench(
        engine, load_profile(profile), options, echo=echo, recipe_hash=load_recipe(recipe).hash
    )
    for line in table(report):
        echo(line)
    extra = report.extra
    chosen = {kind: entry["names"] for kind, entry in extra["backends"].items()}
    echo(f"vLLM {extra['vllm']}, image {extra['image']['id'][:19]}, backends {chosen or 'none logged'}")
    finish_report(report, json, hint="a concurrency run failed; see its reason above")


@task(
    name="compare",
    help={"threshold": "percent a metric may get worse before the comparison fails (default 10)"},
)
@user_errors
def bench_compare(c: Context, old: str, new: str, threshold: float = 10.0, json: str = "") -> None:
    """Compare two bench results; non-zero exit on a regression beyond the threshold, naming what differs."""
    from sparkforge.run.benchcompare import compare

    report = compare(Path(old), Path(new), threshold)
    differ = report.extra["differences"]
    for key, sides in differ.items():
        echo(f"differs: {key}: {sides['old']} -> {sides['new']}")
    finish_report(
        report, json, hint="a metric regressed beyond the threshold; 'differs' above says what changed"
    )


ns = Collection("bench")
ns.add_task(bench, "bench", default=True)
ns.add_task(bench_compare, "compare")

"""Invoke tasks `bench`, `bench.compare`, `bench.history`, `bench.report` (thin: the work is in
sparkforge.run.bench)."""

from __future__ import annotations

import json as _json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Collection, Context

from sparkforge.cli import LazyHelp, finish_report, task, user_errors
from sparkforge.cli.families import DRY, JSON, Family, Option, Outputs, opt
from sparkforge.cli.launchflags import FORCE, ITERABLE, MOUNTS, NODE, SERVER, START, launch
from sparkforge.context import Session

if TYPE_CHECKING:
    from sparkforge.run.launchplan import LaunchFlags

STORE_HELP = "result store directory (default $SPARKFORGE_BENCH_STORE or ~/.cache/sparkforge/bench)"

# Upper bounds of bench's numbers: far above any run on a Spark, low enough that a typo is refused, not run.
MAX_CONCURRENCY = 4096
MAX_TOKENS = 1 << 20  # prompt, output and context depth in tokens
MAX_PROMPTS = 1_000_000
MAX_REPEATS = 100
MAX_BENCHES = 50  # per image in a two-image run (--benches)
MAX_RESULTS = 32  # result files in one compare or report
MAX_THRESHOLD = 1000  # percent


def suites():
    """The bench suites' registry, imported when asked."""
    from sparkforge.run.bench.suites import SUITES

    return SUITES


@dataclass(frozen=True)
class BenchFlags:
    """bench's own flags (as given: words, checked by `bench_options`)."""

    json: str = opt("", "also write the result here (it is always kept in the result store)")
    suite: str = opt("default", LazyHelp(lambda: suites().help_text("the load profile (default: default):")))
    repeats: str = opt(
        "5",
        "measured runs per level after a warm-up (default 5, the fewest that give bench.compare a usable interval); their spread is the noise the comparison reads",
    )
    duration: str = opt(
        "10",
        "vLLM's client: each repeat lasts at least this many seconds (default 10): a level's prompts per run are multiplied from its warm-up's duration (0: the suite's prompt count as is)",
    )
    target_detect: str = opt(
        "",
        "keep running rounds until a comparison with an equal bench could detect a slowdown of this percent in every metric (80% power, at --threshold), or --budget ends; says which",
    )
    budget: str = opt("1800", "with --target-detect: the most seconds the bench runs (default 1800)")
    threshold: str = opt(
        "10", "with --target-detect or --baseline: the threshold bench.compare uses (default 10)"
    )
    concurrency: str = opt("", "comma-separated concurrencies (default: the suite's)")
    depth: str = opt("", "comma-separated context depths in tokens (default: the suite's)")
    input_len: str = opt("", "prompt tokens (default: the suite's)")
    output_len: str = opt("", "generated tokens, exact (default: the suite's)")
    num_prompts: str = opt("", "vLLM's client: prompts per run (at least the concurrency)")
    corpus: str = opt(
        "", "spark-arena-v2 on a machine without the internet: a local text used as llama-benchy's book"
    )
    store: str = opt("", STORE_HELP)
    no_warmup: bool = opt(False, "skip the warm-up run of each level")
    performance: str = opt(
        "",
        "also write NVIDIA's performance file of this run here (docs/formats.md; read back by bench.baseline)",
    )
    harness: str = opt(
        "suite", LazyHelp(lambda: harnesses().help_text("who sends the load (default: suite):"))
    )
    baseline: str = opt(
        "",
        "an image to compare --image against: bench serves each in turn with the profile (both must be local), "
        "benches it, stops it, then compares the two (exit 1 on a regression)",
    )
    benches: str = opt(
        "3", "with --baseline: benches of each image (default 3), pooled per image in the comparison"
    )
    no_interleave: bool = opt(
        False,
        "with --baseline: every baseline bench first, then every candidate bench (default: interleaved, "
        "A B A B ..., so the machine's drift falls on both)",
    )


def harnesses():
    """The bench harnesses' registry, imported when asked."""
    from sparkforge.run.bench.harnesses import HARNESSES

    return HARNESSES


BENCH = Family.of(BenchFlags, "benching")
# bench loads a server that already runs: the image is only named (the running container's own is recorded)
BENCH_IMAGE = Family(
    "image",
    (
        Option(
            "image",
            "",
            "with --baseline: the candidate image, served in turn with the baseline; without: accepted for "
            "symmetry with serve (the running container's own image is what is recorded)",
        ),
    ),
)


# Launch flags that only shape a server bench starts: without --baseline, bench measures a running server and
# they would do nothing, so they are refused rather than silently ignored.
_START_ONLY = (
    "hf_token_file",
    "cache_dir",
    "gpus",
    "ulimit",
    "hf_endpoint",
    "allow_unpinned_model",
    "weights",
    "trust_remote_code",
)


def _refuse_start_flags(flags: LaunchFlags) -> None:
    """Refuse the start-only flags given without --baseline (each compared with LaunchFlags' default)."""
    from dataclasses import fields

    from sparkforge.errors import InputError

    defaults = {f.name: f.default for f in fields(flags) if f.name in _START_ONLY}
    given = [name for name, default in defaults.items() if getattr(flags, name) not in (default, None, ())]
    if given:
        named = ", ".join("--" + name.replace("_", "-") for name in given)
        raise InputError(
            f"bench: {named} shape(s) a server bench starts, and without --baseline bench measures the one already "
            "running; fix: give them to `invoke serve` (or cluster.up), or add --baseline OLD --image NEW"
        )


@task(
    families=(DRY, launch(BENCH_IMAGE, NODE, MOUNTS, SERVER, START, FORCE), BENCH),
    iterable=ITERABLE,
    help={
        "recipe": "recipe name in recipes/ or path to a recipe file (its hash is recorded)",
        "profile": "serve profile name in profiles/ or path; it must be running (invoke serve / cluster.up)",
        "node": "the engine the profile's head runs on (default: the local one)",
        "dry": "print the memory plan, the suite's levels and sizes, the repeats and the server it would load "
        "(with --baseline: the order of the two images' benches); contact nothing",
    },
)
@user_errors
def bench(
    c: Context, session: Session, recipe: str, profile: str, flags: LaunchFlags, benching: BenchFlags
) -> None:
    """A load suite against a served profile: per level the median and min..max of the repeats, with identity."""
    import os

    from sparkforge.errors import InputError
    from sparkforge.run.bench.runner import run_bench, table
    from sparkforge.run.bench.store import save
    from sparkforge.run.launchplan import plan_task
    from sparkforge.run.launchrun import check_launch
    from sparkforge.run.memory.guard import judge_memory
    from sparkforge.run.nodes import NodeEngine

    options = bench_options(benching)  # every input checked before any engine or server is contacted
    if benching.baseline:
        return _two_images(session, (recipe, profile), flags, benching, options)
    if benching.no_interleave:
        raise InputError(
            "bench: --no-interleave orders the benches of two images; fix: add --baseline OLD --image NEW, or drop it"
        )
    _refuse_start_flags(flags)
    plan = plan_task(recipe, profile, flags, os.environ, starts=False)
    check_launch(session, plan)
    judge_memory(session, plan.memory, plan.profile.name, flags.force, plan.memory_refusal)
    engine = NodeEngine(plan.nodes[0])
    if session.runner.dry:
        return _dry_run(session, options, engine.node.label, plan.profile.name)
    report = run_bench(session, engine, plan.profile, replace(options, recipe_hash=plan.recipe.hash))
    for line in table(report):
        session.out(line)
    target = report.extra["stopping"].get("target_detect")
    if target:
        session.out(
            f"--target-detect {target['pct']:g}%: {target['stopped']} after {target['rounds']} rounds (widest floor "
            f"{target['widest_floor_pct']}% at {target['widest']})"
        )
    ident = report.extra["identity"]
    chosen_backends = {kind: entry["names"] for kind, entry in report.extra["backends"].items()}
    session.out(
        f"vLLM {ident['vllm']}, image {ident['image']['id'][:19]}, backends {chosen_backends or 'none logged'}"
    )
    if report.extra["speculative"]:
        spec = report.extra["speculative"]
        session.out(
            f"speculative decoding: acceptance {spec['acceptance_rate']:.2%}, mean acceptance length "
            f"{spec['mean_acceptance_length']:.2f} (decode_steps_s = output_tok_s / that)"
        )
    stored = save(report.to_dict(), _json.dumps(report.to_dict(), indent=2) + "\n", benching.store or None)
    session.out(f"stored: {stored}")
    if benching.performance:  # NVIDIA's performance file (run/bench/nvperf.py)
        from sparkforge.run.bench.nvperf import write_performance

        written = write_performance(report.to_dict(), Path(benching.performance))
        session.out(f"performance file: {written}")
    finish_report(report, benching.json, hint="a level failed; see its reason above")


def bench_options(given: BenchFlags):
    """bench's own flags checked (numbers as ASCII digits in range, the corpus a regular file, the JSON path
    writable) into the runner's options; refused before any engine or server is contacted."""
    from sparkforge.boundary import check_input, check_output, parse_int, parse_int_list
    from sparkforge.errors import RunError
    from sparkforge.run.bench.compare import check_threshold
    from sparkforge.run.bench.rounds import Target
    from sparkforge.run.bench.runner import BenchOptions
    from sparkforge.run.bench.suites import (
        check_percent,
        check_repeats,
        check_seconds,
        choose_suite,
        parse_levels,
    )

    check_output(given.json, "--json")
    check_output(given.performance, "--performance")
    # Numbers as ASCII digits in range ('1_0', '٣', '²' refused: Python's int() reads the first two as 10 and 3).
    sizes = {
        name: parse_int(f"--{name.replace('_', '-')}", text, low=1, high=high) if text else None
        for name, text, high in (
            ("input_len", given.input_len, MAX_TOKENS),
            ("output_len", given.output_len, MAX_TOKENS),
            ("num_prompts", given.num_prompts, MAX_PROMPTS),
        )
    }
    runs = parse_int("--repeats", given.repeats, low=1, high=MAX_REPEATS)
    levels = {
        name: parse_levels(
            f"--{name}", ",".join(map(str, parse_int_list(f"--{name}", text, low=low, high=high))), low
        )
        if text
        else None
        for name, text, low, high in (
            ("concurrency", given.concurrency, 1, MAX_CONCURRENCY),
            ("depth", given.depth, 0, MAX_TOKENS),
        )
    }
    if given.corpus:
        check_input(given.corpus, "--corpus", 256 << 20)  # a regular file (not a FIFO or /dev/zero)
    chosen = choose_suite(given.suite, concurrencies=levels["concurrency"], depths=levels["depth"], **sizes)
    target = (
        Target(
            check_percent("--target-detect", given.target_detect),
            check_threshold(given.threshold),
            check_seconds("--budget", given.budget),
        )
        if given.target_detect
        else None
    )
    if target is not None and target.pct <= target.threshold_pct:
        raise RunError(
            f"bench: --target-detect {given.target_detect} is not above --threshold {given.threshold}: no "
            "comparison at that threshold flags a slowdown below it; fix: pass a target above the threshold (e.g. "
            "--target-detect 20)"
        )
    harness = harnesses().get(given.harness).name  # an unknown name: refused naming every row
    if harness != "suite":  # the result records the harness as its client (and its version: Suite.params)
        chosen = replace(chosen, client=harness)
    return BenchOptions(
        chosen,
        check_repeats(runs),
        not given.no_warmup,
        Path(given.corpus) if given.corpus else None,
        min_duration_s=check_seconds("--duration", given.duration, zero=True),
        target=target,
        harness=harness,
    )


def _dry_run(session: Session, options, node: str, profile: str, *, serves: bool = False) -> None:
    """bench --dry: what would run against which server, every input already checked; nothing contacted.
    `serves`: a two-image run, which starts the server of each bench itself."""
    from sparkforge.run.bench.runner import head_container

    suite = options.suite
    levels = ", ".join(f"c{c}-d{d}" for c, d in suite.levels())
    session.echo(
        f"bench --dry: would serve {profile} on {node} for each bench below, bench it, and stop it"
        if serves
        else f"bench --dry: would load {head_container(profile)} on {node} (start it first: invoke serve / cluster.up)"
    )
    session.echo(
        f"suite {suite.name} ({suite.client}): prompt {suite.input_len} / generate {suite.output_len} tokens; "
        f"levels {levels}; per level {'a warm-up, then ' if options.warmup else ''}{options.repeats} repeats"
        + (
            f" of at least {options.min_duration_s:g} s each"
            if options.min_duration_s and suite.client == "vllm bench serve"
            else ""
        )
    )
    if options.target is not None:
        session.echo(
            f"--target-detect {options.target.pct:g}%: more rounds until the smallest detectable slowdown is below "
            f"it at --threshold {options.target.threshold_pct:g}%, or {options.target.budget_s:g} s"
        )


def _two_images(
    session: Session, names: tuple[str, str], flags: LaunchFlags, benching: BenchFlags, options
) -> None:
    """bench --baseline OLD --image NEW: both launches planned and checked, the schedule printed (--dry: only
    that), then every bench in order (run/bench/pairrun.py) and the comparison; exit 1 on a regression."""
    import os

    from sparkforge.boundary import parse_int
    from sparkforge.errors import InputError
    from sparkforge.recipe.plan import check_reference
    from sparkforge.run.bench.compare import check_threshold
    from sparkforge.run.bench.pairing import plan_pairs
    from sparkforge.run.launchplan import plan_task
    from sparkforge.run.launchrun import check_launch, check_profile, opt_ins

    check_reference("--baseline", benching.baseline)
    if not flags.image:
        raise InputError(
            f"bench: --baseline {benching.baseline} needs the image to compare with it; fix: add --image NEW"
        )
    benches = parse_int("--benches", benching.benches, low=1, high=MAX_BENCHES)
    threshold = check_threshold(benching.threshold)
    pair = plan_pairs(benching.baseline, flags.image, benches, interleave=not benching.no_interleave)
    recipe, profile = names
    launches = {
        image: plan_task(recipe, profile, replace(flags, image=image), os.environ, dry=session.runner.dry)
        for image in (pair.baseline, pair.candidate)
    }
    for plan in launches.values():
        check_launch(session, plan)
    check_profile(session, launches[pair.candidate])
    opt_ins(session, launches[pair.candidate])
    head = launches[pair.candidate]
    if session.runner.dry:
        _dry_run(session, options, head.nodes[0].label, head.profile.name, serves=True)
        for line in pair.lines():
            session.echo(line)
        return None
    from sparkforge.run.bench.pairrun import compare_pairs, run_pairs

    results = run_pairs(session, pair, launches, options, benching.store or None)
    report = compare_pairs(pair, results, threshold, benching.store or None)
    session.out(
        f"order {pair.order()} ({'interleaved' if pair.interleave else 'in blocks, --no-interleave'})"
    )
    return _comparison_out(session, report, benching.json, fail_inconclusive=False)


def _comparison_out(session: Session, report, json_path: str, *, fail_inconclusive: bool) -> None:
    """A comparison's lines, its JSON where asked, and the exit: 1 on a regression, 2 when inconclusive and
    `fail_inconclusive`."""
    from invoke import Exit

    for key, sides in report.extra["allowed_differences"].items():
        session.out(f"NOT ALIKE (--allow-different): {key}: {sides['old']} -> {sides['new']}")
    for key, sides in report.extra["differences"].items():
        session.out(f"differs: {key}: {sides['old']} -> {sides['new']}")
    width = max([len(ch.name) for ch in report.checks] + [5])
    session.out(f"bench.compare {report.subject} (threshold {report.extra['threshold_pct']:g}%):")
    for check in report.checks:
        session.out(f"  {check.name:<{width}}  {check.reason}")
    from sparkforge.run.bench.compare import verdict_line

    line = verdict_line(report)
    session.out(line)
    if json_path:
        report.write_json(Path(json_path))
        session.out(f"report: {json_path}")
    if report.extra["verdict"] == "regressed":
        failed = ", ".join(ch.name for ch in report.failed)
        raise Exit(f"sparkforge: bench.compare failed ({failed}); {line}", code=1)
    if report.extra["verdict"] == "inconclusive" and fail_inconclusive:
        raise Exit(f"sparkforge: bench.compare inconclusive (--fail-inconclusive); {line}", code=2)


def _threshold(text: str) -> None:
    """--threshold as the boundary reads numbers (ASCII only: float() takes '1_0' and '٣'), in (0, 1000]."""
    from sparkforge.boundary import check_number
    from sparkforge.errors import InputError

    try:
        check_number("--threshold", text, low=0, high=MAX_THRESHOLD, low_open=True)
    except InputError:
        raise InputError(
            f"bench.compare: --threshold {text[:40]!r} is not a finite percent > 0 (up to {MAX_THRESHOLD}, in ASCII "
            "digits); fix: pass e.g. --threshold 10 (a metric may get 10% worse, beyond the noise, before the "
            "comparison fails)"
        ) from None


def _result_paths(option: str, text: str) -> list[Path]:
    """Result files named on the command line: no empty entry, none twice (pooled twice it would count double),
    at most MAX_RESULTS."""
    from sparkforge.errors import InputError

    parts = [p.strip() for p in str(text).split(",")]
    if not text or any(not p for p in parts):
        raise InputError(f"{option} {text!r}: an empty entry; fix: list result files separated by one comma")
    if len(parts) > MAX_RESULTS:
        raise InputError(f"{option}: {len(parts)} files, at most {MAX_RESULTS}; fix: name fewer results")
    seen: dict[Path, str] = {}
    for part in parts:
        real = Path(part).resolve()
        if real in seen:
            raise InputError(f"{option}: {part} and {seen[real]} are one file; fix: name each result once")
        seen[real] = part
    return [Path(p) for p in parts]


@dataclass(frozen=True)
class CompareFlags:
    """bench.compare's flags beyond the two sides (as given)."""

    threshold: str = opt(
        "10",
        "percent a metric may get worse before it counts (default 10): regressed when the whole 95% interval of new/old is worse than it, inconclusive when the interval straddles it",
    )
    json: str = opt("", "write the comparison report here")
    allow_different: bool = opt(
        False,
        "compare results measured with different settings, hardware or serve command (the differences are printed first)",
    )
    fail_inconclusive: bool = opt(
        False, "exit 2 when no metric regressed but some could not tell (default: exit 0, said so)"
    )
    store: str = opt(
        "",
        "result store the between-bench drift is estimated from (default $SPARKFORGE_BENCH_STORE or ~/.cache/sparkforge/bench; 'none': no store, repeats then independent unless OLD pools several benches)",
    )


COMPARE = Family.of(CompareFlags, "given")


@task(
    name="compare",
    families=(COMPARE,),
    help={
        "old": "the older result, or several of one image measured alike (A1.json,A2.json): pooled as one baseline "
        "(more repeats: a narrower interval)",
        "new": "the newer result (a bench JSON: `invoke bench --json`, or a file of the result store)",
    },
)
@user_errors
def bench_compare(c: Context, session: Session, old: str, new: str, given: CompareFlags) -> None:
    """Compare bench results: per metric new/old with its interval; exit 1 on a regression (2: inconclusive, asked)."""
    from sparkforge.boundary import check_output
    from sparkforge.errors import InputError
    from sparkforge.run.bench.compare import compare
    from sparkforge.run.bench.store import entries

    check_output(given.json, "--json")
    _threshold(given.threshold)
    olds = _result_paths("--old", old)
    if Path(new).resolve() in [p.resolve() for p in olds]:
        raise InputError(f"--new {new} is also an --old result; fix: compare two different results")
    stored = [] if given.store == "none" else [entry.doc for entry in entries(given.store or None)[0]]
    report = compare(olds, Path(new), given.threshold, allow_different=given.allow_different, store=stored)
    _comparison_out(session, report, given.json, fail_inconclusive=given.fail_inconclusive)


@task(
    name="history",
    families=(JSON,),
    help={
        "recipe": "recipe name or path: its stored results (matched by recipe name or by this file's hash)",
        "store": STORE_HELP,
        "json": "write the list (JSON) here",
    },
)
@user_errors
def bench_history(c: Context, session: Session, outputs: Outputs, recipe: str, store: str = "") -> None:
    """The stored bench results of a recipe, oldest first: date, image, suite, figures per level."""
    from sparkforge.boundary import write_output
    from sparkforge.errors import RunError
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.run.bench.store import history, store_root

    loaded = load_recipe(recipe)
    found, unreadable = history(loaded.name, loaded.hash, store or None)
    for line in unreadable:
        session.out(f"skipped: {line}")
    if not found:
        raise RunError(
            f"bench.history: no stored result of recipe {loaded.name} in {store_root(store or None)}; fix: run "
            f"'invoke bench --recipe {recipe} --profile P' first (it stores every result)"
        )
    rows = []
    for s in found:
        ident = s.doc["identity"]
        levels = {
            c["name"]: (c["details"].get("summary") or {}).get("output_tok_s", {}).get("median")
            for c in s.doc["checks"]
        }
        figs = ", ".join(f"{k} {v:.1f}" if v is not None else f"{k} failed" for k, v in levels.items())
        session.out(
            f"{ident['date']}  {ident['image']['id'][:19]}  {s.doc['suite']['name']:15}  {figs} tok/s  {s.path}"
        )
        rows.append(
            {
                "path": str(s.path),
                "date": ident["date"],
                "image": ident["image"],
                "suite": s.doc["suite"]["name"],
                "status": s.doc["status"],
                "output_tok_s": levels,
            }
        )
    if outputs.json:
        write_output(outputs.json, _json.dumps(rows, indent=2) + "\n", "--json")
        session.out(f"wrote {outputs.json}")


@task(
    name="report",
    help={
        "results": "comma-separated result files (one line per image in every chart)",
        "html": "write the static HTML page here",
        "png": "also write each chart as PNG into this directory",
        "threshold": "with two results: the comparison's threshold in percent (default 10)",
        "allow_different": "with two results: compare even when measured differently (differences listed)",
    },
)
@user_errors
def bench_report(
    c: Context,
    session: Session,
    results: str,
    html: str = "",
    png: str = "",
    threshold: str = "10",
    allow_different: bool = False,
) -> None:
    """Charts of bench results (tok/s and TTFT vs concurrency and depth, noise bands) as HTML and PNG."""
    from sparkforge.boundary import check_output, output_dir, write_output
    from sparkforge.errors import RunError
    from sparkforge.run.bench.charts import charts, page
    from sparkforge.run.bench.compare import compare_docs
    from sparkforge.run.bench.results import load_result

    if not html and not png:
        raise RunError("bench.report: nothing to write; fix: pass --html OUT.html and/or --png DIR")
    check_output(html, "--html")  # outputs and options checked before any file is read or chart drawn
    png_dir = output_dir(png, "--png") if png else None
    _threshold(threshold)
    paths = _result_paths("--results", results)
    docs = [(p, load_result(p)) for p in paths]
    pngs = charts(docs)
    comparison = None
    if len(docs) == 2:
        comparison = compare_docs(
            docs[0][1], docs[1][1], (str(paths[0]), str(paths[1])), threshold, allow_different=allow_different
        )
    if png_dir is not None:
        for name, data in pngs.items():
            session.out(f"wrote {write_output(png_dir / f'{name}.png', data, '--png')}")
    if html:
        write_output(html, page(docs, pngs, comparison), "--html")
        session.out(f"wrote {html}")


ns = Collection("bench")
ns.add_task(bench, "bench", default=True)
ns.add_task(bench_compare, "compare")
ns.add_task(bench_history, "history")
ns.add_task(bench_report, "report")

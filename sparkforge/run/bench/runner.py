"""`bench`: a load suite against a served profile, inside its own head container, with repeats and identity.

The client runs in the head's serve container (the same image, the model's tokenizer mounted there) against
127.0.0.1. vLLM's client (`default`, `quick`) runs in ONE Python process per bench (vLLM's own
`vllm.benchmarks.serve` entry, called once per run: importing vLLM per run cost ~40 s on the CPU twin); per
level a warm-up run (discarded) then `repeats` runs. llama-benchy (`spark-arena-v2`) runs from pinned PyPI wheels
(sha256 checked: llama-benchy and tabulate), copied into the container (pure Python; the rest it imports is vLLM's own
requirements), with its own warm-up and `--runs repeats`. vLLM's /metrics before and after give the
speculative-decoding acceptance. The result is a report (one check per level) whose `identity` says what was
measured on what (provenance.py).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sparkforge.boundary import MAX_JSON_BYTES, parse_json, sha256_file
from sparkforge.commands import Command
from sparkforge.context import Session, cache_root
from sparkforge.errors import CommandError, InputError, RunError
from sparkforge.recipe.profile import Profile
from sparkforge.report import Check, Report
from sparkforge.run.bench import figures
from sparkforge.run.bench.noise import summarize_repeats
from sparkforge.run.bench.provenance import HARDWARE_SCRIPT, backends, identity, model_identity
from sparkforge.run.bench.results import SCHEMA
from sparkforge.run.bench.rounds import Target, more_rounds
from sparkforge.run.bench.suites import (
    CLIENT_WHEELS,
    LLAMA_BENCHY_BOOK,
    LLAMA_BENCHY_VERSION,
    MARK,
    RESULT_DIR,
    VLLM_DRIVER,
    Suite,
    benchy_argv,
    level_name,
    run_order,
    vllm_argv,
)
from sparkforge.run.nodes import NodeEngine
from sparkforge.verify.started import started_backends

MAX_WHEEL_BYTES = 1 << 30  # a pinned pure-Python client wheel (a few MiB)
_CLIENT_FIX = "check that the image runs the vLLM it was built with (its output is the JSON line read here)"
METRICS_SCRIPT = """
import sys, urllib.request
from sparkforge.boundary import linear_regex
print(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=30).read().decode())
"""
SHA256_SCRIPT = "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())"


@dataclass(frozen=True)
class BenchOptions:
    suite: Suite
    repeats: int = 5
    warmup: bool = True
    corpus: Path | None = None  # llama-benchy: a local text seeded as its book (offline machines)
    wheel_cache: Path | None = None  # default: the session's cache, wheels/
    timeout_s: float = 3600
    # vLLM's client: each repeat's prompts scaled (from the warm-up) to last this long
    min_duration_s: float = 0.0
    target: Target | None = None  # --target-detect: more rounds until the floor or the budget (rounds.py)
    recipe_hash: str | None = None  # the recipe the served image must be built from (None: not checked)
    harness: str = "suite"  # --harness: a row of harnesses.HARNESSES (the suite's own client, or aiperf)


def head_container(profile: str) -> str:
    return f"sparkforge-serve-{profile}-0"


def _inspect(engine: NodeEngine, kind: str, name: str) -> dict[str, Any]:
    where = f"{engine.node.label}: docker inspect {kind} {name}"
    try:
        found = parse_json(engine.call(f"inspect-{kind}", "inspect", "--type", kind, name), where)
    except InputError as exc:
        raise RunError(str(exc)) from None
    if not isinstance(found, list) or not found or not isinstance(found[0], dict):
        raise RunError(f"{engine.node.label}: cannot read {kind} {name}: docker inspect listed no object")
    return found[0]


def _served(engine: NodeEngine, profile: Profile) -> tuple[str, dict[str, Any]]:
    name = head_container(profile.name)
    state = engine.state(name)
    if state.status != "running":
        raise RunError(
            f"profile {profile.name} is not running on {engine.node.label} (container {name}: {state.status}); "
            f"fix: start it with 'invoke serve --recipe R --profile {profile.name}' (or cluster.up), then bench"
        )
    return name, _inspect(engine, "container", name)


def _flag(args: list[str], flag: str, default: str) -> str:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else default


def _exec(
    engine: NodeEngine, name: str, step: str, *argv: str, timeout: float, env: dict[str, str] | None = None
):
    flags = [f for k, v in (env or {}).items() for f in ("-e", f"{k}={v}")]
    try:
        return engine.runner.capture(
            engine.command("exec", *flags, name, *argv), step, check=False, timeout=timeout
        )
    except CommandError as exc:
        raise RunError(f"{engine.node.label}: {exc}; fix: a smaller suite, or a longer --timeout") from None


def _vllm_call(engine: NodeEngine, name: str, runs: list[dict], options: BenchOptions) -> tuple[dict, str]:
    """One driver process over `runs`: {run name: its JSON line}, and the output (for a failure's tail)."""
    result = _exec(
        engine, name, "bench-vllm", "python3", "-c", VLLM_DRIVER, json.dumps(runs), timeout=options.timeout_s
    )
    lines = {}
    for line in result.output.splitlines():
        if line.startswith(MARK):
            entry = parse_json(line[len(MARK) :], "vLLM's benchmark client", nonfinite=True, fix=_CLIENT_FIX)
            lines[entry["run"]] = entry
    return lines, result.output


def _vllm_levels(
    session: Session, engine: NodeEngine, name: str, ctx: dict[str, str], options: BenchOptions
) -> tuple[dict, dict[str, Any]]:
    suite, started = options.suite, time.monotonic()
    nonce = secrets.randbelow(1 << 24)  # fresh prompts for every bench: none was cached by an earlier bench
    seeds: dict[str, int] = {}
    # level -> prompts per run (the warm-up's --duration scaling), for later rounds
    prompts: dict[str, int] = {}

    def runs_of(order: list[tuple[tuple[int, int], str]]) -> list[dict]:
        runs = []
        for level, tag in order:
            run, key = f"{level_name(*level)}-{tag}", level_name(*level)
            seeds[run] = suite.seed + nonce + len(seeds)
            sized = replace(suite, num_prompts=prompts.get(key, max(suite.num_prompts, level[0])))
            runs.append(
                {
                    "name": run,
                    "level": key,
                    "argv": vllm_argv(
                        sized, ctx["model"], ctx["tokenizer"], ctx["port"], level, run, seeds[run]
                    ),
                }
            )
            if tag == "warmup" and options.min_duration_s:
                runs[-1]["scale_to_s"] = options.min_duration_s
        return runs

    session.echo(
        f"vllm bench serve: {len(suite.levels())} level(s) x ({'1 warm-up + ' if options.warmup else ''}"
        f"{options.repeats} repeats) in interleaved rounds, {suite.input_len} in / {suite.output_len} out tokens, "
        f"each repeat at least {options.min_duration_s:g} s, seeds {suite.seed}+{nonce}+run ..."
    )
    lines, output = _vllm_call(
        engine, name, runs_of(run_order(suite, options.repeats, options.warmup)), options
    )
    for level in suite.levels():
        first = lines.get(f"{level_name(*level)}-r1") or {}
        if first.get("num_prompts"):
            prompts[level_name(*level)] = first["num_prompts"]

    def measured() -> dict[tuple[int, int], Any]:
        return {level: _vllm_level(level, lines, output, seeds) for level in suite.levels()}

    def one_more_round(index: int) -> None:
        more, _out = _vllm_call(engine, name, runs_of([(lv, f"r{index}") for lv in suite.levels()]), options)
        lines.update(more)

    stopping = more_rounds(session, options.target, options.repeats, measured, one_more_round, started)
    return measured(), {"prompts_per_run": prompts, **stopping}


def _vllm_level(level: tuple[int, int], lines: dict, output: str, seeds: dict[str, int]) -> tuple:
    """(repeats' figures, problems, seeds) of one level from the driver's lines."""
    repeats, problems, level_seeds = [], [], []
    prefix = f"{level_name(*level)}-r"
    tags = sorted((r for r in seeds if r.startswith(prefix)), key=lambda r: int(r[len(prefix) :]))
    for run in tags:
        entry = lines.get(run)
        level_seeds.append(seeds[run])
        if entry is None or not entry["ok"]:
            tail = entry["error"] if entry else output.strip()[-400:]
            problems.append(f"{run}: the client failed ({tail})")
            continue
        figs, completed, failed = figures.vllm_repeat(run, entry["result"])
        if isinstance(entry.get("outside_cpu_pct"), float):
            figs["outside_cpu_pct"] = round(entry["outside_cpu_pct"], 1)  # not compared: what it ran beside
        took = entry["result"].get("duration")
        if isinstance(took, int | float) and took >= 0:
            figs["duration_s"] = round(float(took), 2)  # not compared: how long the repeat ran
        if failed or not completed:
            problems.append(f"{run}: {failed} of {completed + failed} requests failed")
        repeats.append(figs)
    return repeats, problems, level_seeds


def _wheel(engine: NodeEngine, cache: Path, name: str, version: str, sha256: str) -> Path:
    """A pinned PyPI wheel in the local wheel cache (downloaded once), its sha256 checked."""
    wheel = cache / f"{name}-{version}-py3-none-any.whl"
    if not wheel.is_file():
        argv = (sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--dest",
                str(cache), f"{name.replace('_', '-')}=={version}")  # fmt: skip
        done = engine.runner.capture(Command(argv), f"download-{name}", check=False, timeout=300)
        if done.returncode != 0 or not wheel.is_file():
            raise RunError(
                f"{name} {version}: cannot download its wheel from PyPI ({done.output.strip()[-300:]}); fix: put "
                f"{wheel.name} (from PyPI) into {cache}, or use --suite default"
            )
    digest = sha256_file(wheel, "", MAX_WHEEL_BYTES)
    if digest != sha256:
        raise RunError(
            f"{wheel}: sha256 {digest} is not PyPI's {sha256} for {name} {version}; fix: delete it and run again "
            "(it is downloaded again from PyPI)"
        )
    return wheel


def _install_benchy(engine: NodeEngine, name: str, options: BenchOptions) -> str:
    """The pinned wheels copied into the container; the PYTHONPATH that runs llama-benchy from them."""
    cache = options.wheel_cache or cache_root() / "wheels"
    home = f"{RESULT_DIR}/home/.cache/llama-benchy"
    engine.call("bench-mkdir", "exec", name, "mkdir", "-p", home)
    paths = []
    for wheel_name, version, sha256 in CLIENT_WHEELS:
        wheel = _wheel(engine, cache, wheel_name, version, sha256)
        engine.call(f"bench-cp-{wheel_name}", "cp", str(wheel), f"{name}:{RESULT_DIR}/{wheel.name}")
        paths.append(f"{RESULT_DIR}/{wheel.name}")
    if options.corpus:
        book = (
            f"{home}/{hashlib.md5(LLAMA_BENCHY_BOOK.encode()).hexdigest()}.txt"  # llama-benchy's cache name
        )
        engine.call("bench-cp-corpus", "cp", str(options.corpus), f"{name}:{book}")
    return ":".join(paths)


def _benchy_levels(
    session: Session, engine: NodeEngine, name: str, ctx: dict[str, str], options: BenchOptions
):
    suite, started = options.suite, time.monotonic()
    pythonpath = _install_benchy(engine, name, options)
    session.echo(
        f"llama-benchy {LLAMA_BENCHY_VERSION}: {len(suite.levels())} level(s) x {options.repeats} interleaved "
        f"rounds (one run per level, each warmed), pp {suite.input_len} / tg {suite.output_len}, depths "
        f"{list(suite.depths)} ..."
    )
    env = {"PYTHONPATH": pythonpath, "HOME": f"{RESULT_DIR}/home", "HF_HUB_OFFLINE": "1"}
    found: dict[tuple[int, int], list[dict[str, float]]] = {}
    errors: list[str] = []

    def one_round(index: int) -> None:
        out_file = f"{RESULT_DIR}/llama-benchy-r{index}.json"
        engine.call("bench-rm", "exec", name, "rm", "-f", out_file)
        argv = benchy_argv(suite, ctx["model"], ctx["tokenizer"], ctx["port"], options.warmup, out_file)
        result = _exec(
            engine,
            name,
            "bench-llama-benchy",
            "python3",
            "-m",
            "llama_benchy",
            *argv,
            env=env,
            timeout=options.timeout_s,
        )
        raw = _exec(engine, name, "bench-result", "cat", out_file, timeout=60)
        if result.returncode != 0 or raw.returncode != 0:
            errors.append(
                f"llama-benchy (round {index}) exited {result.returncode}: {result.output.strip()[-300:]}"
            )
            return
        try:
            doc = parse_json(raw.output, "llama-benchy's result", max_bytes=MAX_JSON_BYTES, nonfinite=True)
        except InputError as exc:
            raise RunError(
                f"llama-benchy wrote no JSON result ({exc}); fix: see its output: {result.output[-400:]}"
            ) from None
        for level, figs in figures.benchy_levels("llama-benchy result", doc, 1).items():
            found.setdefault(level, []).extend(figs)

    def measured() -> dict[tuple[int, int], Any]:
        if errors:
            return {level: ([], errors[:1], None) for level in suite.levels()}
        rounds = max((len(v) for v in found.values()), default=0)
        return {
            level: (
                found.get(level, []),
                [] if len(found.get(level, [])) == rounds else ["llama-benchy reported no figures"],
                None,
            )
            for level in suite.levels()
        }

    for i in range(options.repeats):
        one_round(i + 1)
        if errors:
            return measured(), None, {}
    stopping = more_rounds(
        session,
        options.target,
        options.repeats,
        measured,
        lambda i: one_round(i) if not errors else None,
        started,
    )
    book = f"{RESULT_DIR}/home/.cache/llama-benchy/{hashlib.md5(LLAMA_BENCHY_BOOK.encode()).hexdigest()}.txt"
    sha = _exec(engine, name, "bench-corpus-sha", "python3", "-c", SHA256_SCRIPT, book, timeout=60)
    corpus = {"url": LLAMA_BENCHY_BOOK, "sha256": sha.output.strip() if sha.returncode == 0 else None,
              "seeded_from": options.corpus.name if options.corpus else None}  # fmt: skip
    return measured(), corpus, stopping


def suite_client(
    session: Session, engine: NodeEngine, info: dict[str, Any], ctx: dict[str, str], options: BenchOptions
) -> tuple:
    """The suite's own client in the head's container (harness `suite`): (measured, corpus, stopping)."""
    name = str(info.get("Name") or "").lstrip("/")  # the head's container
    if options.suite.client == "llama-benchy":
        return _benchy_levels(session, engine, name, ctx, options)
    measured, stopping = _vllm_levels(session, engine, name, ctx, options)
    return measured, None, stopping


def _metrics(engine: NodeEngine, name: str, port: str) -> dict[str, float]:
    got = _exec(engine, name, "bench-metrics", "python3", "-c", METRICS_SCRIPT, port, timeout=60)
    return (
        figures.spec_counters(got.output, f"{name}: /metrics on port {port}") if got.returncode == 0 else {}
    )


def run_bench(session: Session, engine: NodeEngine, profile: Profile, options: BenchOptions) -> Report:
    """Benchmark the profile running on `engine`; one check per level, identity in the report."""
    echo = session.echo
    options = replace(options, wheel_cache=options.wheel_cache or session.cache_dir / "wheels")
    name, info = _served(engine, profile)
    args = [str(a) for a in info.get("Args") or []]
    path = args[1] if len(args) > 1 and args[0] == "serve" else profile.model.model
    ctx = {
        "port": _flag(args, "--port", "8000"),
        # The clients count tokens with the server's own tokenizer (a profile may name one beside the weights).
        "tokenizer": _flag(args, "--tokenizer", path),
        "model": _flag(args, "--served-model-name", profile.model.served_model_name or profile.model.model),
    }
    printed = engine.call("hardware", "exec", name, "python3", "-c", HARDWARE_SCRIPT, path).strip()
    reading = parse_json(
        (printed.splitlines() or [""])[-1], "the hardware reading", nonfinite=True, fix=_CLIENT_FIX
    )
    model = model_identity(path, ctx["model"], reading)
    hardware = {k: v for k, v in reading.items() if k != "model_config_sha256"}
    image = _inspect(engine, "image", str(info.get("Image")))
    engine.call("bench-dir", "exec", name, "mkdir", "-p", RESULT_DIR)
    before = _metrics(engine, name, ctx["port"])
    start = time.monotonic()
    from sparkforge.run.bench.harnesses import HARNESSES

    harness = HARNESSES.get(options.harness).run or suite_client
    measured, corpus, stopping = harness(session, engine, info, ctx, options)
    spec = figures.acceptance(before, _metrics(engine, name, ctx["port"]))
    report = Report(
        command="bench",
        subject=profile.name,
        recipe=(info.get("Config") or {}).get("Labels", {}).get("dev.sparkforge.recipe"),
    )
    for level, (repeats, problems, seeds) in measured.items():
        if spec:
            repeats = [
                {**r, "decode_steps_s": r["output_tok_s"] / spec["mean_acceptance_length"]} for r in repeats
            ]
        summary = summarize_repeats(repeats) if repeats else {}
        check = Check(level_name(*level), "failed" if problems or not repeats else "passed")
        check.details = {"concurrency": level[0], "depth": level[1], "repeats": repeats, "summary": summary}
        if seeds:
            check.details["seeds"] = seeds  # the prompts' seed of each repeat (vLLM's random dataset)
        if check.status == "failed":
            check.reason = "; ".join(problems) or "no repeat measured"
        else:
            tok, ttft = summary["output_tok_s"], summary["ttft_ms"]
            check.reason = (
                f"{tok['median']:.1f} out tok/s [{tok['min']:.1f}..{tok['max']:.1f}], "
                f"TTFT {ttft['median']:.1f} ms [{ttft['min']:.1f}..{ttft['max']:.1f}]"
            )
        echo(f"  {check.name}: {check.status}: {check.reason}")
        report.add(check)
    ident = identity(info, image, hardware, model)
    log = engine.logs(name)
    report.extra.update(
        {
            "schema": SCHEMA,
            "model": ctx["model"],
            "suite": {
                "name": options.suite.name,
                "client": options.suite.client,
                "params": {
                    **options.suite.params(),
                    "repeats": options.repeats,
                    "warmup": options.warmup,
                    "min_duration_s": options.min_duration_s,  # vLLM's client: a repeat's prompts scaled to it
                    "order": "interleaved rounds",  # suites.run_order
                    "prompts": "fresh per run",  # seeds: suite seed + a per-bench nonce + the run's index
                },
                "corpus": corpus,
                # who sent the load, at which version (vLLM's own client: the served image's vLLM)
                "harness": {
                    "name": options.harness,
                    "client": options.suite.client,
                    "version": options.suite.params().get("client_version") or ident["vllm"],
                },
            },
            "stopping": stopping,  # prompts per run (vLLM's client) and --target-detect's outcome
            "identity": ident,
            "backends": backends(log),
            # per layer, in the kernel report's names: `invoke kernels` predicts, this is what vLLM chose at start
            "selected_at_start": started_backends(log),
            "speculative": spec,
            "wall_s": round(time.monotonic() - start, 1),
        }
    )
    if options.recipe_hash and ident["recipe_hash"] not in (None, options.recipe_hash):
        report.extra["note"] = "the served image was built from another recipe hash than --recipe's"
    return report


def table(report: Report | dict[str, Any]) -> list[str]:
    """Human lines: one row per level, the median and [min..max] of the repeats."""
    checks = report["checks"] if isinstance(report, dict) else [c.to_dict() for c in report.checks]
    rows = [f"{'level':>12} {'out tok/s median [min..max]':>30} {'TTFT ms median [min..max]':>30} {'n':>3}"]
    for check in checks:
        s = check["details"].get("summary") or {}
        if check["status"] != "passed" or not s:
            rows.append(f"{check['name']:>12} {check['status']}: {check['reason']}")
            continue
        tok, ttft = s["output_tok_s"], s["ttft_ms"]
        rows.append(
            f"{check['name']:>12} {tok['median']:>12.1f} [{tok['min']:.1f}..{tok['max']:.1f}]".ljust(44)
            + f" {ttft['median']:>12.1f} [{ttft['min']:.1f}..{ttft['max']:.1f}]".ljust(31)
            + f" {len(check['details']['repeats']):>3}"
        )
    return rows

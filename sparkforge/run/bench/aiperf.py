"""`bench --harness aiperf`: NVIDIA's AIPerf (PyPI `aiperf`, pinned) as the load client, run on the host.

AIPerf needs ~140 packages (dash, kaleido, pyarrow, scipy, datasets, ...): it cannot be copied into the serve
container like llama-benchy's two pure-Python wheels. It is installed ONCE, from a lock of exact versions and PyPI
sha256 (tools/aiperf-<version>.txt, `pip install --require-hashes --no-deps --only-binary :all:`), into a venv of
its own in the cache (`tools/aiperf-<version>/`), and run on this host against the served port (serve uses the host
network: the head's port is 127.0.0.1's). Per level and round one `aiperf profile`: the completions endpoint,
streaming, synthetic prompts of exactly `input_len` tokens counted with the server's own tokenizer (its host folder
read from the container's mounts), exactly `output_len` generated tokens (`ignore_eos`, `min_tokens`), a context
depth as one shared prefix prompt of that many tokens, the level's concurrency, a seed of its own per run. Its
`profile_export_aiperf.json` is read by its keys into the repeat's figures (`export_figures`).
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkforge.boundary import read_bytes, read_json, read_text, write_output
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.errors import CommandError, RunError, SparkforgeError
from sparkforge.run.bench.rounds import more_rounds
from sparkforge.run.bench.suites import AIPERF, AIPERF_VERSION, Suite, level_name, run_order

if TYPE_CHECKING:
    from sparkforge.run.nodes import NodeEngine

LOCK = Path(__file__).with_name("tools") / f"aiperf-{AIPERF_VERSION}.txt"
EXPORT = "profile_export_aiperf.json"
PYTHONS = ((3, 11), (3, 13))  # the Python versions aiperf 0.13.0 supports (and the lock was resolved for)
MAX_LOCK_BYTES = 4 << 20  # the lock is ~350 kB
RERUN = "re-run the benchmark (aiperf's export is incomplete)"
MARKER = "sparkforge-installed.json"  # written last: a folder without it is a half-done install


def tool_home(session: Session) -> Path:
    return session.cache_dir / "tools" / f"{AIPERF}-{AIPERF_VERSION}"


def _lock_sha256() -> str:
    return hashlib.sha256(read_bytes(LOCK, "aiperf lock", MAX_LOCK_BYTES)).hexdigest()


def installed(session: Session) -> Path | None:
    """The pinned aiperf program when its venv was installed from this lock; None otherwise."""
    home = tool_home(session)
    try:
        done = read_json(home / MARKER, "aiperf install marker", named=False, within=(session.cache_dir,))
    except (OSError, ValueError, SparkforgeError):
        return None
    program = home / "bin" / AIPERF
    ok = isinstance(done, dict) and done.get("lock_sha256") == _lock_sha256() and program.is_file()
    return program if ok else None


def install_aiperf(session: Session) -> Path:
    """The aiperf program of the pinned venv, installed once (pip's progress shown); --offline refuses to install."""
    program = installed(session)
    if program is not None:
        return program
    home = tool_home(session)
    if session.offline:
        raise RunError(
            f"bench --harness aiperf: aiperf {AIPERF_VERSION} is not installed in {home} and --offline forbids "
            "installing it from PyPI; fix: run the bench once without --offline (it installs once), or copy that "
            "folder from a machine with the same Python where it is installed"
        )
    if not PYTHONS[0] <= sys.version_info[:2] <= PYTHONS[1]:
        raise RunError(
            f"bench --harness aiperf: aiperf {AIPERF_VERSION} runs on Python 3.11 to 3.13, sparkforge runs on "
            f"{sys.version.split()[0]}; fix: run sparkforge from a Python 3.11-3.13 venv, or use the suite's own client"
        )
    packages = sum(
        1
        for line in read_text(LOCK, "aiperf lock", MAX_LOCK_BYTES).splitlines()
        if "==" in line and not line.startswith("#")
    )
    shutil.rmtree(home, ignore_errors=True)  # a half-done install (no marker) starts again
    home.parent.mkdir(parents=True, exist_ok=True)
    session.echo(
        f"aiperf {AIPERF_VERSION}: installing once into {home}: {packages} packages at the exact versions and PyPI "
        f"sha256 of {LOCK.name} (about 1.2 GB; a minute on a fast link) ..."
    )
    runner = session.runner
    runner.run(Command.of(sys.executable, "-m", "venv", str(home)), "aiperf-venv")
    pip = [str(home / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--require-hashes",
           "--no-deps", "--only-binary", ":all:", "--progress-bar", "on", "-r", str(LOCK)]  # fmt: skip
    if session.ca_bundle:
        pip[4:4] = ["--cert", str(session.ca_bundle)]
    done = runner.run(Command(tuple(pip)), "aiperf-install", check=False)
    if done.returncode != 0:
        raise RunError(
            f"bench --harness aiperf: pip could not install {LOCK.name} into {home} (exit {done.returncode}; its "
            "output is above); fix: check the connection to PyPI (a TLS proxy: --ca-bundle), then run again"
        )
    version = runner.capture(Command.of(str(home / "bin" / AIPERF), "--version"), "aiperf-version")
    if version.output.strip().splitlines()[-1:] != [AIPERF_VERSION]:
        raise RunError(
            f"bench --harness aiperf: {home}/bin/aiperf --version says {version.output.strip()[-80:]!r}, not "
            f"{AIPERF_VERSION}; fix: delete {home} and run again"
        )
    marker = json.dumps({"version": AIPERF_VERSION, "lock_sha256": _lock_sha256()}) + "\n"
    write_output(home / MARKER, marker, "aiperf install marker")
    return home / "bin" / AIPERF


def aiperf_argv(
    suite: Suite, ctx: dict[str, str], level: tuple[int, int], seed: int, out_dir: Path
) -> list[str]:
    """`aiperf profile` arguments for one run of one level (flags as `aiperf profile --help` of 0.13.0 names them)."""
    concurrency, depth = level
    prompts = max(suite.num_prompts, concurrency)
    return [
        "profile", "--model", ctx["model"], "--url", f"http://127.0.0.1:{ctx['port']}",
        "--endpoint-type", "completions", "--streaming", "--tokenizer", ctx["tokenizer_host"],
        "--isl", str(suite.input_len), "--isl-stddev", "0", "--osl", str(suite.output_len), "--osl-stddev", "0",
        "--extra-inputs", json.dumps({"ignore_eos": True, "min_tokens": suite.output_len}),
        "--concurrency", str(concurrency), "--request-count", str(prompts), "--random-seed", str(seed),
        *(["--num-prefix-prompts", "1", "--prefix-prompt-length", str(depth)] if depth else []),
        "--output-artifact-dir", str(out_dir), "--ui-type", "none", "--no-auto-plot",
    ]  # fmt: skip


def _stat(where: str, doc: dict[str, Any], metric: str, stat: str, unit: str) -> float:
    entry = doc.get(metric)
    value = entry.get(stat) if isinstance(entry, dict) else None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or not isinstance(entry, dict)
        or entry.get("unit") != unit
    ):
        raise RunError(
            f"{where}: {metric}.{stat} is {value!r} (unit {entry.get('unit') if isinstance(entry, dict) else None!r},"
            f" expected a finite number >= 0 in {unit}); fix: re-run the benchmark (an incomplete export, or not "
            f"one of aiperf {AIPERF_VERSION})"
        )
    return float(value)


def export_figures(where: str, doc: Any) -> tuple[dict[str, float], int, int]:
    """aiperf's profile_export_aiperf.json -> (one repeat's figures, requests completed, requests failed)."""
    if not isinstance(doc, dict):
        raise RunError(f"{where}: not an aiperf profile export (a JSON object); fix: re-run the benchmark")
    figures = {
        "output_tok_s": _stat(where, doc, "output_token_throughput", "avg", "tokens/sec"),
        "ttft_ms": _stat(where, doc, "time_to_first_token", "p50", "ms"),
        "itl_ms": _stat(where, doc, "inter_token_latency", "p50", "ms"),
    }
    if "output_token_throughput_per_user" in doc:  # aiperf leaves it out of some runs (seen at c2, depth 256)
        figures["request_output_tok_s"] = _stat(
            where, doc, "output_token_throughput_per_user", "p50", "tokens/sec/user"
        )
    if doc.get("aiperf_version") != AIPERF_VERSION or doc.get("is_complete") is not True:
        raise RunError(
            f"{where}: aiperf_version {doc.get('aiperf_version')!r}, is_complete {doc.get('is_complete')!r}: not a "
            f"complete export of aiperf {AIPERF_VERSION}; fix: re-run the benchmark"
        )
    chunks = doc.get("http_req_chunks_received")
    if (
        isinstance(chunks, dict)
        and chunks.get("max") == 1
        and _stat(where, doc, "output_sequence_length", "max", "tokens") > 1
    ):
        raise RunError(
            f"{where}: every response arrived as one stream chunk (http_req_chunks_received max 1): aiperf could time "
            "no token after the first (inter-token latency 0 ms, time to first token = the whole request); the "
            "host was starved or the server coalesced the stream; fix: re-run on a quieter machine"
        )
    completed = int(_stat(where, doc, "completed_request_count", "avg", "requests"))
    errors = doc.get("error_request_count")  # present only when a request failed
    failed = int(_stat(where, doc, "error_request_count", "avg", "requests")) if errors is not None else 0
    return figures, completed, failed


def host_path(info: dict[str, Any], path: str) -> str:
    """The host folder of a path inside the serve container, from its bind mounts (the tokenizer aiperf reads)."""
    for mount in sorted(info.get("Mounts") or [], key=lambda m: -len(str(m.get("Destination") or ""))):
        dest, source = str(mount.get("Destination") or ""), str(mount.get("Source") or "")
        if dest and source and (path == dest or path.startswith(dest.rstrip("/") + "/")):
            return source + path[len(dest) :]
    raise RunError(
        f"bench --harness aiperf: the server's tokenizer {path} is not in a folder mounted from this host, and aiperf "
        "runs on the host; fix: serve with the model (and tokenizer) from a local --model-dir"
    )


def aiperf_levels(
    session: Session, engine: NodeEngine, info: dict[str, Any], ctx: dict[str, str], options: Any
) -> tuple[dict, None, dict[str, Any]]:
    """`options`: runner.BenchOptions (not imported: runner dispatches here through harnesses.HARNESSES).
    Every level x (warm-up + repeats) in interleaved rounds with aiperf on this host; (measured, corpus, stopping)."""
    if engine.node.kind not in ("local", "unix"):
        raise RunError(
            f"bench --harness aiperf: aiperf runs on this host against 127.0.0.1, the profile runs on "
            f"{engine.node.label}; fix: run the bench on the head node, or leave --harness out (the suite's client "
            "runs in the head's container)"
        )
    suite, started = options.suite, time.monotonic()
    program = install_aiperf(session)
    ctx = {**ctx, "tokenizer_host": host_path(info, ctx["tokenizer"])}
    nonce = secrets.randbelow(1 << 24)
    work = session.cache_dir / "tools" / "runs" / f"aiperf-{time.strftime('%Y%m%d-%H%M%S')}-{nonce}"
    found: dict[tuple[int, int], list[tuple[dict[str, float], str | None]]] = {}
    seeds: dict[tuple[int, int], list[int]] = {}
    count = 0

    def one_run(level: tuple[int, int], tag: str) -> None:
        nonlocal count
        count += 1
        seed = suite.seed + nonce + count
        out = work / f"{level_name(*level)}-{tag}"
        argv = aiperf_argv(suite, ctx, level, seed, out)
        try:
            done = session.runner.capture(
                Command((str(program), *argv), cwd=work),
                f"bench-aiperf-{level_name(*level)}-{tag}",
                check=False,
                timeout=options.timeout_s,
            )
        except CommandError as exc:
            raise RunError(
                f"bench --harness aiperf: {exc}; fix: a smaller suite, or a longer --timeout"
            ) from None
        if tag == "warmup":
            return
        seeds.setdefault(level, []).append(seed)
        export = out / EXPORT
        if done.returncode != 0 or not export.is_file():
            problem = (
                f"{level_name(*level)}-{tag}: aiperf exited {done.returncode}: {done.output.strip()[-300:]}"
            )
            found.setdefault(level, []).append(({}, problem))
            return
        try:
            doc = read_json(export, "aiperf export", named=False, within=(session.cache_dir,), fix=RERUN)
            figures, completed, failed = export_figures(str(export), doc)
        except SparkforgeError as exc:  # an unreadable export, or a run without token timing: its level fails
            found.setdefault(level, []).append(({}, f"{level_name(*level)}-{tag}: {exc}"))
            return
        bad = (
            f"{level_name(*level)}-{tag}: {failed} of {completed + failed} requests failed"
            if failed
            else None
        )
        found.setdefault(level, []).append((figures, bad))

    def measured() -> dict[tuple[int, int], Any]:
        return {
            level: (
                [f for f, bad in found.get(level, []) if f and not bad],
                [bad for _f, bad in found.get(level, []) if bad],
                seeds.get(level, []),
            )
            for level in suite.levels()
        }

    work.mkdir(parents=True, exist_ok=True)
    session.echo(
        f"aiperf {AIPERF_VERSION} on this host -> 127.0.0.1:{ctx['port']}: {len(suite.levels())} level(s) x "
        f"({'1 warm-up + ' if options.warmup else ''}{options.repeats} repeats) in interleaved rounds, "
        f"{suite.input_len} in / {suite.output_len} out tokens, {max(suite.num_prompts, 1)}+ requests per run; "
        f"artifacts in {work} ..."
    )
    for level, tag in run_order(suite, options.repeats, options.warmup):
        one_run(level, tag)

    def one_more_round(index: int) -> None:
        for level in suite.levels():
            one_run(level, f"r{index}")

    stopping = more_rounds(session, options.target, options.repeats, measured, one_more_round, started)
    return measured(), None, {"artifacts": str(work), **stopping}

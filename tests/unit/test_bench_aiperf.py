"""bench --harness aiperf: the export reader on REAL aiperf 0.13.0 exports, the argv, the install's rules, the row.

tests/fixtures/aiperf/ holds two `profile_export_aiperf.json` files aiperf 0.13.0 wrote against the CPU twin serving
the tiny model (port 18495, prompt 128 / generate 32 + a 256-token prefix, concurrency 2, 4 requests): one by hand,
one by `invoke bench --harness aiperf` itself (its `run_info.cli_command` is the argv sparkforge built; in that run
every response arrived as ONE stream chunk: no token timing, refused). The real run end to end: tests/engine/test_bench_aiperf_real.py.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shlex
from pathlib import Path

import pytest

from sparkforge.cli.bench import BenchFlags, bench_options
from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.run.bench import aiperf
from sparkforge.run.bench.harnesses import HARNESSES
from sparkforge.run.bench.suites import AIPERF_VERSION, choose_suite

FIXTURES = Path(__file__).parents[1] / "fixtures" / "aiperf"
BY_HAND = FIXTURES / "profile_export_aiperf-c2-d256.json"
BY_BENCH = FIXTURES / "profile_export_aiperf-c2-d256-one-chunk.json"


def _doc(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_real_export_gives_the_repeat_figures_by_their_keys_and_units() -> None:
    doc = _doc(BY_HAND)
    figures, completed, failed = aiperf.export_figures("by-hand", doc)
    assert figures == {
        "output_tok_s": doc["output_token_throughput"]["avg"],
        "ttft_ms": doc["time_to_first_token"]["p50"],
        "itl_ms": doc["inter_token_latency"]["p50"],
        "request_output_tok_s": doc["output_token_throughput_per_user"]["p50"],
    }
    assert (completed, failed) == (4, 0)
    # what the run was: 32 tokens out exactly (ignore_eos + min_tokens), 128 + the 256-token prefix in
    assert doc["output_sequence_length"]["p50"] == 32 and doc["input_sequence_length"]["p50"] == 384
    assert all(v > 0 for v in figures.values())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d["time_to_first_token"].update(unit="s"), "time_to_first_token.p50"),
        (lambda d: d["inter_token_latency"].pop("p50"), "inter_token_latency.p50"),
        (lambda d: d["output_token_throughput"].update(avg=float("nan")), "output_token_throughput.avg"),
        (lambda d: d.pop("completed_request_count"), "completed_request_count"),
        (lambda d: d.update(aiperf_version="0.12.0"), "aiperf_version '0.12.0'"),
        (lambda d: d.update(is_complete=False), "is_complete False"),
    ],
)
def test_an_export_that_is_not_a_complete_one_of_the_pinned_version_is_refused(change, named: str) -> None:
    doc = copy.deepcopy(_doc(BY_HAND))
    change(doc)
    with pytest.raises(RunError, match="fix: re-run the benchmark") as err:
        aiperf.export_figures("export.json", doc)
    assert named in str(err.value) and "export.json" in str(err.value)


def test_failed_requests_are_counted() -> None:
    doc = copy.deepcopy(_doc(BY_HAND))
    doc["error_request_count"] = {"unit": "requests", "avg": 1.0}
    assert aiperf.export_figures("x", doc)[1:] == (4, 1)


def test_the_argv_is_the_one_the_real_bench_ran() -> None:
    """The bench's own run recorded its command line in the export: the argv built for that level is the same."""
    recorded = shlex.split(_doc(BY_BENCH)["run_info"]["cli_command"])
    suite = choose_suite("default", input_len=128, output_len=32, num_prompts=4)
    seed = int(recorded[recorded.index("--random-seed") + 1])
    out = Path(recorded[recorded.index("--output-artifact-dir") + 1])
    ctx = {"model": "tiny-qwen35moe", "port": "18495", "tokenizer_host": "/tmp/wt61b/model/tokenizer"}
    argv = aiperf.aiperf_argv(suite, ctx, (2, 256), seed, out)
    assert ["aiperf", *argv] == [
        a if a != "None" else "none" for a in recorded
    ]  # aiperf echoes `--ui-type None`
    assert "--num-prefix-prompts" not in aiperf.aiperf_argv(suite, ctx, (2, 0), seed, out)


def test_the_tokenizer_is_found_on_the_host_through_the_mounts() -> None:
    info = {
        "Mounts": [
            {"Source": "/srv/cache/vllm", "Destination": "/root/.cache/vllm"},
            {"Source": "/srv/models/tiny", "Destination": "/models"},
        ]
    }
    assert aiperf.host_path(info, "/models/tokenizer") == "/srv/models/tiny/tokenizer"
    assert aiperf.host_path(info, "/models") == "/srv/models/tiny"
    with pytest.raises(RunError, match="local --model-dir"):
        aiperf.host_path(info, "/modelsX/tokenizer")


def _session(tmp_path: Path, offline: bool) -> Session:
    return Session(echo=lambda _: None, runner=Runner(stream=False), offline=offline, cache_dir=tmp_path)


def test_offline_refuses_to_install_and_touches_nothing(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="--offline forbids installing") as err:
        aiperf.install_aiperf(_session(tmp_path, offline=True))
    assert f"tools/aiperf-{AIPERF_VERSION}" in str(err.value)
    assert not (tmp_path / "tools").exists()


def test_an_install_counts_only_with_the_marker_of_this_lock(tmp_path: Path) -> None:
    session = _session(tmp_path, offline=True)
    home = aiperf.tool_home(session)
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "aiperf").write_text("#!/bin/sh\n")
    assert aiperf.installed(session) is None  # no marker: an interrupted install
    (home / aiperf.MARKER).write_text(json.dumps({"lock_sha256": "0" * 64}))
    assert aiperf.installed(session) is None  # another lock's install
    lock_sha = hashlib.sha256(aiperf.LOCK.read_bytes()).hexdigest()
    (home / aiperf.MARKER).write_text(json.dumps({"version": AIPERF_VERSION, "lock_sha256": lock_sha}))
    assert aiperf.installed(session) == home / "bin" / "aiperf"
    assert aiperf.install_aiperf(session) == home / "bin" / "aiperf"  # installed: --offline is fine


def test_the_lock_pins_aiperf_and_every_package_by_hash() -> None:
    lines = aiperf.LOCK.read_text().splitlines()
    pins = [line for line in lines if line and not line.startswith(("#", " "))]
    assert any(line.startswith(f"aiperf=={AIPERF_VERSION} ") for line in pins)
    assert len(pins) > 100  # its ~140 dependencies: why it runs on the host, not in the serve container
    for line in pins:  # name==version [; marker] \ then its sha256 lines
        assert "==" in line.split(";")[0] and lines[lines.index(line) + 1].startswith("    --hash=sha256:"), (
            line
        )


def test_the_harness_row_sets_the_client_the_result_records() -> None:
    assert "suite" in HARNESSES and "aiperf" in HARNESSES  # the two this test uses (more may come)
    options = bench_options(BenchFlags(harness="aiperf", input_len="128", output_len="32"))
    assert options.harness == "aiperf" and options.suite.client == "aiperf"
    assert options.suite.params()["client_version"] == AIPERF_VERSION
    own = bench_options(BenchFlags())
    assert own.harness == "suite" and own.suite.client == "vllm bench serve"
    assert "client_version" not in own.suite.params()  # vLLM's client: the served image's vLLM (identity)
    with pytest.raises(RunError, match=r"--harness: unknown bench harness row .genai-perf.*suite, aiperf"):
        bench_options(BenchFlags(harness="genai-perf"))


def test_a_run_whose_responses_came_as_one_chunk_has_no_token_timing_and_is_refused() -> None:
    """Seen for real (depth 256 on the CPU twin): all 4 responses in one chunk, ITL 0, TTFT = latency."""
    doc = _doc(BY_BENCH)
    assert doc["inter_token_latency"]["p50"] == 0 and doc["http_req_chunks_received"]["max"] == 1
    with pytest.raises(
        RunError, match=r"every response arrived as one stream chunk.*re-run on a quieter machine"
    ):
        aiperf.export_figures("one-chunk", doc)

"""bench's own input boundary: result files (NaN/Infinity, negative figures, truncated JSON, FIFOs, devices,
directories, old schema, empty levels), thresholds, level lists, suites; and the clients' real files parsed."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from sparkforge.errors import RunError
from sparkforge.run.bench import figures
from sparkforge.run.bench.compare import check_threshold
from sparkforge.run.bench.results import load_result
from sparkforge.run.bench.suites import (
    SUITES,
    benchy_argv,
    check_repeats,
    choose_suite,
    level_name,
    parse_levels,
    run_order,
    vllm_argv,
)

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "real"
DEFAULT = RESULTS / "bench-cpu-twin-default.json"


def _doc() -> dict:
    return json.loads(DEFAULT.read_text())


def _refused(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(RunError, match=needle) as info:
        load_result(path)
    assert "fix:" in str(info.value) and "\n" not in str(info.value)


def test_nan_and_infinity_in_a_file_are_refused(tmp_path: Path) -> None:
    text = DEFAULT.read_text()
    value = json.dumps(_doc()["checks"][0]["details"]["repeats"][0]["output_tok_s"])
    for constant in ("NaN", "Infinity", "-Infinity"):
        _refused(
            tmp_path, text.replace(value, constant, 1), "cannot read it as JSON.*is not a number JSON allows"
        )


def test_a_result_is_read_by_the_boundarys_one_strict_reader(tmp_path: Path) -> None:
    """A key twice (the last one won silently) and 1e999 outside the figures (it became inf) are refused, naming
    the file, the key and bench's own fix (sparkforge.boundary.read_json with its `fix`)."""
    text = DEFAULT.read_text()
    value = json.dumps(_doc()["checks"][0]["details"]["repeats"][0]["output_tok_s"])
    twice = text.replace(f'"output_tok_s": {value}', f'"output_tok_s": 0.0, "output_tok_s": {value}', 1)
    assert twice != text
    fix = r"; fix: pass a file written by 'invoke bench --json' \(or one from the result store"
    _refused(
        tmp_path,
        twice,
        r"bench result \S+bad\.json: cannot read it as JSON \(key 'output_tok_s' appears twice\)" + fix,
    )
    doc = _doc()
    doc["suite"]["params"]["input_len"] = "__HUGE__"
    _refused(
        tmp_path, json.dumps(doc).replace('"__HUGE__"', "1e999"), r"\(1e999 overflows to infinity\)" + fix
    )


def test_negative_text_and_boolean_figures_are_refused(tmp_path: Path) -> None:
    for value in (-1.0, "12", True, None):
        doc = _doc()
        doc["checks"][2]["details"]["repeats"][1]["ttft_ms"] = value
        _refused(tmp_path, json.dumps(doc), r"c1-d512 repeat 1 ttft_ms .* is not a number from 0 to inf")


def test_truncated_and_non_result_files_are_refused(tmp_path: Path) -> None:
    text = DEFAULT.read_text()
    _refused(tmp_path, text[: len(text) // 2], r"cannot read it as JSON \(empty or truncated")
    _refused(tmp_path, "", r"cannot read it as JSON \(empty or truncated")
    _refused(tmp_path, '{"command": "verify", "checks": []}', "not a bench result")
    old = {**_doc(), "schema": None}
    _refused(tmp_path, json.dumps(old), "schema None, this sparkforge reads schema 2.*re-run 'invoke bench'")
    _refused(tmp_path, json.dumps({**_doc(), "checks": []}), "no levels measured")
    no_identity = {k: v for k, v in _doc().items() if k != "identity"}
    _refused(tmp_path, json.dumps(no_identity), "identity: missing")
    bad_level = _doc()
    bad_level["checks"][0]["details"]["concurrency"] = 0
    _refused(tmp_path, json.dumps(bad_level), "c1-d0: concurrency '0' is not a whole number from 1 to inf")
    for key, value in (("vllm", "$\\frac{1}{0}$"), ("vllm", "0.32\x1b[2J"), ("date", None)):
        labelled = _doc()
        labelled["identity"][key] = value
        _refused(tmp_path, json.dumps(labelled), rf"identity\.{key} .* is not a short plain text")
    empty = _doc()
    empty["checks"][0]["details"]["repeats"] = []
    _refused(tmp_path, json.dumps(empty), "no repeats")


def test_fifos_devices_and_directories_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    for path, needle in (
        (fifo, "not a regular file"),
        (Path("/dev/zero"), "not a regular file"),
        (tmp_path, "a folder, not a regular file"),
    ):
        with pytest.raises(RunError, match=needle):
            load_result(path)
    with pytest.raises(RunError, match=r"bench result .*absent\.json: cannot open it \(No such file"):
        load_result(tmp_path / "absent.json")


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "-inf", "ten", ""])
def test_thresholds_that_are_not_a_positive_finite_percent_are_refused(value: str) -> None:
    with pytest.raises(
        RunError, match=r"--threshold .* not a finite percent > 0; fix: pass e.g. --threshold 10"
    ):
        check_threshold(value)
    assert check_threshold("2.5") == 2.5


@pytest.mark.parametrize("text", ["", ",", "1,,2", "0,1", "a", "1.5", "1,1", "-1"])
def test_level_lists_are_whole_numbers_listed_once(text: str) -> None:
    with pytest.raises(RunError, match="--concurrency"):
        parse_levels("--concurrency", text, 1)
    assert parse_levels("--depth", "0,512", 0) == (0, 512)


def test_suites_their_sizes_and_repeats() -> None:
    arena = choose_suite("spark-arena-v2")
    assert (arena.input_len, arena.output_len, arena.concurrencies) == (2048, 128, (1, 2, 5, 10))
    assert arena.depths[0] == 0 and arena.depths[-1] == 100000 and arena.client == "llama-benchy"
    small = choose_suite("default", input_len=128, output_len=32, depths=(0, 512), concurrencies=(1, 2))
    assert small.levels() == [(1, 0), (2, 0), (1, 512), (2, 512)]
    with pytest.raises(RunError, match=r"--suite: unknown bench suite row 'fast'") as info:
        choose_suite("fast")
    assert f"choose from {', '.join(SUITES.names())}" in str(info.value)  # every suite, from the registry
    for bad in (0, -1, True):
        with pytest.raises(RunError, match="--repeats"):
            check_repeats(bad)


def test_the_clients_real_files_by_their_documented_keys() -> None:
    raw = json.loads((RESULTS / "bench-raw-vllm-c2-d512.json").read_text())
    figs, completed, failed = figures.vllm_repeat("raw", raw)
    assert completed == 4 and failed == 0 and figs["output_tok_s"] == raw["output_throughput"]
    assert figs["ttft_ms"] == raw["median_ttft_ms"] and figs["itl_ms"] == raw["median_itl_ms"]
    broken = copy.deepcopy(raw)
    broken["output_throughput"] = float("nan")
    with pytest.raises(RunError, match="output_throughput"):
        figures.vllm_repeat("raw", broken)


def test_llama_benchys_real_file_by_its_documented_keys() -> None:
    benchy = json.loads((RESULTS / "bench-raw-llama-benchy.json").read_text())
    levels = figures.benchy_levels(
        "raw", benchy, 1
    )  # one round: the runner starts llama-benchy once per repeat
    assert sorted(levels) == [(1, 0), (1, 512), (2, 0), (2, 512)]
    row = next(r for r in benchy["benchmarks"] if (r["concurrency"], r["context_size"]) == (2, 512))
    assert [r["output_tok_s"] for r in levels[(2, 512)]] == row["tg_throughput"]["values"]
    assert all(r["ttft_ms"] > 0 and r["prefill_tok_s"] > 0 for r in levels[(2, 512)])
    with pytest.raises(RunError, match="do not split into 2 runs"):
        figures.benchy_levels("raw", benchy, 2)  # 1 run was written: 2 cannot be read out of it


def test_speculative_acceptance_from_vllms_counters() -> None:
    before = figures.spec_counters(
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 20.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 5.0\n',
        "server",
    )
    after = {"drafts": 110.0, "draft_tokens": 220.0, "accepted": 155.0}
    spec = figures.acceptance(before, after)
    assert spec is not None and spec["acceptance_rate"] == pytest.approx(0.75)
    assert spec["mean_acceptance_length"] == pytest.approx(2.5)  # 1 verified + 1.5 accepted per step
    assert figures.acceptance({}, figures.spec_counters("vllm:num_requests_running 0.0\n", "server")) is None
    # The served text is untrusted: a malformed sample of an allow-listed counter is an error naming where.
    with pytest.raises(RunError, match=r"server: not a counter sample: .*fix: check that the served image"):
        figures.spec_counters("vllm:spec_decode_num_drafts_total 1.0 junk\n", "server")


def test_rounds_interleave_the_levels_and_every_run_sends_its_own_full_set_of_prompts() -> None:
    suite = choose_suite("default", concurrencies=(1, 2), depths=(0, 512), num_prompts=4)
    order = [f"{level_name(*level)}-{tag}" for level, tag in run_order(suite, 2, True)]
    rounds = [
        [f"{n}-{tag}" for n in ("c1-d0", "c2-d0", "c1-d512", "c2-d512")] for tag in ("warmup", "r1", "r2")
    ]
    assert order == [run for r in rounds for run in r]  # round by round, not level by level
    assert [t for _, t in run_order(suite, 1, False)] == ["r1"] * 4
    warm = vllm_argv(suite, "m", "tok", "8000", (2, 512), "c2-d512-warmup", 41)
    assert warm[warm.index("--num-prompts") + 1] == "4" and warm[warm.index("--seed") + 1] == "41"
    assert warm[warm.index("--random-prefix-len") + 1] == "512"
    benchy = benchy_argv(choose_suite("spark-arena-v2"), "m", "tok", "8000", False, "/tmp/r1.json")
    assert benchy[benchy.index("--runs") + 1] == "1" and "--no-warmup" in benchy
    assert "--no-warmup" not in benchy_argv(suite, "m", "tok", "8000", True, "/tmp/r1.json")

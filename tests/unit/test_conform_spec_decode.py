"""Speculative decoding's acceptance: vLLM's /metrics read strictly (real Prometheus text captured from a vLLM
server in the CPU twin drafting with the tiny model's MTP layer: tests/unit/fixtures/spec-decode-metrics-*.txt),
the `spec_decode` entry a drafting server gets in the report before it stops, the `speculative-acceptance`
row's verdicts, and the profile key `conform.speculative.min_acceptance`. The servers here are real HTTP
servers on 127.0.0.1 answering /metrics with the captured text."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from conform_http import conform_run, http_server

from sparkforge.errors import ProfileError, RunError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.profile import load_profile
from sparkforge.run.conform.session import settings_of
from sparkforge.run.conform.spec_acceptance import judge, speculative_acceptance
from sparkforge.run.conform.spec_decode import SpecDecodeCounts, parse_spec_decode

FIXTURES = Path(__file__).with_name("fixtures")
# Captured from vLLM 0.32.0's /metrics (the CPU twin, the MTP profile, num_speculative_tokens 1) after six greedy
# completions of 24 tokens (benchmarks/conform.md, "Speculative decoding's acceptance").
CLEAN = (
    FIXTURES / "spec-decode-metrics-untrained-mtp.txt"
)  # the untrained MTP layer: 0 of 138 drafts accepted
ACCEPT_ALL = FIXTURES / "spec-decode-metrics-accept-all.txt"  # the planted fault: 72 of 72 accepted
CLEAN_DRAFT, CLEAN_ACCEPTED = 138, 0
PROFILES = REPO_ROOT / "tests" / "profiles"
MTP = PROFILES / "cpu-tiny-qwen35moe-conform-mtp.yaml"
PLAIN = PROFILES / "cpu-tiny-qwen35moe-conform.yaml"
WHERE = "http://127.0.0.1:8000/metrics"


def test_the_real_counters_are_read_and_the_other_metrics_ignored() -> None:
    clean = parse_spec_decode(CLEAN.read_text(), WHERE)
    assert clean == SpecDecodeCounts(CLEAN_DRAFT, CLEAN_ACCEPTED)
    assert clean.as_report() == {
        "draft_tokens": CLEAN_DRAFT,
        "accepted_tokens": CLEAN_ACCEPTED,
        "acceptance": round(CLEAN_ACCEPTED / CLEAN_DRAFT, 6),
    }
    assert clean.acceptance == 0.0
    assert parse_spec_decode(ACCEPT_ALL.read_text(), WHERE) == SpecDecodeCounts(72, 72)


def test_counters_are_summed_over_engines_and_printed_as_floats() -> None:
    text = (
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 1.2e+06\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 40.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30.0\n'
        "vllm:spec_decode_num_accepted_tokens_total 10 1700000000000\n"
        'vllm:spec_decode_num_draft_tokens_created{engine="0"} 1.7e+09\n'  # not a counter read: ignored
    )
    assert parse_spec_decode(text, WHERE) == SpecDecodeCounts(1_200_040, 40)
    assert SpecDecodeCounts(0, 0).as_report() == {"draft_tokens": 0, "accepted_tokens": 0, "acceptance": None}


@pytest.mark.parametrize(
    "line",
    [
        "vllm:spec_decode_num_accepted_tokens_total NaN",
        "vllm:spec_decode_num_accepted_tokens_total +Inf",
        "vllm:spec_decode_num_accepted_tokens_total -3.0",
        "vllm:spec_decode_num_accepted_tokens_total 2.5",
        "vllm:spec_decode_num_accepted_tokens_total 1e400",
        "vllm:spec_decode_num_accepted_tokens_total 0x10",
        "vllm:spec_decode_num_accepted_tokens_total 3 junk",
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 3\x1b[2J',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0" 3',
        "vllm:spec_decode_num_accepted_tokens_total{engine=0} 3",
        "vllm:spec_decode_num_accepted_tokens_total",
    ],
)
def test_a_counter_line_that_is_not_a_plain_sample_is_an_error_naming_the_url(line: str) -> None:
    text = "vllm:spec_decode_num_draft_tokens_total 10.0\n" + line + "\n"
    with pytest.raises(RunError) as info:
        parse_spec_decode(text, WHERE)
    assert WHERE in str(info.value) and "fix:" in str(info.value) and "\x1b" not in str(info.value)


def test_missing_counters_and_more_accepted_than_drafted_are_errors() -> None:
    plain = "\n".join(
        line for line in CLEAN.read_text().splitlines() if "spec_decode_num_accepted_tokens_total" not in line
    )
    with pytest.raises(RunError, match="no vllm:spec_decode_num_accepted_tokens_total counter"):
        parse_spec_decode(plain, WHERE)
    with pytest.raises(RunError, match="more than drafted"):
        parse_spec_decode(
            "vllm:spec_decode_num_draft_tokens_total 3.0\nvllm:spec_decode_num_accepted_tokens_total 4.0\n",
            WHERE,
        )
    with pytest.raises(RunError, match="characters"):
        parse_spec_decode("x" * (17 << 20), WHERE)


def test_the_verdict_against_the_floor() -> None:
    at = judge(SpecDecodeCounts(100, 50), 0.5)
    assert at.status == "passed" and at.details == {
        "draft_tokens": 100,
        "accepted_tokens": 50,
        "acceptance": 0.5,
        "min_acceptance": 0.5,
    }
    below = judge(SpecDecodeCounts(100, 49), 0.5)
    assert below.status == "failed" and "49 of 100 draft tokens accepted" in below.reason
    assert "below the floor 0.5" in below.reason and "conform.speculative.min_acceptance" in below.reason
    none = judge(SpecDecodeCounts(0, 0), 0.5)
    assert none.status == "failed" and "0 draft tokens" in none.reason
    unset = judge(SpecDecodeCounts(100, 3), None)
    assert unset.status == "passed" and "fix: set conform.speculative.min_acceptance" in unset.reason


class _Metrics(BaseHTTPRequestHandler):
    text = ""

    def do_GET(self) -> None:
        body = self.text.encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, type[_Metrics]]]:
    handler = type("Handler", (_Metrics,), {"text": CLEAN.read_text()})
    with http_server(handler) as base:
        yield base, handler


def test_a_drafting_server_gets_its_counts_in_its_entry_before_it_stops(metrics_server) -> None:
    base, handler = metrics_server
    run = conform_run(MTP, base, [{"config": "as profiled"}])
    run.servers.client, run.servers.speculative = run.client, True
    run.servers.note_spec_decode()
    entry = run.servers.started[0]["spec_decode"]
    assert entry == SpecDecodeCounts(CLEAN_DRAFT, CLEAN_ACCEPTED).as_report()
    run.servers.started.append({"config": "speculative decoding off"})
    run.servers.note_spec_decode()  # read once: the next server (not drafting) gets nothing
    assert "spec_decode" not in run.servers.started[1]
    # A server whose /metrics is not vLLM's: the reason is kept, the stop goes on.
    handler.text = "vllm:spec_decode_num_draft_tokens_total 1; rm -rf /\n"
    run.servers.started.append({"config": "again"})
    run.servers.speculative = True
    run.servers.note_spec_decode()
    assert "not a counter sample" in run.servers.started[2]["spec_decode_error"]


def test_the_row_judges_the_recorded_entry_or_reads_the_live_server(metrics_server) -> None:
    base, _ = metrics_server
    recorded = {"config": "as profiled", "spec_decode": SpecDecodeCounts(10, 9).as_report()}
    run = conform_run(MTP, base, [recorded])
    speculative_acceptance(run)
    row = run.report.checks[-1]
    assert (
        row.name == "speculative-acceptance"
        and row.status == "passed"
        and row.details["accepted_tokens"] == 9
    )
    # Still serving (attached or no variant): read now from its /metrics, the profile's floor applied.
    live = conform_run(MTP, base)
    floor = live.settings.model_copy(
        update={"speculative": live.settings.speculative.model_copy(update={"min_acceptance": 0.5})}
    )
    live.settings = floor
    speculative_acceptance(live)
    row = live.report.checks[-1]
    assert row.status == "failed" and f"{CLEAN_ACCEPTED} of {CLEAN_DRAFT} draft tokens accepted" in row.reason
    # No speculative decoding in the profile: skipped, saying so.
    plain = conform_run(PLAIN, base)
    speculative_acceptance(plain)
    assert plain.report.checks[-1].status == "skipped"
    assert "sets no speculative decoding" in plain.report.checks[-1].reason


@pytest.mark.parametrize("value", ["1.5", "0", "-0.2", '"0.5"', "true", "[0.5]"])
def test_a_bad_floor_is_a_profile_error_naming_file_key_and_fix(tmp_path: Path, value: str) -> None:
    text = MTP.read_text()
    assert "    min_acceptance: 0.5\n" in text  # the MTP test profile's own floor, replaced
    text = text.replace("    min_acceptance: 0.5\n", f"    min_acceptance: {value}\n")
    path = tmp_path / "bad-floor.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert f"{path}:" in message and "conform.speculative.min_acceptance" in message and "fix:" in message


def test_the_floor_is_read_from_the_profile(tmp_path: Path) -> None:
    text = MTP.read_text().replace("    min_acceptance: 0.5\n", "    min_acceptance: 0.6\n")
    path = tmp_path / "floor.yaml"
    path.write_text(text)
    assert settings_of(load_profile(path)).speculative.min_acceptance == 0.6
    assert settings_of(load_profile(MTP)).speculative.min_acceptance == 0.5
    unset = tmp_path / "unset.yaml"
    unset.write_text(text.replace("  speculative:\n    min_acceptance: 0.6\n", ""))
    assert settings_of(load_profile(unset)).speculative.min_acceptance is None
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(text.replace("min_acceptance", "min_accept"))
    with pytest.raises(ProfileError, match="min_accept"):
        load_profile(unknown)

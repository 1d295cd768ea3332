"""The `sampled-answers` row: the known-answer probes asked with sampling, as users serve, each with its own seed.

A real HTTP server on 127.0.0.1 answers conform's chat requests as an OpenAI-compatible server does, from the
probes' own answers: right in both modes, or right only when greedy (a fault of the sampling path, as vLLM's
rejection sampler garbling sampled drafts under speculative decoding, measured on the twin and caught there by
tests/engine/test_conform_mtp_real.py). The row's requests, verdicts and the hint that names the sampling path
are checked; the profile keys are strict."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
from conform_http import conform_run, http_server
from pydantic import ValidationError

from sparkforge.recipe.conformspec import ConformSettings
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run.conform.instruct_probes import instruct_probe_set
from sparkforge.run.conform.known_answers import known_answers, sampled_answers
from sparkforge.run.conform.probes import probe_set

PROFILES = REPO_ROOT / "tests" / "profiles"
MTP = PROFILES / "cpu-tiny-qwen35moe-conform-mtp.yaml"
PLAIN = PROFILES / "cpu-tiny-qwen35moe-conform.yaml"


class _Chats(BaseHTTPRequestHandler):
    answers: dict[str, str] = {}
    garble_sampled = False
    bodies: list[dict] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        answer = self.answers.get(body["messages"][0]["content"], "")
        if self.garble_sampled and body.get("temperature", 1.0) > 0:
            answer = "w155 55 14 w120"
        reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def chats() -> Iterator[tuple[str, type[_Chats]]]:
    probes = probe_set(0, 120)
    handler = type("Handler", (_Chats,), {"answers": {p.prompt: p.answer for p in probes}, "bodies": []})
    with http_server(handler) as base:
        yield base, handler


def test_right_answers_sampled_pass_with_a_seed_per_probe(chats) -> None:
    base, handler = chats
    run = conform_run(PLAIN, base)
    sampled_answers(run)
    (row,) = run.report.checks
    assert row.name == "sampled-answers" and row.status == "passed", row.reason
    assert run.settings.known_answers.sampled.temperature == 1.0  # the profile's, over the default 0.6
    assert row.details["right"] == 120 and row.details["temperature"] == 1.0 and row.details["top_p"] == 1.0
    assert row.reason.startswith("temperature 1, top-p 1: 120/120 right")
    seeds = [b["seed"] for b in handler.bodies]
    assert seeds == list(range(run.settings.seed, run.settings.seed + 120))  # reproducible, each its own
    assert {(b["temperature"], b["top_p"]) for b in handler.bodies} == {(1.0, 1.0)}


def test_a_sampling_only_garble_fails_and_names_the_sampling_path(chats) -> None:
    base, handler = chats
    handler.garble_sampled = True
    run = conform_run(MTP, base)  # speculative decoding on
    known_answers(run)
    sampled_answers(run)
    greedy, sampled = run.report.checks
    assert greedy.status == "passed" and greedy.details["right"] == 120
    assert sampled.status == "failed" and sampled.details["right"] == 0
    assert "the greedy probes passed, so the sampling path is at fault" in sampled.reason
    assert "speculative decoding is on" in sampled.reason and "rejection sampler" in sampled.reason
    # Without speculative decoding the hint stops at the sampling path.
    plain = conform_run(PLAIN, base)
    known_answers(plain)
    sampled_answers(plain)
    assert plain.report.checks[1].status == "failed" and "speculative" not in plain.report.checks[1].reason


@pytest.mark.parametrize(
    "bad",
    [{"temperature": 0}, {"temperature": 2.5}, {"top_p": 0}, {"floor": 1.2}, {"floor": "0.8"}, {"seed": 1}],
)
def test_the_sampled_keys_are_strict(bad: dict) -> None:
    with pytest.raises(ValidationError):
        ConformSettings.model_validate({"known_answers": {"sampled": bad}})
    defaults = ConformSettings.model_validate({}).known_answers.sampled
    assert (defaults.temperature, defaults.top_p, defaults.floor) == (0.6, 0.95, 0.8)


def test_a_real_models_lead_in_passes_the_instruct_set_the_default_for_a_profile_without_twin(
    tmp_path,
) -> None:
    # A real model's replies: a sentence of its own, then the "Answer:" line the instruct probes ask for.
    instruct = instruct_probe_set(0, 120)
    replies = {p.prompt: f"Sure, here it is.\nAnswer: {p.answer.replace(' , ', ', ')}" for p in instruct}
    handler = type("Handler", (_Chats,), {"answers": replies, "bodies": []})
    real = tmp_path / "cpu-tiny-qwen35moe-conform.yaml"
    real.write_text(PLAIN.read_text().replace("    probes: twin\n", ""))
    with http_server(handler) as base:
        run = conform_run(real, base)
        assert run.settings.known_answers.probes == "instruct"  # the default
        known_answers(run)
        twin = conform_run(PLAIN, base)  # the twin's words: not what this server was asked
        known_answers(twin)
    (row,) = run.report.checks
    assert row.status == "passed" and row.details["right"] == 120 and row.details["probes"] == "instruct", (
        row.reason
    )
    assert [b["messages"][0]["content"] for b in handler.bodies[:120]] == [p.prompt for p in instruct]
    assert twin.report.checks[0].status == "failed" and twin.report.checks[0].details["probes"] == "twin"

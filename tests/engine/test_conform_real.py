"""`invoke conform` for real: vLLM's CPU platform in the twin image serving the tiny Qwen3.5-MoE trained to count.

Every answer has a known value (an arithmetic progression modulo 100), so the rows judge right or wrong: the
prompt set twice (and seeded sampling twice), streaming, 4 concurrent, prefix caching off, chunked prefill off
(three server starts), a 4,096-token decode exact to the last token, conform's 120 known-answer probes all right
(the model learnt them), prefix-cache hits in vLLM's /metrics, the
API surface (a base64 image answered by the vision-language class, a tool call through vLLM's qwen3_coder parser,
a thought taken apart by its qwen3 reasoning parser), a golden recorded. Then one more server
start for two stories: a deployment whose answer check fails stays up (no --down-on-fail), conform refuses to
start over it and attaches to it; that deployment carries faults planted INSIDE the real vLLM, each caught by
the right row (never a mock of vLLM): the twin plus one layer holding tests/engine/planted_faults.py (a derived
image, built in seconds), vLLM's own `--logits-processors` loading it (greedy decodes corrupted from token 40
on; sampled requests ignoring their seed), and prefix caching switched off by its flag: determinism catches the
seed, long-decode and golden the corruption (naming token 40 and both continuations), prefix-cache the silent
0 %. Four server starts in all.
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from cluster import DOCKER, sh
from conform_fixtures import CONFORM_PROFILE, FAULTY, PORT, conform, faulty_image, launch_args
from real_fixtures import REAL_TIMINGS, TWIN_RECIPE, cpu_twin, trained_model  # noqa: F401
from test_serve_real import invoke

from sparkforge.recipe.allowlist import opt_in_reason

# CI budget (tests/engine/ci_budget.py): 531 s here with the twin and the trained model cached (+ ~13 min training
# on a fresh machine when test_serve_real did not run first); four server starts (benchmarks/conform.md, ci.md).
pytestmark = [
    pytest.mark.engine,
]
PROFILE = "cpu-tiny-qwen35moe-conform"


def _rows(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"]}


@pytest.mark.must_run
@pytest.mark.slow(cost_s=300, rank=2, reason="the clean conform run: three servers and the reference (199 s)")
def test_conform_passes_every_row_on_the_trained_model(clean_conform: tuple[dict, Path]) -> None:
    doc, golden = clean_conform
    rows = _rows(doc)
    print(
        json.dumps(
            {n: (r["status"], round(r["duration_s"], 1), r["reason"][:160]) for n, r in rows.items()},
            indent=1,
        )
    )
    assert doc["command"] == "conform" and doc["status"] == "passed" and doc["vllm"] == "0.32.0"
    ran = {"determinism", "equivalence:streaming", "equivalence:concurrency", "equivalence:prefix-caching",
           "equivalence:chunked-prefill", "prefix-cache", "long-decode", "known-answers", "sampled-answers", "api",
           "golden", "reference"}  # fmt: skip
    assert {n for n, r in rows.items() if r["status"] == "passed"} == ran
    # The one skip is named: the twin profile does not use speculative decoding.
    assert rows["equivalence:speculative"]["status"] == "skipped"
    assert "does not use speculative decoding" in rows["equivalence:speculative"]["reason"]
    assert "seeded sampling" in rows["determinism"]["reason"]
    long = rows["long-decode"]["details"]
    assert long["tokens"] == long["asked"] == 4096 and long["right"] == long["answer_tokens"] == 4096
    REAL_TIMINGS["greedy_accuracy_vllm"] = long["right"] / long["answer_tokens"]
    # conform's own probe set (seed 0, 120: arithmetic, copying, long-range recall, counting, ordering, format),
    # which the tiny model learnt, answered through the served chat path: every one right, the floor the profile's.
    known = rows["known-answers"]["details"]
    why = rows["known-answers"]["reason"]
    assert known["right"] == known["total"] == 120 and known["accuracy"] == 1.0, why
    assert known["floor"] == 0.9 and known["wilson95"][0] >= 0.96 and known["seed"] == 0
    assert set(known["by_kind"].values()) == {"20/20"}, known["by_kind"]
    REAL_TIMINGS["known_answers_vllm"] = known["accuracy"]
    # The same probes sampled (temperature 1, a seed each): the sampling path gives the answers too.
    sampled = rows["sampled-answers"]["details"]
    assert sampled["temperature"] == 1.0 and sampled["floor"] == 0.8 and sampled["wilson95"][0] >= 0.8, (
        sampled
    )
    REAL_TIMINGS["sampled_answers_vllm"] = sampled["accuracy"]
    assert rows["prefix-cache"]["details"]["hit_tokens"] > 0
    assert rows["equivalence:concurrency"]["details"]["tokens"] > 0
    api = rows["api"]["details"]
    assert "3 asked, 3 returned" in api["max_tokens"] and "finish stop" in api["stop"]
    # The base64 PNG (64x64: 2x2 merged 16-pixel patches on the tiny model's Qwen3-VL processor) is answered by
    # the vision-language class, its 4 image tokens and the vision start/end markers counted in the prompt usage.
    assert "answered by Qwen3_5MoeForConditionalGeneration" in api["image"], api["image"]
    assert "the image counted 6 prompt tokens" in api["image"], api["image"]
    # The shipped profiles' parsers, for real: vLLM's qwen3_coder parsed the model's XML call into JSON arguments,
    # its qwen3 parser took the thought apart from the answer.
    assert api["tool_call"] == "get_weather with JSON arguments", api["tool_call"]
    assert api["reasoning"].startswith("reasoning ") and api["reasoning"].endswith("answer apart"), api[
        "reasoning"
    ]
    assert [s["config"] for s in doc["servers"]] == [
        "as profiled",
        "prefix caching off",
        "chunked prefill off",
    ]
    recorded = json.loads(golden.read_text())
    assert recorded["vllm"] == "0.32.0" and recorded["image"]["id"].startswith("sha256:")
    assert len(recorded["model"]["revision"]) == 64 and len(recorded["token_ids"]) == 7
    REAL_TIMINGS.update({f"conform_{n}_s": round(r["duration_s"], 1) for n, r in rows.items()})
    REAL_TIMINGS["conform_server_starts_s"] = [s["start_s"] for s in doc["servers"]]
    print(f"conform timings: {REAL_TIMINGS}")


def _running() -> list[str]:
    return subprocess.run(
        [DOCKER, "ps", "-q", "--filter", f"label=dev.sparkforge.run.profile={PROFILE}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip


@pytest.mark.must_run
@pytest.mark.slow(cost_s=150, rank=2, reason="one faulty twin server kept and attached to (98 s)")
def test_a_kept_deployment_with_planted_faults_is_attached_to_and_each_fault_caught(
    cpu_twin: str, trained_model: Path, clean_conform: tuple[dict, Path], tmp_path: Path
) -> None:
    """One server start for two stories: serve keeps a deployment whose answer check fails, conform refuses to
    start over it and attaches to it instead; that deployment carries the planted faults, each caught."""
    _, golden = clean_conform
    args = launch_args(faulty_image(cpu_twin, tmp_path / "faulty-image"), trained_model, tmp_path / "cache")
    try:
        code, out, _ = invoke(
            "serve", "--recipe", TWIN_RECIPE, "--profile", str(_faulty_profile(tmp_path)), *args[:-2]
        )
        # serve's chat check samples (temperature 1): the seed fault scrambles it, and the expectation is wrong too.
        assert code == 1 and "does not match" in out, out[-3000:]
        assert "the deployment stays up" in out and len(_running()) == 1
        # conform will not start over a running profile: nothing is stopped.
        code, out, _ = conform(CONFORM_PROFILE, *args)
        assert code == 1 and "already running" in out and "--attach" in out and len(_running()) == 1
        _faults_caught(golden, tmp_path)
    finally:
        log = sh(DOCKER, "logs", "--tail", "400", f"sparkforge-serve-{PROFILE}-0", check=False)
        lines = [
            x for x in (log.stdout + log.stderr).splitlines() if "Route:" not in x and "GET /health" not in x
        ]
        print("---- the kept deployment's last lines ----\n" + "\n".join(lines[-150:]))
        invoke("serve.down", "--profile", PROFILE)
        sh(DOCKER, "rmi", FAULTY, check=False)
    assert _running() == []


def _faulty_profile(tmp_path: Path) -> Path:
    """The conform profile (same name) with a wrong expected answer, the two planted logits processors loaded by
    vLLM's own --logits-processors (greedy corrupted from token 40; seeds ignored) and prefix caching off."""
    doc = yaml.safe_load(Path(CONFORM_PROFILE).read_text())
    doc["check"]["expect"] = "^\\s*9 9"
    doc["args"]["logits-processors"] = [
        "sparkforge_faults:CorruptAfter",
        "sparkforge_faults:UnseededSampling",
    ]
    doc["args"]["enable-prefix-caching"] = False
    # --logits-processors loads code by import name: off the allow-list, so the faulty profile opts in, as a
    # reviewer would, with its reason (the task prints it as a warning line).
    doc["allow"] = {
        "logits-processors": opt_in_reason(
            "the test's own planted faults (tests/engine/planted_faults.py)", doc["args"]["logits-processors"]
        )
    }
    # The whole long prompt in one prefill step: vLLM 0.32's CPU platform crashes its engine core on a SEEDED
    # request prefilled in chunks (gpu_model_runner rewinds the request's generator with get_offset(), which a
    # CPU generator refuses: "CPU Generator does not use offset"); with prefix caching on (the clean run) the
    # long prompt's prefix is cached, so it never chunks. benchmarks/conform.md records it.
    doc["args"]["max-num-batched-tokens"] = doc["args"]["max-model-len"]
    path = tmp_path / f"{PROFILE}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _faults_caught(golden: Path, tmp_path: Path) -> None:
    report = tmp_path / "faults.json"
    code, out, seconds = conform(
        CONFORM_PROFILE, "--attach", f"http://127.0.0.1:{PORT}", "--golden", str(golden), "--json", str(report),
        "--checks", "determinism,equivalence,prefix-cache,long-decode,api,golden",
    )  # fmt: skip
    REAL_TIMINGS["conform_attach_faults_s"] = round(seconds, 1)
    failed = "conform failed (determinism, long-decode, prefix-cache, golden)"
    assert code == 1 and failed in out, out[-5000:]
    rows = _rows(json.loads(report.read_text()))
    # Attached: the rows that need another server configuration say so; the in-server ones run (and pass: the
    # corruption is deterministic, so streaming and concurrency agree with it).
    assert rows["equivalence:prefix-caching"]["status"] == "skipped"
    assert "--attach" in rows["equivalence:prefix-caching"]["reason"]
    assert rows["equivalence:streaming"]["status"] == rows["equivalence:concurrency"]["status"] == "passed"
    assert rows["api"]["status"] == "passed", rows["api"]["reason"]
    # The seed fault: greedy runs agree, seeded sampling does not.
    assert rows["determinism"]["status"] == "failed" and "seed 1234 run 1" in rows["determinism"]["reason"]
    # The corruption from token 40: the long decode's first wrong token, and the golden's first divergence.
    assert "not-the-answer at token 40" in rows["long-decode"]["reason"], rows["long-decode"]["reason"]
    assert rows["long-decode"]["details"]["right"] == 40
    assert rows["golden"]["details"]["position"] == 40 and "diverges at token 40" in rows["golden"]["reason"]
    assert "'user" in rows["golden"]["reason"]  # this run's continuation, detokenized by vLLM
    # The flag: the repeated prefix hits nothing (vLLM counts no query, or queries without a hit).
    reason = rows["prefix-cache"]["reason"]
    assert rows["prefix-cache"]["status"] == "failed" and rows["prefix-cache"]["details"]["hit_tokens"] == 0
    assert "no prefix-cache queries" in reason or "0 hits of" in reason, reason

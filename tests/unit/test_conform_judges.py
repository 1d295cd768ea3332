"""The garble detector, the known-answer oracle, the /metrics counters and the known-bad list:
pure functions on real-shaped inputs (vLLM's Prometheus text, the shipped profiles, the data file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit

from sparkforge.cli.run import serve
from sparkforge.errors import PreflightError
from sparkforge.preflight.knownbad import guard, known_bad_check, load_known_bad, matches
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.recipe.profile import list_profile_names, load_profile
from sparkforge.run.conform.client import counter
from sparkforge.run.conform.garble import GarbleRules, exactness, judge, progression_answer
from sparkforge.run.conform.servers import refusal

RULES = GarbleRules()


def _counting(start: int, step: int, n: int) -> list[int]:
    return [(start + k * step) % 100 for k in range(n)]


def test_counting_is_not_garble_but_loops_and_collapse_are() -> None:
    for step in (1, 2, 3, 99):
        ids = _counting(5, step, 4096)
        assert not judge(ids, " ".join(map(str, ids)), RULES).findings
    looped = _counting(0, 1, 1000) + [7, 8, 9] * 100
    verdict = judge(looped, "x", RULES)
    assert [f.rule for f in verdict.findings] == ["loop", "diversity-collapse"]
    assert verdict.findings[0].position == 1000 and "3-token cycle [7, 8, 9]" in verdict.findings[0].detail
    stuck = _counting(0, 1, 900) + [5] * 300
    assert judge(stuck, "x", RULES).findings[0].position == 900


def test_a_replacement_character_is_garble() -> None:
    text = "9 10 11 " + bytes([0xE2, 0x82]).decode("utf-8", errors="replace") + " 12"
    verdict = judge([1, 2, 3], text, RULES)
    assert verdict.findings[0].rule == "replacement-character" and "character 8" in verdict.findings[0].detail


def test_the_known_answer_names_the_first_wrong_token() -> None:
    assert progression_answer("3 4", 3, 100) == ["5", "6", "7"]
    assert progression_answer("93 96", 3, 100) == ["99", "2", "5"]
    assert progression_answer("50 49", 2, 100) == ["48", "47"]
    right, total, wrong = exactness("5 6 7 8 user user", "3 4", 6, 100)
    assert (right, total) == (4, 6) and wrong and wrong.position == 4 and "'9 10'" in wrong.detail
    assert exactness("5 6", "3 4", 4, 100)[2].position == 2  # a short answer is wrong where it ends
    with pytest.raises(ValueError):
        progression_answer("hello", 3, 100)


METRICS = """# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-qwen35moe"} 592.0
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-qwen35moe"} 1207.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny-qwen35moe"} 1.7e9
"""


def test_prometheus_counters_are_read_by_name() -> None:
    assert counter(METRICS, "vllm:prefix_cache_hits") == 592.0
    assert counter(METRICS, "vllm:prefix_cache_queries") == 1207.0
    assert counter(METRICS, "vllm:external_prefix_cache_hits") == 0.0


def _mtp_profile(tmp_path: Path, prefix: str = "") -> Path:
    text = (REPO_ROOT / "profiles" / "qwen35-35b-a3b-fp8.yaml").read_text()
    text = text.replace("  enable-prefix-caching: true\n", prefix)
    text = text.replace(
        "args:\n", 'args:\n  speculative-config: \'{"method": "mtp", "num_speculative_tokens": 2}\'\n'
    )
    path = tmp_path / "qwen35-mtp.yaml"
    path.write_text(text)
    return path


def test_mtp_with_prefix_caching_on_qwen35_is_refused_naming_the_report(tmp_path: Path) -> None:
    entries = load_known_bad()
    assert all(
        r.url.startswith("https://github.com/vllm-project/vllm/issues/") for e in entries for r in e.reports
    )
    profile = load_profile(_mtp_profile(tmp_path))  # prefix caching on by vLLM's default
    found = matches(profile, "0.33.0")
    assert [m.entry.id for m in found] == ["mtp-with-prefix-caching-on-hybrid-gdn"]
    assert "vllm-project/vllm/issues/43559" in found[0].message() and "fix:" in found[0].message()
    assert known_bad_check(profile, "0.33.0").status == "failed"
    assert matches(profile, "0.24.0") == []  # before the first report
    with pytest.raises(PreflightError, match="nothing was started"):
        guard(profile, "0.33.0", print)
    off = load_profile(_mtp_profile(tmp_path, "  enable-prefix-caching: false\n"))
    assert matches(off, "0.33.0") == [] and known_bad_check(off, "0.33.0").status == "passed"


def test_serve_refuses_the_known_bad_profile_before_any_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://192.0.2.1:9")
    recipe = str(REPO_ROOT / "recipes" / "vllm-qwen35.yaml")
    with pytest.raises(Exit) as info:
        serve(Context(), recipe=recipe, profile=str(_mtp_profile(tmp_path)), no_preflight=True, image="x:y")
    assert "known-bad combination" in str(info.value.message) and "issues/43559" in str(info.value.message)


def test_shipped_profiles_carry_conform_settings_a_spark_owner_can_run() -> None:
    for name in list_profile_names():
        settings = load_profile(name).model.conform
        assert settings is not None, name
        assert settings.long_decode.tokens >= 4096 and settings.prompts


def test_every_known_bad_entry_was_re_checked_for_every_pinned_vllm() -> None:
    pinned = {
        load_recipe(path).model.components.vllm.version
        for path in [
            *sorted((REPO_ROOT / "recipes").glob("[!_]*.yaml")),
            REPO_ROOT / "tests/recipes/ci-cpu-twin.yaml",
        ]
        if load_recipe(path).model.components.vllm is not None
    }
    assert pinned
    for entry in load_known_bad():
        missing = sorted(v for v in pinned if not entry.rechecked_for(v))
        assert not missing, (
            f"known_bad.yaml entry {entry.id} was not re-checked for the pinned vLLM {missing}; fix: read its "
            "upstream reports again (still open? a fix in that release?) and update its `checked`"
        )
        assert "re-checked" in entry.describe() and entry.checked.upstream in entry.describe()


# vLLM's own words when it refuses a configuration (pydantic config checks, its argument parser, engine-args
# checks), and what a crash at start looks like (explain_exit's paragraph with the last log lines).
REFUSED = [
    (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig\n"
        "  Value error, Chunked prefill is required for mamba cache mode 'align' [type=value_error, input_value=",
        "Chunked prefill is required for mamba cache mode 'align'",
    ),
    ("vllm serve: error: unrecognized arguments: --bogus-flag 1", "unrecognized arguments: --bogus-flag 1"),
    (
        "ValueError: Speculative decoding is not supported with pipeline parallelism",
        "Speculative decoding is not",
    ),
]
CRASHED = [
    "vLLM on local (rank 0) exited with code 1: vLLM exited; fix: read the log lines below. Every container of "
    "this launch was removed.\n  last lines on local:\n    torch.AcceleratorError: CUDA error: an illegal memory "
    "access was encountered\n    RuntimeError: Engine core initialization failed. See root cause above.",
    "the GPU ran out of memory (CUDA out of memory. Tried to allocate 2.00 GiB)",
    "stage health: vLLM did not become healthy within 900 s after the weights were on disk (the head was "
    "capturing CUDA graphs)",
    "RuntimeError: planted start-up crash (tests/engine/planted_faults.py)",
]


@pytest.mark.parametrize(("message", "words"), REFUSED)
def test_a_configuration_vllm_refuses_is_told_apart_quoting_vllm(message: str, words: str) -> None:
    assert refusal(message).startswith(words)


@pytest.mark.parametrize("message", CRASHED)
def test_a_crash_oom_or_timeout_at_start_is_not_a_refusal(message: str) -> None:
    assert refusal(message) == ""

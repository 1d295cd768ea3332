"""Serve profiles: validation with file:line errors, the serve arguments, and the preflight of flags and
parser names against the real vLLM 0.33.0 wheel from PyPI (only the needed members, by range requests)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkforge.errors import ProfileError
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.preflight.serveflags import check_serve_profiles, recipe_surface, unknown_flags
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.recipe.profile import list_profile_names, load_profile
from sparkforge.report import Report

CI_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"


def _write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_profiles_load_and_give_exact_serve_args() -> None:
    assert {"qwen35-35b-a3b-fp8", "qwen35-122b-a10b-fp8-tp2"} <= set(list_profile_names())
    tp2 = load_profile("qwen35-122b-a10b-fp8-tp2")
    assert tp2.model.nodes == 2 and tp2.model.model == "Qwen/Qwen3.5-122B-A10B-FP8"
    assert tp2.serve_args() == [
        "--tensor-parallel-size", "2",
        "--gpu-memory-utilization", "0.8",
        "--max-model-len", "262144",
        "--max-num-batched-tokens", "8192",
        "--enable-prefix-caching",
        "--reasoning-parser", "qwen3",
        "--enable-auto-tool-choice",
        "--tool-call-parser", "qwen3_coder",
    ]  # fmt: skip
    one = load_profile("qwen35-35b-a3b-fp8")
    assert one.model.nodes == 1 and one.model.env["VLLM_MARLIN_USE_ATOMIC_ADD"] == "1"


def test_false_becomes_no_flag_and_lists_repeat(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "description: d\nmodel: m\nargs:\n  enable-prefix-caching: false\n  cudagraph-capture-sizes: [1, 2]\n",
    )
    assert load_profile(path).serve_args() == [
        "--no-enable-prefix-caching",
        "--cudagraph-capture-sizes",
        "1",
        "2",
    ]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "description: d\nmodel: m\nmodle: x\n",
            ":3: modle: unknown key; fix: remove it or use one of: allow, architecture, args, check,",
        ),
        ("description: d\nmodel: m\nargs:\n  port: 9000\n", ":3: args: 'port' is set by --port"),
        ("description: d\nmodel: m\nargs:\n  --max-model-len: 9\n", "write the flag without dashes"),
        ("description: d\nmodel: m\nenv:\n  HF_TOKEN: hf_x\n", "HF_TOKEN would land in 'docker inspect'"),
        (
            "description: d\nmodel: m\nnodes: 2\n",
            "tensor-parallel-size 1 x pipeline-parallel-size 1 = 1 GPUs, but nodes 2",
        ),
        ("description: d\nmodel: m\nmodel: n\n", ":3: key 'model' appears twice"),
        ("description: d\nmodel: m\nargs: [1\n", "invalid YAML"),
        ("description: d\nmodel: m\nnodes: two\n", ":3: nodes: Input should be a valid integer"),
    ],
)
def test_invalid_profiles_name_file_line_and_fix(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(path) in str(info.value) and needle in str(info.value), str(info.value)


def test_missing_profile_lists_known_ones() -> None:
    with pytest.raises(ProfileError, match="qwen35-35b-a3b-fp8"):
        load_profile("no-such-profile")


@pytest.fixture(scope="module")
def surface():
    """The serve surface of the CI recipe's pinned vLLM 0.33.0 (x86_64 wheel from PyPI, members only)."""
    return recipe_surface(load_recipe(str(CI_RECIPE)), make_fetcher())


def test_surface_of_the_real_vllm(surface) -> None:
    for flag in (
        "tensor-parallel-size",
        "nnodes",
        "node-rank",
        "master-addr",
        "headless",
        "port",
        "tool-call-parser",
    ):
        assert flag in surface.flags, flag
    assert {"qwen3"} <= surface.parsers["reasoning"] and {"qwen3_coder", "qwen3_xml"} <= surface.parsers[
        "tool"
    ]
    assert "enable-prefix-caching" in surface.negatable
    assert (
        unknown_flags(["no-enable-prefix-caching", "compilation-config.mode", "max_model_len"], surface) == []
    )
    assert unknown_flags(["max-modle-len", "no-port"], surface) == ["max-modle-len", "no-port"]


def test_shipped_profiles_pass_the_serve_flag_preflight(surface) -> None:
    report = Report("preflight", "x")
    profiles = [load_profile(n) for n in list_profile_names()]
    check_serve_profiles(report, load_recipe(str(CI_RECIPE)), profiles, lambda: surface)
    assert report.status == "passed", report.to_dict()
    assert {c.name for c in report.checks} == {f"serve-flags:{p.name}" for p in profiles}


def test_unknown_flag_and_parser_fail_with_file_line(surface, tmp_path: Path) -> None:
    typo = _write(tmp_path, "description: d\nmodel: m\nargs:\n  max-modle-len: 4096\n")
    with pytest.raises(ProfileError) as info:  # the allow-list refuses it at load, before preflight
        load_profile(typo)
    assert f"{typo}:4: args.max-modle-len: --max-modle-len: needs attention: not a `vllm serve` flag" in str(
        info.value
    )
    assert "did you mean --max-model-len" in str(info.value)
    path = _write(
        tmp_path,
        "description: d\nmodel: m\nargs:\n  max-model-len: 4096\n  reasoning-parser: qwen9\n  tool-call-parser: qwen3_coder\n",
    )
    report = Report("preflight", "x")
    check_serve_profiles(report, load_recipe(str(CI_RECIPE)), [load_profile(path)], lambda: surface)
    reason = report.checks[0].reason
    assert report.status == "failed"
    assert f"{path}:5: args.reasoning-parser: reasoning parser 'qwen9' is not registered" in reason
    assert "qwen3_coder" not in reason.split("reasoning parser")[0]  # the valid tool parser is not flagged


def test_serve_dry_fails_in_seconds_on_an_unknown_flag(tmp_path: Path) -> None:
    path = _write(tmp_path, "description: d\nmodel: m\nargs:\n  max-modle-len: 4096\n")
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "serve",
            "--recipe",
            str(CI_RECIPE),
            "--profile",
            str(path),
            "--dry",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert "--max-modle-len: needs attention: not a `vllm serve` flag" in out
    assert time.monotonic() - start < 60  # seconds, not a launch


def test_the_twins_vllm_0_32_reads_its_frontend_flags_where_0_32_keeps_them() -> None:
    """vLLM 0.32 moved the OpenAI server's FrontendArgs to vllm/entrypoints/launchers/cli_args.py: without it
    --enable-auto-tool-choice and --default-chat-template-kwargs were refused although vLLM serves with them."""
    twin = load_recipe(str(REPO_ROOT / "tests" / "recipes" / "ci-cpu-twin.yaml"))
    found = recipe_surface(twin, make_fetcher())
    assert "vllm/entrypoints/launchers/cli_args.py" in found.sources
    assert {"enable-auto-tool-choice", "default-chat-template-kwargs", "tool-call-parser"} <= found.flags
    report = Report("preflight", "ci-cpu-twin")
    profile = load_profile(REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe-conform.yaml")
    check_serve_profiles(report, twin, [profile], lambda: found)
    assert [c.status for c in report.checks] == ["passed"], [c.reason for c in report.checks]


TEST_PROFILES = sorted((REPO_ROOT / "tests" / "profiles").glob("cpu-tiny-qwen35moe*.yaml"))
SERVED_WHOLE = {"cpu-tiny-qwen35moe", "cpu-tiny-qwen35moe-bench", "cpu-tiny-qwen35moe-pp2"}


@pytest.mark.parametrize("path", TEST_PROFILES, ids=lambda p: p.stem)
def test_every_served_test_profile_checks_the_trained_models_right_answer(path: Path) -> None:
    """The served test vehicles (serve, bench, cluster, conform) ask the trained model a progression: their
    `check.expect`, loaded through the profile schema, takes the right continuation and refuses it with any
    judged number wrong, and the random model's kind of answer (words); serve's, bench's and the cluster's judge
    all the tokens asked (one missing or one more fails too), conform's a leading part (its rows judge the rest)."""
    from sparkforge.recipe.profile import expect_pattern
    from sparkforge.run.conform.garble import progression_answer

    check = load_profile(path).model.check
    assert check is not None and not check.ignore_eos, path.name  # the model's own length, no forced decode
    right = progression_answer(check.prompt, check.max_tokens, 100)
    expect = expect_pattern(check.expect)
    assert expect.search(" ".join(right)) is not None, (path.name, check.expect)

    def off_by_one(i: int) -> str:
        return " ".join([*right[:i], str((int(right[i]) + 1) % 100), *right[i + 1 :]])

    judged = [i for i in range(len(right)) if expect.search(off_by_one(i)) is None]
    assert judged == list(range(len(judged))) and len(judged) >= 4, (path.name, judged)
    for answer in (["w12", "w40", "count", "the", *right[4:]], ["the", "answer", "is", *right], []):
        assert expect.search(" ".join(answer)) is None, (path.name, answer)
    if path.stem in SERVED_WHOLE:
        assert len(judged) == check.max_tokens, path.name
        assert (
            expect.search(" ".join(right[:-1])) is None
            and expect.search(" ".join([*right, right[-1]])) is None
        )

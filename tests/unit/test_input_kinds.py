"""One regression test per kind of hostile input issue 59 lists, through the command line as a user types it
(in this process under the fuzzer's isolation: the engine and proxies closed, every connect, program start
and write outside the temporary folder refused and recorded). The file-value kinds (checkpoint config,
speculative config, golden files, /metrics) are in test_typed_readers.py; the registry client and the TUF cache
in test_registry_boundary.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from option_fuzz import ROOT, alone, isolated, run_cli

import tasks
from sparkforge.errors import RunError

PROFILE = "qwen35-35b-a3b-fp8"
SERVE = ["--recipe=vllm-qwen35", f"--profile={PROFILE}"]


def _refused(tmp_path: Path, argv: list[str], needle: str) -> str:
    with isolated(tmp_path) as guard:
        outcome = run_cli(alone(tasks.ns, argv[0]), argv, guard)
    assert outcome.code != 0 and not outcome.traceback and outcome.contacts == [], outcome
    assert needle in outcome.output and "fix:" in outcome.output, outcome.output
    assert outcome.seconds < 5
    return outcome.output


# Options not parsed by the boundary: float options through float(), shlex, --set, --package, seeds.
@pytest.mark.parametrize("value", ["٣", "1_0", "²", "nan", "inf", "1e400"])
def test_float_options_take_ascii_numbers_only(tmp_path: Path, value: str) -> None:
    _refused(tmp_path, ["memory", *SERVE, f"--mem-available={value}"], f"--mem-available {value!r}")
    _refused(tmp_path, ["serve.serve", *SERVE, f"--watchdog-floor={value}"], f"--watchdog-floor {value!r}")


def test_extra_with_an_unbalanced_quote_is_refused_not_a_shlex_traceback(tmp_path: Path) -> None:
    source = str(ROOT / "profiles" / f"{PROFILE}.yaml")
    _refused(tmp_path, ["import", f"--source={source}", "--extra=--max-model-len '4096"], "--extra")


def test_set_with_an_empty_key_is_refused_not_ignored(tmp_path: Path) -> None:
    source = str(ROOT / "profiles" / f"{PROFILE}.yaml")
    _refused(tmp_path, ["import", f"--source={source}", "--set==4096"], "--set '=4096'")


@pytest.mark.parametrize("name", ["vllm; rm -rf /", "-e git+https://x", "../vllm", "vllm==0.1"])
def test_lock_update_package_names_are_checked(tmp_path: Path, name: str) -> None:
    _refused(tmp_path, ["lock.update", f"--package={name}"], "--package")


def test_conform_seeds_are_bounded() -> None:
    from pydantic import ValidationError

    from sparkforge.recipe.conformspec import ConformSettings

    for seed in (-1, 2**31, 10**30):
        with pytest.raises(ValidationError):
            ConformSettings.model_validate({"seed": seed})
    assert ConformSettings.model_validate({"seed": 7}).seed == 7


# Checked after the engine, before: now refused as the command line is parsed.
def test_doctor_quick_with_gpus_is_refused_before_any_node(tmp_path: Path) -> None:
    _refused(tmp_path, ["cluster.doctor", "--nodes=local", "--recipe=vllm-qwen35", "--quick", "--gpus=all"],
             "--quick and --gpus exclude each other")  # fmt: skip


def test_a_model_dir_with_a_mount_spec_is_refused(tmp_path: Path) -> None:
    _refused(
        tmp_path, ["serve.serve", *SERVE, "--model-dir=/models:/etc:rw"], "--model-dir '/models:/etc:rw'"
    )


def test_a_relative_token_file_is_refused(tmp_path: Path) -> None:
    _refused(tmp_path, ["serve.serve", *SERVE, "--hf-token-file=token.txt"], "--hf-token-file 'token.txt'")


@pytest.mark.parametrize("where", ["/etc/sparkforge-bench", "fifo", "link"])
def test_a_bench_store_in_etc_a_fifo_or_a_link_is_refused(tmp_path: Path, where: str) -> None:
    if where == "fifo":
        os.mkfifo(tmp_path / "store")
        where = str(tmp_path / "store")
    elif where == "link":
        (tmp_path / "store").symlink_to("/etc")
        where = str(tmp_path / "store")
    _refused(tmp_path, ["bench.bench", *SERVE, f"--store={where}"], "--store")


# Exempt modules: conform's API row parsed a profile field with plain json.loads and crashed.
def test_the_api_row_reports_a_malformed_image_limit_as_its_failure() -> None:
    from sparkforge.run.conform.apisurface import _image

    failures: list[str] = []
    said = _image(None, None, None, {"limit-mm-per-prompt": '{"image": '}, failures, {})  # type: ignore[arg-type]
    assert said == "limit-mm-per-prompt not JSON" and "not JSON" in failures[0]


# Raw terminal escapes: an option value or a config value that would reach the terminal is refused.
def test_terminal_escapes_are_refused_in_options_and_in_config_values(tmp_path: Path) -> None:
    out = _refused(tmp_path, ["show", "--recipe=\x1b]0;pwned\x07vllm-qwen35"], "--recipe")
    assert "\x1b" not in out  # the refusal itself shows the value escaped
    import json

    from sparkforge.run.memory.checkpoint import parse_architecture

    config = json.loads((ROOT / "profiles/checkpoints/Qwen/Qwen3.5-35B-A3B-FP8/unpinned.json").read_text())
    config["architectures"] = ["\x1b[2J\x1b[31mQwen3_5MoeForConditionalGeneration"]
    with pytest.raises(RunError) as info:
        parse_architecture(config, "config.json")
    assert "key 'architectures.0'" in str(info.value) and "\x1b" not in str(info.value)

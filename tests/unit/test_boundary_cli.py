"""One case per kind and surface of the second boundary round, through the real tasks: each refused in under 2 s
(timed in-process: the task function, as Invoke calls it), in one paragraph naming the input and the fix, before
any engine (DOCKER_HOST is an unroutable TEST-NET address: a contact would hang or fail in the engine's words),
and nothing written where it was refused. The invoke-level number parse is run as a real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit

from sparkforge.boundary import PROJECT_ROOT
from sparkforge.cli import bench as bench_cli
from sparkforge.cli import conform as conform_cli
from sparkforge.cli import diff as diff_cli
from sparkforge.cli import rebuild as rebuild_cli
from sparkforge.cli import sign as sign_cli

RESULT = PROJECT_ROOT / "benchmarks" / "results" / "real" / "bench-cpu-twin-default.json"
TWIN = str(PROJECT_ROOT / "recipes" / "vllm-qwen35.yaml")
TINY = str(PROJECT_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe-conform.yaml")
OFFLINE = {"DOCKER_HOST": "tcp://192.0.2.1:9"}


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)


# The bound is a hang guard for a loaded 2-core CI machine (pytest -n 2); the measured refusal times (well
# under 2 s quiet) are in benchmarks/boundary.md.
def _refused(task: Callable[..., object], *needles: str, **options: object) -> str:
    start = time.monotonic()
    with pytest.raises(Exit) as caught:
        task(Context(), **options)
    seconds = time.monotonic() - start
    message = str(caught.value.message)
    assert seconds < 10.0, (seconds, message)
    assert caught.value.code != 0 and "fix:" in message and "\n" not in message.strip(), message
    assert all(n in message for n in needles), message
    return message


def test_bench_numbers_are_ascii_digits_with_an_upper_bound() -> None:
    common = {"recipe": TWIN, "profile": TINY}
    _refused(bench_cli.bench, "--concurrency '1_0'", **common, concurrency="1_0,٣")
    _refused(bench_cli.bench, "--concurrency", "4096", **common, concurrency="1,100000")
    _refused(bench_cli.bench, "--repeats '²'", **common, repeats="²")
    _refused(bench_cli.bench, "--concurrency", "empty entry", **common, concurrency="1,,2")


def test_bench_readers_refuse_links_to_system_files_and_a_result_twice(tmp_path: Path) -> None:
    link = tmp_path / "r.json"
    link.symlink_to("/etc/passwd")
    _refused(bench_cli.bench_compare, "a link to /etc/passwd", old=str(link), new=str(RESULT))
    _refused(bench_cli.bench_compare, "are one file", old=f"{RESULT},{RESULT}", new=str(RESULT))
    _refused(
        bench_cli.bench_compare,
        "--threshold '1_0' is not a finite percent",
        old=str(RESULT),
        new=str(RESULT),
        threshold="1_0",
    )
    _refused(diff_cli.diff, "--bench", "a link to /etc/passwd", a="vllm-qwen35", b="vllm-qwen35",
             bench=[str(link), str(link)])  # fmt: skip


def test_bench_report_outputs_never_follow_a_planted_link_or_open_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "out.html"
    os.mkfifo(fifo)
    _refused(
        bench_cli.bench_report, "--html", "a folder, device or pipe", results=str(RESULT), html=str(fifo)
    )
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = PROJECT_ROOT / "build" / f"png-link-{os.getpid()}"
    planted.parent.mkdir(exist_ok=True)
    planted.symlink_to(outside)
    try:
        _refused(bench_cli.bench_report, "--png", "symlink", results=str(RESULT), png=str(planted))
    finally:
        planted.unlink()
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("golden", "needle"),
    [("fifo", "not a regular file"), ("/dev/zero", "not a regular file"), ("nan", "as JSON"),
     ("dup", "appears twice"), ("big", "more than this input may hold")],
)  # fmt: skip
def test_conform_golden_files_are_checked_before_any_engine(tmp_path: Path, golden: str, needle: str) -> None:
    path = tmp_path / "golden.json"
    if golden == "fifo":
        os.mkfifo(path)
    elif golden == "/dev/zero":
        path = Path("/dev/zero")
    elif golden == "nan":
        path.write_text('{"format": "sparkforge-golden/1", "token_ids": [[NaN]]}')
    elif golden == "dup":
        path.write_text('{"format": "x", "format": "sparkforge-golden/1", "token_ids": []}')
    else:
        path.write_text(" " * (9 << 20))
    _refused(conform_cli.conform, "--golden", needle, "nothing was started or stopped", recipe=TWIN, profile=TINY,
             attach="http://127.0.0.1:9", golden=str(path), checks="golden")  # fmt: skip


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:99999", "http://[::zz]:8000", "http://127.0.0.1:8000/\r\nX: y"]
)
def test_conform_attach_urls_by_the_fetchers_rules(url: str) -> None:
    _refused(
        conform_cli.conform,
        "--attach",
        "nothing was started or stopped",
        recipe=TWIN,
        profile=TINY,
        attach=url,
    )


def test_diff_checks_both_sides_before_the_engine(tmp_path: Path) -> None:
    _refused(diff_cli.diff, "'vllm-qwen35-wheel'", "did you mean the recipe 'vllm-qwen35-wheels'", a="vllm-qwen35",
             b="vllm-qwen35-wheel")  # fmt: skip
    link = tmp_path / "evil.yaml"
    link.symlink_to("/etc/passwd")
    _refused(diff_cli.diff, "a link to /etc/passwd", a="nginx:1.27", b=str(link))


def test_history_refuses_an_immutable_tag_before_the_registry() -> None:
    _refused(
        diff_cli.history, "not one of vllm-qwen35's moving tags", recipe="vllm-qwen35", tag="0.31.0-20260101"
    )


def test_kernels_image_fifo_and_device_and_a_long_serve_log_line(tmp_path: Path) -> None:
    fifo = tmp_path / "wheel.whl"
    os.mkfifo(fifo)
    _refused(diff_cli.kernels, "--image", "pipe", recipe="vllm-qwen35", image=str(fifo))
    _refused(diff_cli.kernels, "--image /dev/zero", recipe="vllm-qwen35", image="/dev/zero")
    from sparkforge.verify.started import started_backends

    start = time.monotonic()
    # 2 MB where every 'Using' starts a lazy repeat to the line's end: Python's re needs hours for it
    found = started_backends(
        "Using a " * 250_000 + "\nUsing 'Triton' Fp8 MoE backend out of potential backends"
    )
    assert time.monotonic() - start < 10.0
    assert found["moe.fp8_block"]["selected"] == "Triton"


def test_rebuild_network_ca_bundle_and_recipe(tmp_path: Path) -> None:
    _refused(rebuild_cli.rebuild, "--network 'host --privileged'", check="x:y", network="host --privileged")
    _refused(rebuild_cli.rebuild, "--ca-bundle /dev/zero", check="x:y", ca_bundle="/dev/zero")
    key = tmp_path / "ca.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    _refused(rebuild_cli.rebuild, "holds no PEM certificate", check="x:y", ca_bundle=str(key))
    _refused(rebuild_cli.rebuild, "recipe 'nope' not found", check="x:y", recipe="nope")


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [("image_id", "x" * 5000, "'image_id'"), ("gpu", "GB10\x1b[2J", "'gpu'"), ("suite", ["a"], "'suite'")],
)
def test_sign_attest_refuses_hostile_report_fields(
    tmp_path: Path, field: str, value: object, needle: str
) -> None:
    report = {"command": "verify", "recipe": "vllm-qwen35", "status": "passed", "checks": [], field: value}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    image = "ghcr.io/x/y@sha256:" + "a" * 64
    _refused(sign_cli.attest, needle, recipe="vllm-qwen35", image=image, report=str(path))


def test_whole_number_options_refuse_non_ascii_digits_on_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "invoke", "cluster.logs", "--tail", "1_0", "--nodes", "unix:///nonexistent"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, **OFFLINE},
    )  # fmt: skip
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--tail '1_0' is not a whole number" in result.stderr and "fix:" in result.stderr


def test_conform_record_target_is_checked_before_any_start(tmp_path: Path) -> None:
    fifo = tmp_path / "golden.json"
    os.mkfifo(fifo)
    for target, needle in (
        (str(fifo), "a folder, device or pipe"),
        ("/etc/sparkforge-golden.json", "system folder"),
    ):
        _refused(conform_cli.conform, "--golden", needle, recipe=TWIN, profile=TINY, attach="http://127.0.0.1:9",
                 record=True, golden=target)  # fmt: skip
    assert not Path("/etc/sparkforge-golden.json").exists()

"""Hostile input to the other tasks, through the command line: `sign --published` JSON is type-checked before
cosign runs, `pull --platform/--tag` and `publish --digest` are checked before the engine, and an audit of a tree
without CUDA binaries says that nothing was audited instead of PASSED."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit

from sparkforge.audit.scan import audit_target
from sparkforge.cli import publish, sign
from sparkforge.errors import PublishError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.registry.signinputs import parse_published

GOOD = "sha256:" + "a" * 64
UNREACHABLE = {
    "DOCKER_HOST": "tcp://192.0.2.1:9"
}  # TEST-NET: an engine contact would fail differently or hang


def _task(fn: Callable[..., object], **options: object) -> str:
    """Call an Invoke task in this process as the command line would: a refusal is an Exit with one paragraph."""
    with pytest.raises(Exit) as info:
        fn(Context(), **options)
    assert info.value.code != 0
    return str(info.value.message)


def _invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **UNREACHABLE, **(env or {})},
        check=False,
    )
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ([], "a JSON object is expected"),
        ({"index": 5, "platforms": {}}, "'index' must be sha256:"),
        ({"index": "sha256:" + "A" * 64, "platforms": {"linux/arm64": GOOD}}, "'index' must be sha256:"),
        ({"index": "sha256:" + "a" * 63, "platforms": {"linux/arm64": GOOD}}, "'index' must be sha256:"),
        ({"index": GOOD + " --key x", "platforms": {"linux/arm64": GOOD}}, "'index' must be sha256:"),
        ({"index": GOOD, "platforms": ["linux/arm64"]}, "'platforms' must map"),
        ({"index": GOOD, "platforms": {}}, "'platforms' must map"),
        ({"index": GOOD, "platforms": {"linux/evil": GOOD}}, "is not one of"),
        ({"index": GOOD, "platforms": {"linux/arm64": "latest"}}, "platforms.linux/arm64: must be"),
        ({"index": GOOD, "platforms": {"linux/arm64": {"x": 1}}}, "platforms.linux/arm64: must be"),
        ({"index": GOOD, "platforms": {"linux/arm64": None}}, "platforms.linux/arm64: must be"),
    ],
)
def test_published_json_is_type_checked(data: object, needle: str) -> None:
    with pytest.raises(PublishError) as info:
        parse_published(data, "published.json")
    assert needle in str(info.value) and "fix:" in str(info.value)


def test_published_json_that_is_right_passes() -> None:
    assert parse_published({"index": GOOD, "platforms": {"linux/arm64": GOOD}}, "p") == (
        GOOD,
        {"linux/arm64": GOOD},
    )


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[1, 2]", "JSON object"),
        ("{not json", "cannot read"),
        ("[" * 100000 + "]" * 100000, "cannot read"),
        ('{"index": NaN, "platforms": {}}', "NaN is not a number JSON allows"),
        (json.dumps({"index": GOOD, "platforms": {"linux/arm64": "sha256:../../x"}}), "must be sha256:"),
    ],
    ids=["list", "broken", "deep", "nan", "traversal"],
)
def test_sign_refuses_hostile_published_files_before_cosign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, needle: str
) -> None:
    path = tmp_path / "published.json"
    path.write_text(content)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cosign (nor docker) to reach: a refusal must come first
    message = _task(sign.images, recipe="vllm-qwen35", published=str(path))
    assert needle in message and "fix:" in message, message


@pytest.mark.parametrize("special", ["/dev/zero", "/tmp"])
def test_sign_does_not_read_devices_or_folders(special: str) -> None:
    assert "not a regular file" in _task(sign.images, recipe="vllm-qwen35", published=special)


def test_sign_through_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "published.json"
    path.write_text(json.dumps({"index": GOOD, "platforms": {"linux/evil": GOOD}}))
    result = _invoke(
        "sign", "--recipe", "vllm-qwen35", "--published", str(path), env={"PATH": "/usr/bin:/bin"}
    )
    assert result.returncode != 0 and "is not one of" in result.stderr and "fix:" in result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--platform", "linux/evil"], "--platform 'linux/evil' is not a platform"),
        (["--platform", "linux/arm64 --help"], "is not a platform"),
        (["--tag", "latest;id"], "--tag 'latest;id' is neither a tag"),
        (["--tag", "sha256:xyz"], "is neither a tag"),
        (["--tag", "a" * 129], "is neither a tag"),
    ],
)
def test_pull_checks_its_options_before_the_engine(
    monkeypatch: pytest.MonkeyPatch, args: list[str], needle: str
) -> None:
    monkeypatch.setenv("DOCKER_HOST", UNREACHABLE["DOCKER_HOST"])
    options = {"platform": args[1]} if args[0] == "--platform" else {"tag": args[1]}
    message = _task(publish.pull, recipe="vllm-qwen35", **options)
    assert needle in message and "fix:" in message, message


def test_pull_through_the_command_line() -> None:
    result = _invoke("pull", "--recipe", "vllm-qwen35", "--platform", "linux/evil")
    assert result.returncode != 0 and "is not a platform" in result.stderr and "fix:" in result.stderr


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("linux/evil=" + GOOD, "is not a platform"),
        ("linux/arm64=latest", "--digest"),
        ("linux/arm64", "--digest"),
    ],
)
def test_publish_digest_is_checked(tmp_path: Path, item: str, needle: str) -> None:
    message = _task(publish.publish, recipe="vllm-qwen35", digests=str(tmp_path), digest=[item], dry=True)
    assert needle in message, message


def test_audit_of_a_tree_without_cuda_binaries_is_not_passed(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "notes.txt").write_text("no device code here\n")
    (tmp_path / "lib" / "tool.py").write_text("print('hi')\n")
    report = tmp_path / "audit.json"
    result = _invoke("audit", str(tmp_path), "--json", str(report))
    assert result.returncode != 0
    assert "nothing was audited" in result.stderr and "fix:" in result.stderr, result.stderr
    assert "PASSED" not in result.stdout
    assert json.loads(report.read_text())["status"] == "failed"


def test_audit_of_an_empty_folder_is_not_passed(tmp_path: Path) -> None:
    report = audit_target(tmp_path)
    assert report.status == "failed" and "nothing was audited" in report.failed[0].reason


@pytest.mark.parametrize(
    "ref", ["Evil:Tag", "repo:--x", "repo:a b", "repo@sha256:short", "repo:" + "t" * 129]
)
def test_build_tag_is_an_image_reference_checked_before_the_build(ref: str) -> None:
    from sparkforge.cli import build

    message = _task(build.build, recipe="vllm-qwen35", tag=[ref], dry=True)
    assert "--tag" in message and "is not an image reference" in message and "fix:" in message, message


@pytest.mark.parametrize(
    ("report", "needle"),
    [
        (
            {"command": "verify", "recipe": "vllm-qwen35", "status": "passed", "checks": "all"},
            "'checks' must be a list",
        ),
        (
            {"command": "verify", "recipe": "vllm-qwen35", "status": "passed", "checks": ["x"]},
            "checks[0] must be",
        ),
        ({"command": "verify", "recipe": "vllm-qwen35", "status": "great", "checks": []}, "passed or failed"),
        (
            {"command": "verify", "recipe": "vllm-qwen35", "status": "passed", "checks": [], "gpus": []},
            "'gpus'",
        ),
        ({"command": 1, "recipe": "vllm-qwen35", "status": "passed", "checks": []}, "'command' must be"),
    ],
    ids=["checks-str", "check-str", "status", "gpus-list", "command-int"],
)
def test_attest_type_checks_the_report_before_cosign(tmp_path: Path, report: dict, needle: str) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    message = _task(sign.attest, recipe="vllm-qwen35", image="x@" + GOOD, report=str(path))
    assert needle in message and "fix:" in message, message

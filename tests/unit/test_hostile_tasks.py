"""Hostile input to the other tasks, through the command line: `sign --published` JSON is type-checked before
cosign runs, `pull --platform/--tag` and `publish --digest` are checked before the engine, and an audit of a tree
without CUDA binaries says that nothing was audited instead of PASSED."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge.errors import PublishError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.registry.cosign import parse_published

GOOD = "sha256:" + "a" * 64
UNREACHABLE = {
    "DOCKER_HOST": "tcp://192.0.2.1:9"
}  # TEST-NET: an engine contact would fail differently or hang


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
        ('{"index": NaN, "platforms": {}}', "'index' must be sha256:"),
        (json.dumps({"index": GOOD, "platforms": {"linux/arm64": "sha256:../../x"}}), "must be sha256:"),
    ],
    ids=["list", "broken", "deep", "nan", "traversal"],
)
def test_sign_refuses_hostile_published_files_before_cosign(
    tmp_path: Path, content: str, needle: str
) -> None:
    path = tmp_path / "published.json"
    path.write_text(content)
    # No cosign on PATH: reaching it would be a different error.
    result = _invoke(
        "sign", "--recipe", "vllm-qwen35", "--published", str(path), env={"PATH": "/usr/bin:/bin"}
    )
    assert result.returncode != 0
    assert needle in result.stderr and "fix:" in result.stderr, result.stderr


@pytest.mark.parametrize("special", ["/dev/zero", "/tmp"])
def test_sign_does_not_read_devices_or_folders(special: str) -> None:
    result = _invoke("sign", "--recipe", "vllm-qwen35", "--published", special)
    assert result.returncode != 0 and "not a regular file" in result.stderr


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
def test_pull_checks_its_options_before_the_engine(args: list[str], needle: str) -> None:
    result = _invoke("pull", "--recipe", "vllm-qwen35", *args)
    assert result.returncode != 0
    assert needle in result.stderr and "fix:" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("linux/evil=" + GOOD, "is not a platform"),
        ("linux/arm64=latest", "--digest"),
        ("linux/arm64", "--digest"),
    ],
)
def test_publish_digest_is_checked(tmp_path: Path, item: str, needle: str) -> None:
    result = _invoke(
        "publish", "--recipe", "vllm-qwen35", "--digests", str(tmp_path), "--digest", item, "--dry"
    )
    assert result.returncode != 0
    assert needle in result.stderr, result.stderr


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
    result = _invoke("audit", str(tmp_path))
    assert result.returncode != 0 and "nothing was audited" in result.stderr

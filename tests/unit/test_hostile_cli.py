"""Each class of hostile input through the tasks' real command line (one or two runs per class): refused in one
paragraph with a fix, before any engine (DOCKER_HOST is an unroutable address, cosign is not on PATH), without
reading or writing outside what the test names, and the exit status follows the report."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from test_audit_hostile import container, entry, fatbin_elf

from sparkforge.boundary import PROJECT_ROOT

GOOD = "sha256:" + "a" * 64
# TEST-NET: an engine contact would hang or fail with the engine's words, never with the boundary's.
OFFLINE = {"DOCKER_HOST": "tcp://192.0.2.1:9", "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"}
CLI_SECONDS = 20  # generous: python + invoke start in ~0.5 s idle, ~3 s on a loaded 2-core machine; refusals are timed in-process


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **OFFLINE},
        check=False,
    )
    assert time.monotonic() - start < CLI_SECONDS
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


def _refused(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "fix:" in message and all(n in message for n in needles), message
    return message


@pytest.fixture
def library_tree(tmp_path: Path) -> Path:
    """A tree with one library whose kernels are sm_121 cubins, and its name is as hostile as a name gets."""
    tree = tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "_C.abi3.so").write_bytes(fatbin_elf(container(entry(arch=121))))
    (tree / "lib\n_moe_C.so  native  PASSED\x1b[2J.so").write_bytes(fatbin_elf(container(entry(arch=90))))
    return tree


def test_files_fifo_and_device_are_refused_at_once(tmp_path: Path, library_tree: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)  # nobody writes: a plain open() hangs until the 60 s timeout fails the test
    result = _invoke(
        "kernels", "--recipe", "vllm-qwen35", "--image", str(library_tree), "--verify-report", str(fifo)
    )
    _refused(result, "--verify-report", "a device, pipe or socket, not a regular file")
    result = _invoke("diff", "vllm-qwen35", "vllm-qwen35", "--bench", "/dev/zero", "--bench", "/dev/zero")
    _refused(result, "--bench /dev/zero")


def test_outputs_never_go_through_a_symlink_out_of_the_project(tmp_path: Path, library_tree: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    link = PROJECT_ROOT / "build" / f"hostile-cli-{os.getpid()}"
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(outside)
    victim = tmp_path / "victim.json"
    victim.write_text("keep")
    planted = PROJECT_ROOT / "build" / f"hostile-cli-{os.getpid()}.json"
    planted.symlink_to(victim)
    try:
        result = _invoke("audit", str(library_tree), "--json", str(link / "report.json"))
        _refused(result, "leads out of the project")
        assert list(outside.iterdir()) == []
        result = _invoke("audit", str(library_tree / "vllm"), "--json", str(planted))
        assert result.returncode == 0, result.stderr
        assert (
            victim.read_text() == "keep"
            and not planted.is_symlink()
            and '"status": "passed"' in planted.read_text()
        )
    finally:
        link.unlink()
        planted.unlink()


def test_references_tags_and_digests_are_checked_before_the_engine(tmp_path: Path) -> None:
    _refused(_invoke("rebuild", "--check", "Bad Ref;rm -rf /"), "--check", "not an image reference")
    report = tmp_path / "verify.json"
    report.write_text('{"command": "verify", "recipe": "vllm-qwen35", "status": "passed", "checks": []}')
    result = _invoke(
        "sign.attest", "--recipe", "vllm-qwen35", "--image", "ghcr.io/o/r:latest", "--report", str(report)
    )
    _refused(result, "--image", "NAME@sha256")


def test_exclusive_flags_are_refused_never_ignored() -> None:
    result = _invoke("publish", "--recipe", "vllm-qwen35", "--rollback", "latest", "--promote", GOOD)
    _refused(result, "--rollback and --promote exclude each other")
    _refused(_invoke("lock", "--recipe", "vllm-qwen35", "--strict"), "--strict applies to --check only")


def test_numbers_are_finite_and_in_range() -> None:
    _refused(_invoke("size", "--image", "vllm-twin:latest", "--top", "0"), "--top")


def test_archive_member_names_are_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("../../evil/_C.so", fatbin_elf(container(entry(arch=121))))
    _refused(_invoke("audit", str(wheel)), "holds '..'")


def test_untrusted_names_are_escaped_in_tables(library_tree: Path) -> None:
    result = _invoke("audit", str(library_tree))
    assert result.returncode == 0, result.stderr  # nothing required: the table is printed, the audit passes
    assert "\x1b" not in result.stdout and "\\x1b[2J" in result.stdout
    forged = [line for line in result.stdout.splitlines() if line.startswith("_moe_C.so")]
    assert forged == [] and "lib\\x0a_moe_C.so" in result.stdout


def test_a_pathological_profile_regex_is_refused_at_load(tmp_path: Path) -> None:
    text = (PROJECT_ROOT / "profiles" / "qwen35-35b-a3b-fp8.yaml").read_text()
    profile = tmp_path / "p.yaml"
    profile.write_text(text.replace('expect: "\\\\b391\\\\b"', 'expect: "(a+)+\\\\1$"'))
    assert "\\\\1" in profile.read_text()
    result = _invoke("serve", "--recipe", "vllm-qwen35", "--profile", str(profile), "--dry", "--no-preflight")
    _refused(result, "check.expect", "linear time")


def test_exit_status_follows_the_report(tmp_path: Path) -> None:
    tree = tmp_path / "image"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "_C.abi3.so").write_bytes(fatbin_elf(container(entry(arch=90))))  # no sm_121 kernel
    result = _invoke(
        "kernels", "--recipe", "vllm-qwen35", "--image", str(tree), "--json", str(tmp_path / "k.json")
    )
    _refused_report = result.returncode != 0 and "kernels failed" in result.stderr
    assert _refused_report, result.stderr
    assert '"status": "failed"' in (tmp_path / "k.json").read_text()


REFUSALS = [
    ("diff", {"a": "Bad Ref", "b": "vllm-qwen35"}, "A 'Bad Ref' is not an image reference"),
    ("history", {"recipe": "vllm-qwen35", "tag": "../latest"}, "--tag '../latest' is not a tag"),
    (
        "kernels",
        {"recipe": "vllm-qwen35", "image": "x", "verify_report": "/dev/zero"},
        "--verify-report /dev/zero",
    ),
    ("kernels", {"recipe": "vllm-qwen35", "markdown": "/etc/k.md"}, "a system folder"),
    (
        "lock",
        {"recipe": "vllm-qwen35", "check": True, "write": True},
        "--check and --write exclude each other",
    ),
    ("publish", {"recipe": "vllm-qwen35", "promote": "sha256:abc"}, "--promote 'sha256:abc' is not a digest"),
    (
        "publish",
        {"recipe": "vllm-qwen35", "rollback": "x", "digest": [f"linux/arm64={GOOD}"]},
        "exclude each other",
    ),
    ("rebuild", {"check": "-oProxyCommand=x"}, "--check '-oProxyCommand=x' is not an image reference"),
    ("sign.attest", {"recipe": "vllm-qwen35", "image": "r@sha256:x", "report": "r.json"}, "NAME@sha256"),
    ("size", {"image": "x", "top": 10**9}, "--top"),
    ("probe", {"recipe": "vllm-qwen35", "platform": "linux/riscv64"}, "--platform 'linux/riscv64'"),
    # outputs: checked before any node, engine or server is contacted, not after the work
    (
        "cluster.doctor",
        {"nodes": "local", "recipe": "vllm-qwen35", "json": "/etc/doctor.json"},
        "system folder",
    ),
    (
        "bench",
        {"recipe": "vllm-qwen35", "profile": "qwen35-35b-a3b-fp8", "json": "/etc/b.json"},
        "system folder",
    ),
    ("bench.compare", {"old": "a.json", "new": "b.json", "json": "/proc/x.json"}, "system folder"),
    ("bench.history", {"recipe": "vllm-qwen35", "json": "/sys/x.json"}, "system folder"),
]


@pytest.mark.parametrize(
    ("task", "options", "needle"), REFUSALS, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(REFUSALS)]
)
def test_every_refusal_is_fast_and_before_any_engine(
    monkeypatch: pytest.MonkeyPatch, task: str, options: dict, needle: str
) -> None:
    import docker
    from invoke import Context
    from invoke.exceptions import Exit

    import tasks

    def contact(*args: object, **kwargs: object) -> None:
        raise AssertionError("an engine, registry or program was contacted before the refusal")

    monkeypatch.setattr(subprocess, "Popen", contact)  # the command seam's only way out
    monkeypatch.setattr(docker, "from_env", contact)
    monkeypatch.setattr(docker, "DockerClient", contact)
    body = tasks.ns.task_with_config(task)[0].body
    start = time.monotonic()
    with pytest.raises(Exit) as info:
        body(Context(), **options)
    assert time.monotonic() - start < 2
    message = str(info.value.message)
    assert info.value.code != 0 and needle in message and "fix:" in message and "\n" not in message, message

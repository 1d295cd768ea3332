"""A build as a plan: plan_build decides every argv, path and tag from the recipe, the options parsed once and
what the host said (BuildHost), with no engine; --dry prints that plan and runs nothing."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.engine import Engine
from sparkforge.errors import EngineError, SparkforgeError, VerifyError
from sparkforge.imagebuild.epoch import Epoch
from sparkforge.imagebuild.pipeline import build
from sparkforge.imagebuild.stage import BuildHost, BuildOptions, parse_base_image, plan_build
from sparkforge.recipe.loader import REPO_ROOT, load_recipe

WHEELS = load_recipe("vllm-qwen35-wheels")
SOURCE = load_recipe("vllm-qwen35")
NOW = dt.datetime(2026, 12, 4, 23, 0, tzinfo=dt.UTC)
HOST = BuildHost(
    engine=Engine("docker", "buildx", "28.2.2", "docker-container"),
    epoch=Epoch(1767225600, "created time of base image x"),
    revision="c0ffee",
    gpu_runtime=True,
    ca_bundle=Path("/etc/ssl/certs/ca-certificates.crt"),
    now=NOW,
)


def _plan(recipe=WHEELS, host: BuildHost = HOST, **options):
    return plan_build(recipe, BuildOptions(log_root=Path("/logs"), **options), host)


def test_the_plan_decides_every_argv_path_and_tag() -> None:
    plan = _plan(bases=parse_base_image("mirror/base:1"))
    argv = plan.command.argv
    assert argv[:3] == ("docker", "buildx", "build") and argv[-1] == str(REPO_ROOT / "build" / WHEELS.name)
    assert plan.log_dir == Path("/logs") / WHEELS.name / "20261204T230000Z-linux-arm64"
    assert plan.bases.builder == plan.bases.runtime == "mirror/base:1"  # --base-image parsed once, applied
    for arg in (
        "SOURCE_DATE_EPOCH=1767225600",
        "SPARKFORGE_CREATED=2026-01-01T00:00:00Z",
        "SPARKFORGE_REVISION=c0ffee",
    ):
        assert arg in argv
    # The session's CA bundle is the one 'ca' secret (one holder: the session, surveyed into the host).
    assert argv[argv.index("--secret") + 1] == "id=ca,src=/etc/ssl/certs/ca-certificates.crt"
    assert plan.candidate == f"sparkforge-candidate/{WHEELS.name}:{WHEELS.hash[:12]}-arm64"
    assert argv[argv.index("--tag") + 1] == plan.candidate
    # Reproducible on a docker-container builder: a rewritten docker export, nothing to `docker load`.
    assert "type=docker,rewrite-timestamp=true" in argv and plan.load is None
    # Verified: every scheme tag; not GPU-verified: only the immutable ones, never latest.
    assert any(t.endswith(":latest") for t in plan.tags)
    assert not any(t.endswith(":latest") for t in plan.unverified_tags)
    assert set(plan.unverified_tags) < set(plan.tags) and plan.push is None and plan.probe is None


def test_the_docker_driver_builds_a_tarball_and_loads_it() -> None:
    plan = _plan(host=dataclasses.replace(HOST, engine=Engine("docker", "buildx", "26.1.5", "docker")))
    tar = plan.request.image_tar
    assert f"type=docker,dest={tar},rewrite-timestamp=true" in plan.command.argv
    assert plan.load is not None and plan.load.argv == ("docker", "load", "--input", str(tar))


def test_push_by_digest_is_the_cached_rerun_after_verify() -> None:
    plan = _plan(push_by_digest=True, metadata_file=Path("/m.json"), cache_to=("type=registry,ref=c",))
    push = plan.push_command
    assert push is not None and plan.tags == ()
    assert (
        "--no-cache" not in push.argv and "--cache-to" not in push.argv and "--cache-to" in plan.command.argv
    )
    assert f"name={WHEELS.model.publish.repository},push-by-digest=true" in " ".join(push.argv)
    assert push.argv[push.argv.index("--metadata-file") + 1] == "/m.json"
    lines = plan.lines()
    assert lines.index(plan.command.shell_line()) < lines.index(push.shell_line())
    assert any(line.startswith("# then: verify") for line in lines[lines.index(plan.command.shell_line()) :])


def test_a_source_recipe_plans_its_compile_probe_first() -> None:
    plan = _plan(SOURCE, sources={"vllm": "http://127.0.0.1:8000/v.tar.gz"})
    probe = plan.probe
    assert probe is not None and probe.options.target == "probe" and not probe.verify and probe.tags == ()
    assert probe.log_dir != plan.log_dir  # its numbered steps never overwrite the build's
    assert "VLLM_SOURCE_URL=http://127.0.0.1:8000/v.tar.gz" in probe.command.argv
    measured = plan.with_build_args({"SPARKFORGE_UNIT_PEAK_GB": "3"})
    assert "SPARKFORGE_UNIT_PEAK_GB=3" in measured.command.argv and measured.probe is None
    assert _plan(SOURCE, probe=False).probe is None and _plan(SOURCE, target="source").probe is None
    assert _plan(WHEELS).probe is None  # nothing is compiled


def test_usage_errors_are_raised_by_the_plan() -> None:
    with pytest.raises(SparkforgeError, match=r"--platform linux/amd64: recipe vllm-qwen35-wheels builds"):
        _plan(platform="linux/amd64")
    with pytest.raises(SparkforgeError, match="wheels only"):
        _plan(sources={"vllm": "http://127.0.0.1:8000/v.tar.gz"})
    latest = (f"{WHEELS.model.publish.repository}:latest",)
    with pytest.raises(VerifyError, match="a moving tag names only a GPU-verified image"):
        _plan(tags=latest, host=dataclasses.replace(HOST, gpu_runtime=False))
    explicit = _plan(tags=(*latest, "localhost:5000/x:keep"))
    assert explicit.refused == latest and explicit.unverified_tags == ("localhost:5000/x:keep",)
    with pytest.raises(EngineError, match="need docker buildx"):
        _plan(
            push_by_digest=True, host=dataclasses.replace(HOST, engine=Engine("docker", "buildkit", "20.10"))
        )


def test_the_plan_as_json_is_the_argv() -> None:
    plan = _plan()
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["build"] == list(plan.command.argv) and data["tags"] == list(plan.tags)


def test_dry_build_prints_the_plan_and_writes_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    session = Session(echo=print, out=lines.append, runner=Runner(dry=True, stream=False), ca_bundle=None)
    result = build(session, WHEELS, BuildOptions(log_root=tmp_path / "logs", preflight=False))
    assert result.command_line in lines and not (tmp_path / "logs").exists()
    assert lines[0].startswith(f"# build {WHEELS.name}") and lines[-1].startswith("# if not GPU-verified")


def test_invoke_build_dry_json(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "build", "--recipe", "vllm-qwen35-wheels", "--dry", "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(out.read_text())
    assert " ".join(plan["build"]) in done.stdout and plan["candidate"] in done.stdout

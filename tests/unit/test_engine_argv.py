"""The one code path that turns a build request into argv, for buildx and for the engine's BuildKit."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkforge.engine import Engine
from sparkforge.errors import EngineError, SparkforgeError
from sparkforge.imagebuild.buildkit import BuildRequest, build_command
from sparkforge.imagebuild.pipeline import build
from sparkforge.imagebuild.stage import BuildOptions, parse_base_image, parse_sources, secret_args
from sparkforge.recipe.loader import load_recipe

BUILDX = Engine("docker", "buildx", "28.2.2")
BUILTIN = Engine("/usr/bin/docker", "buildkit", "20.10.24")
REQUEST = BuildRequest(
    context=Path("/ctx"),
    platform="linux/arm64",
    target="runtime",
    tags=("sparkforge-candidate/r:abc-arm64",),
    build_args={"RUNTIME_IMAGE": "base:1", "BUILDER_IMAGE": "base:1"},
    secrets=("id=ca,src=/etc/ssl/certs/ca-certificates.crt",),
)


def test_buildx_argv() -> None:
    command = build_command(BUILDX, REQUEST)
    assert command.argv == (
        "docker", "buildx", "build", "--platform", "linux/arm64", "--target", "runtime", "--progress", "plain",
        "--tag", "sparkforge-candidate/r:abc-arm64", "--build-arg", "BUILDER_IMAGE=base:1",
        "--build-arg", "RUNTIME_IMAGE=base:1", "--secret", "id=ca,src=/etc/ssl/certs/ca-certificates.crt",
        "--load", "/ctx",
    )  # fmt: skip
    assert command.env == {}


def test_builtin_buildkit_argv() -> None:
    command = build_command(BUILTIN, REQUEST)
    assert command.argv[:3] == ("/usr/bin/docker", "build", "--platform")
    assert "--load" not in command.argv and command.argv[-1] == "/ctx"
    assert command.env == {"DOCKER_BUILDKIT": "1"}


def test_buildx_push_by_digest_cache_builder_and_attestations() -> None:
    request = BuildRequest(
        context=Path("/ctx"), platform="linux/amd64", target="runtime", builder="spark-cluster",
        push_by_digest="ghcr.io/o/r", metadata_file=Path("/tmp/m.json"), attestations=True,
        cache_from=("type=registry,ref=ghcr.io/o/cache:r-amd64",), cache_to=("type=registry,ref=x,mode=max",),
    )  # fmt: skip
    argv = build_command(BUILDX, request).argv
    assert argv[:5] == ("docker", "buildx", "build", "--builder", "spark-cluster")
    assert "type=image,name=ghcr.io/o/r,push-by-digest=true,name-canonical=true,push=true" in argv
    assert "--load" not in argv
    assert argv[argv.index("--metadata-file") + 1] == "/tmp/m.json"
    assert argv[argv.index("--cache-from") + 1] == "type=registry,ref=ghcr.io/o/cache:r-amd64"
    assert argv[argv.index("--provenance") : argv.index("--provenance") + 2] == ("--provenance", "mode=max")
    assert "--sbom" in argv


@pytest.mark.parametrize(
    "change",
    [{"builder": "remote"}, {"push_by_digest": "ghcr.io/o/r"}, {"cache_from": ("type=registry,ref=x",)}],
)
def test_builtin_buildkit_refuses_buildx_only_features(change: dict) -> None:
    request = BuildRequest(context=Path("/ctx"), platform="linux/amd64", target="runtime", **change)
    with pytest.raises(EngineError, match="buildx"):
        build_command(BUILTIN, request)


def test_argv_never_contains_a_shell_string() -> None:
    hostile = BuildRequest(
        context=Path("/ctx dir"), platform="linux/amd64", target="runtime", tags=("a:b",),
        build_args={"X": "$(id); rm -rf /"},
    )  # fmt: skip
    argv = build_command(BUILTIN, hostile).argv
    assert "X=$(id); rm -rf /" in argv and "/ctx dir" in argv  # one argv item each, never shell-parsed


def test_base_image_and_source_options() -> None:
    assert parse_base_image("mirror/cuda@sha256:" + "a" * 64) == {
        "builder": "mirror/cuda@sha256:" + "a" * 64, "runtime": "mirror/cuda@sha256:" + "a" * 64,
    }  # fmt: skip
    assert parse_base_image("runtime=r:1") == {"runtime": "r:1"}
    with pytest.raises(SparkforgeError, match="builder=REF,runtime=REF"):
        parse_base_image("final=r:1")
    assert parse_sources(["vllm=http://127.0.0.1:8000/v.tar.gz"]) == {
        "vllm": "http://127.0.0.1:8000/v.tar.gz"
    }
    with pytest.raises(SparkforgeError, match="component=URL"):
        parse_sources(["http://x"])
    for url in ("file:///etc/passwd", "ftp://mirror/v.tar.gz", "git+ssh://h/r"):  # only http(s) is fetched
        with pytest.raises(SparkforgeError, match="only http:// and https://"):
            parse_sources([f"vllm={url}"])
    with pytest.raises(SparkforgeError, match="builds no component 'torch' from source"):
        parse_sources(["torch=http://127.0.0.1:8000/t.tar.gz"])
    with pytest.raises(SparkforgeError, match="wheels only"):
        parse_sources(["vllm=http://127.0.0.1:8000/v.tar.gz"], [])


def test_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("x")
    monkeypatch.delenv("SPARKFORGE_CA_BUNDLE", raising=False)
    assert secret_args(BuildOptions(ca_bundle=bundle)) == (f"id=ca,src={bundle}",)
    monkeypatch.setenv("SPARKFORGE_CA_BUNDLE", str(bundle))
    assert secret_args(BuildOptions()) == (f"id=ca,src={bundle}",)
    with pytest.raises(SparkforgeError, match="no such file"):
        secret_args(BuildOptions(ca_bundle=tmp_path / "missing.pem"))
    assert secret_args(BuildOptions(ca_bundle=bundle, secrets=("id=hf_token,env=HF_TOKEN",)))[1] == (
        "id=hf_token,env=HF_TOKEN"
    )
    with pytest.raises(SparkforgeError, match="id=NAME"):
        secret_args(BuildOptions(ca_bundle=bundle, secrets=("hf_token",)))


def test_dry_push_by_digest_verifies_before_pushing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # buildx cannot be installed on this machine; CI runners and Sparks have it. Only the argv is checked.
    monkeypatch.setattr("sparkforge.engine.detect_engine", lambda runner=None: BUILDX)
    lines: list[str] = []
    options = BuildOptions(dry=True, push_by_digest=True, preflight=False, log_root=tmp_path / "logs")
    build(load_recipe("vllm-qwen35-wheels"), options, echo=lines.append)
    text = "\n".join(lines) + capsys.readouterr().err
    first_build = text.index("--target runtime")
    assert text.index("then: verify") > first_build
    assert "push-by-digest=true" in text[text.index("then: verify") :]

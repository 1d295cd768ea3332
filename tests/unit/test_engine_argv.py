"""The one code path that turns a build request into argv, for buildx and for the engine's BuildKit."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkforge.engine import Engine
from sparkforge.errors import EngineError, SparkforgeError
from sparkforge.imagebuild.buildkit import BuildRequest, build_command
from sparkforge.imagebuild.stage import check_secrets, parse_base_image, parse_sources

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
    from sparkforge.cli.families import session_from

    bundle = tmp_path / "ca.pem"
    bundle.write_text("x")
    assert check_secrets(bundle, ()) == bundle.resolve()
    monkeypatch.setenv("SPARKFORGE_CA_BUNDLE", str(bundle))  # read once, into the session
    assert session_from({}).ca_bundle == bundle
    with pytest.raises(SparkforgeError, match="no such file"):
        check_secrets(tmp_path / "missing.pem", ())
    check_secrets(bundle, ("id=hf_token,env=HF_TOKEN",))
    with pytest.raises(SparkforgeError, match="id=NAME"):
        check_secrets(bundle, ("hf_token",))
    with pytest.raises(SparkforgeError, match="does not exist"):
        check_secrets(None, (f"id=x,src={tmp_path / 'absent'}",))

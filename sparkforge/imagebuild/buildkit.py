"""BuildKit's command line and metadata file, as data: the argv `invoke build` (and build.sh) runs, and what
BuildKit's --metadata-file says of a pushed image. Nothing here calls a program; engine.py (the seam) does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sparkforge.commands import Command, argv_of
from sparkforge.errors import EngineError

# BuildKit (0.11+) sets the config's and history's times from this build arg; 0.13's exporter rewrites layers.
SOURCE_DATE_EPOCH = "SOURCE_DATE_EPOCH"

if TYPE_CHECKING:
    from sparkforge.engine import Engine


@dataclass(frozen=True)
class BuildRequest:
    """Everything one BuildKit build needs; `build_command` turns it into argv."""

    context: Path
    platform: str
    target: str
    tags: tuple[str, ...] = ()
    dockerfile: Path | None = None
    build_args: Mapping[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # "id=ca,src=/path" as docker takes it
    no_cache: bool = False
    builder: str | None = None
    network: str | None = None
    push_by_digest: str | None = None  # repository to push to by digest (buildx)
    # The tag pushed instead where the builder cannot push by digest alone (buildx's docker driver).
    staging_tag: str = "staging"
    sbom: str = "true"  # --sbom value: "true", "false" (no scanner image reachable), or "generator=REF"
    metadata_file: Path | None = None
    cache_from: tuple[str, ...] = ()
    cache_to: tuple[str, ...] = ()
    attestations: bool = False
    progress: Literal["plain", "auto", "tty"] = "plain"

    # Layer timestamps rewritten to SOURCE_DATE_EPOCH (buildx). Off where a push-by-digest on the docker driver
    # follows: Docker 26's own exporter refuses the rewrite, and the pushed image must equal the local one.
    rewrite_timestamps: bool = True

    @property
    def reproducible(self) -> bool:
        """A SOURCE_DATE_EPOCH build arg asks for reproducible layers (buildx: timestamps rewritten)."""
        return SOURCE_DATE_EPOCH in self.build_args and self.rewrite_timestamps

    @property
    def image_tar(self) -> Path:
        """Where the docker driver's reproducible build writes its image for `docker load` (beside the context)."""
        return self.context.parent / f".{self.context.name}-{self.target}.image.tar"


def build_command(engine: Engine, req: BuildRequest) -> Command:
    """The exact BuildKit command for a request (buildx when present, else DOCKER_BUILDKIT=1 docker build)."""
    common: list[str | None] = [
        "--platform",
        req.platform,
        "--target",
        req.target,
        "--progress",
        req.progress,
    ]
    if req.dockerfile is not None:
        common += ["--file", str(req.dockerfile)]
    for tag in req.tags:
        common += ["--tag", tag]
    for key, value in sorted(req.build_args.items()):
        common += ["--build-arg", f"{key}={value}"]
    for secret in req.secrets:
        common += ["--secret", secret]
    if req.no_cache:
        common.append("--no-cache")
    if req.network:
        common += ["--network", req.network]
    if engine.mode == "buildx":
        argv: list[str | None] = [engine.docker, "buildx", "build"]
        if req.builder:
            argv += ["--builder", req.builder]
        argv += common
        for ref in req.cache_from:
            argv += ["--cache-from", ref]
        for ref in req.cache_to:
            argv += ["--cache-to", ref]
        # BuildKit 0.13 clamps every file time in the new layers to SOURCE_DATE_EPOCH (reproducible layers).
        rewrite = ",rewrite-timestamp=true" if req.reproducible else ""
        if req.push_by_digest and engine.driver == "docker":
            rewrite = ""  # Docker 26's image exporter: "rewrite-timestamp conflicts with unpack"
            # The engine's own BuildKit (containerd image store) pushes only by name: a per-platform staging tag,
            # never a release tag; the digest in the metadata file is what publish merges.
            argv += ["--output", f"type=image,name={req.push_by_digest}:{req.staging_tag},push=true{rewrite}"]
        elif req.push_by_digest:
            argv += [
                "--output",
                f"type=image,name={req.push_by_digest},push-by-digest=true,name-canonical=true,push=true{rewrite}",
            ]
        elif req.reproducible and engine.driver == "docker":
            # The engine's own exporter cannot rewrite (it unpacks): a tarball, then `docker load` (load_command).
            argv += ["--output", f"type=docker,dest={req.image_tar}{rewrite}"]
        elif req.reproducible:
            argv += ["--output", f"type=docker{rewrite}"]
        else:
            argv.append("--load")
        if req.attestations:
            argv += ["--provenance", "mode=max"]
            if req.sbom != "false":
                argv += ["--sbom", req.sbom]
        if req.metadata_file is not None:
            argv += ["--metadata-file", str(req.metadata_file)]
        argv.append(str(req.context))
        return Command(argv_of(argv), engine.env)
    if req.builder:
        raise EngineError(
            f"--builder {req.builder} needs docker buildx, which {engine.docker} lacks; fix: install the buildx "
            "plugin (Docker 23+ ships it) or drop --builder"
        )
    if req.push_by_digest or req.cache_from or req.cache_to or req.attestations:
        raise EngineError(
            f"push by digest, registry cache and attestations need docker buildx, which {engine.docker} lacks; "
            "fix: install the buildx plugin, or build with plain tags and 'invoke push'"
        )
    return Command(argv_of([engine.docker, "build", *common, str(req.context)]), engine.env)


def load_command(engine: Engine, req: BuildRequest) -> Command | None:
    """The `docker load` a reproducible build on buildx's docker driver needs after it (None otherwise)."""
    if engine.mode != "buildx" or engine.driver != "docker" or req.push_by_digest or not req.reproducible:
        return None
    return Command((engine.docker, "load", "--input", str(req.image_tar)), engine.env)

"""Registry manifests through the engine's own tools: read, draft and push multi-arch indexes, read digests.

`docker buildx imagetools` where buildx exists, else the `docker manifest` commands of a Docker 20.10+ CLI
(plain HTTP for registries on this machine). No policy here: which platforms and tags are allowed is
`publish`'s job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparkforge import engine, oci
from sparkforge.commands import Command, Runner
from sparkforge.engine import Engine
from sparkforge.errors import EngineError, PublishError
from sparkforge.oci import is_local_registry

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def index_platforms(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(platform, digest) of every image in an index; attestation manifests (unknown/unknown) are skipped."""
    out = []
    for entry in manifest.get("manifests") or []:
        spec = entry.get("platform") or {}
        kind = (entry.get("annotations") or {}).get("vnd.docker.reference.type")
        if spec.get("os") in (None, "unknown") or kind == "attestation-manifest":
            continue
        out.append(
            (oci.canonical(spec["os"], spec.get("architecture"), spec.get("variant")), entry["digest"])
        )
    return out


def manifest_content(manifest: Mapping[str, Any]) -> list[str]:
    """What an index names, independent of formatting: its entries' digests (a single image: its config)."""
    if "manifests" in manifest:
        return sorted(e["digest"] for e in manifest["manifests"])
    return [json.dumps(manifest.get("config"), sort_keys=True)]


def repo_digest(ref: str, repository: str) -> str:
    """The digest the engine recorded for `ref` in `repository` after pushing it."""
    for entry in engine.inspect_image(ref).get("RepoDigests") or []:
        if entry.startswith(repository + "@"):
            return entry.split("@", 1)[1]
    raise PublishError(f"the engine pushed {ref} but reports no digest for {repository}")


@dataclass(frozen=True)
class Manifests:
    """Registry manifest operations: buildx imagetools when present, else docker manifest (20.10+)."""

    engine: Engine
    runner: Runner
    repository: str

    @property
    def buildx(self) -> bool:
        return self.engine.mode == "buildx"

    def _cmd(self, *args: str, insecure: bool = False) -> Command:
        if self.buildx:
            return Command((self.engine.docker, "buildx", "imagetools", *args), self.engine.env)
        flag = ("--insecure",) if insecure and is_local_registry(self.repository) else ()
        # 20.10 marks `docker manifest` experimental; the variable makes older CLIs accept it too.
        env = {**self.engine.env, "DOCKER_CLI_EXPERIMENTAL": "enabled"}
        return Command((self.engine.docker, "manifest", args[0], *flag, *args[1:]), env)

    def fetch(self, ref: str) -> dict[str, Any] | None:
        """The manifest (or index) at `ref` in the registry, or None when there is none."""
        command = (
            self._cmd("inspect", "--raw", ref) if self.buildx else self._cmd("inspect", ref, insecure=True)
        )
        result = self.runner.capture(command, "manifest-inspect", check=False)
        if result.returncode != 0:
            if re.search(r"no such manifest|not found|manifest unknown", result.output, re.IGNORECASE):
                return None
            raise PublishError(
                f"cannot read {ref} from the registry: {result.output.strip()[-400:]}; fix: check the name, "
                f"log in ('docker login {self.repository.split('/')[0]}') or start the registry"
            )
        return _json_in(result.output, ref)

    def draft(self, tag: str, sources: Sequence[str]) -> dict[str, Any]:
        """The index `create` would push for `sources`, built without touching any tag in the registry."""
        if self.buildx:
            result = self.runner.capture(
                self._cmd("create", "--dry-run", "--tag", tag, *sources), "index-draft"
            )
            return _json_in(result.output, tag)
        draft = self._local_list(tag, sources)
        self.runner.capture(self._cmd("rm", tag), "manifest-rm", check=False)
        return draft

    def _local_list(self, tag: str, sources: Sequence[str]) -> dict[str, Any]:
        """A local manifest list (docker manifest create); platforms come from each image's config."""
        self.runner.capture(self._cmd("rm", tag), "manifest-rm", check=False)  # a leftover list blocks create
        self.runner.capture(self._cmd("create", tag, *sources, insecure=True), "manifest-create")
        local = _json_in(self.runner.capture(self._cmd("inspect", tag), "manifest-inspect").output, tag)
        for platform, digest in index_platforms(local):
            # arm64 gets the variant buildx writes; the architecture itself was read from the image's config.
            if platform == "linux/arm64":
                argv = ("annotate", "--os", "linux", "--arch", "arm64", "--variant", "v8", tag)
                self.runner.capture(self._cmd(*argv, f"{self.repository}@{digest}"), "manifest-annotate")
        return _json_in(self.runner.capture(self._cmd("inspect", tag), "manifest-inspect").output, tag)

    def create(self, tags: Sequence[str], sources: Sequence[str]) -> str:
        """Push one index of `sources` under every tag; returns the index digest."""
        if self.buildx:
            argv = [a for t in tags for a in ("--tag", t)]
            self.runner.run(self._cmd("create", *argv, *sources), "index-create")
            return "" if self.runner.dry else self.digest_of(tags[0])
        digests = set()
        for tag in tags:
            if self.runner.dry:
                self.runner.run(self._cmd("create", tag, *sources, insecure=True), "manifest-create")
                self.runner.run(self._cmd("push", "--purge", tag, insecure=True), "manifest-push")
                continue
            self._local_list(tag, sources)
            output = self.runner.run(self._cmd("push", "--purge", tag, insecure=True), "manifest-push").output
            found = DIGEST.findall(output)
            if not found:
                raise PublishError(f"docker manifest push {tag} printed no digest:\n{output[-400:]}")
            digests.add(found[-1])
        if len(digests) > 1:
            raise PublishError(f"the tags {', '.join(tags)} received different indexes ({sorted(digests)})")
        return digests.pop() if digests else ""

    def image_configs(self, ref: str) -> dict[str, dict[str, Any]]:
        """platform -> image config of every image `ref` names in the registry (buildx imagetools)."""
        if not self.buildx:
            raise PublishError(
                f"reading {ref}'s image config from the registry needs docker buildx; fix: install the buildx "
                "plugin ('invoke engine.up --buildx' on Debian/Ubuntu)"
            )
        output = self.runner.capture(
            self._cmd("inspect", "--format", "{{json .Image}}", ref), "image-config"
        ).output
        data = _json_in(output, ref)
        images = {"": data} if "config" in data or "rootfs" in data else data
        return {
            f"{c.get('os')}/{c.get('architecture')}" + (f"/{c['variant']}" if c.get("variant") else ""): c
            for c in images.values()
        }

    def config_digest(self, ref: str) -> str:
        """The config digest (the image ID an engine shows) of the single-platform manifest `ref` names."""
        config = str(((self.fetch(ref) or {}).get("config") or {}).get("digest", ""))
        if not DIGEST.fullmatch(config):
            raise PublishError(f"{ref} is not a single image manifest in the registry (no config digest)")
        return config

    def digest_of(self, ref: str) -> str:
        """The digest of the manifest or index that `ref` names in the registry."""
        if not self.buildx:
            # docker manifest cannot print a list's digest; the engine's distribution API can.
            try:
                return engine.registry_digest(ref)
            except EngineError as exc:
                raise PublishError(str(exc)) from None
        template = "{{println .Manifest.Digest}}"
        result = self.runner.capture(self._cmd("inspect", "--format", template, ref), "digest")
        found = DIGEST.findall(result.output)
        if not found:
            raise PublishError(f"cannot read the digest of {ref}: {result.output.strip()[-300:]}")
        return found[0]


def _json_in(output: str, what: str) -> Any:
    """The first JSON document in a tool's output (warnings may surround it)."""
    starts = [i for i in (output.find("{"), output.find("[")) if i >= 0]
    try:
        return json.JSONDecoder().raw_decode(output[min(starts) :])[0]
    except (ValueError, IndexError):
        raise PublishError(f"expected a manifest for {what}, got: {output.strip()[-400:]}") from None

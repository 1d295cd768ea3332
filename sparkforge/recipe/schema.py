"""The recipe schema: strict patterns for every value that can reach a Dockerfile, and the typed model."""

from __future__ import annotations

import re
import string
from typing import Annotated, Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from sparkforge.recipe.budget import ImageBudget, Removal
from sparkforge.recipe.identity import parse_identity, pinned_identity, pinned_verify_identity
from sparkforge.recipe.loaderenv import image_env_refusals
from sparkforge.recipe.verbs import RdmaUserspace

# Every string that can reach a Dockerfile or a shell line is held to one of these patterns.
_SHA256 = r"sha256:[0-9a-f]{64}"
_IMAGE_NAME = r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
_PATTERNS: dict[str, tuple[str, str]] = {
    # name: (regex, fix)
    "image": (
        rf"{_IMAGE_NAME}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?@{_SHA256}",
        "pin the image by digest, e.g. 'nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:<64 hex>' "
        "(run 'invoke lock' to resolve a tag)",
    ),
    "repository": (
        _IMAGE_NAME,
        "use a lowercase image name without tag, e.g. 'ghcr.io/sparkforge/vllm-qwen35'",
    ),
    "sha40": (r"[0-9a-f]{40}", "use the full 40-character commit SHA (run 'invoke lock' to resolve a ref)"),
    "sha_short": (r"[0-9a-f]{7,40}", "use the commit SHA the wheel was built from (7 to 40 hex characters)"),
    "sha256_hex": (
        r"[0-9a-f]{64}",
        "use the wheel file's sha256 as 64 hex characters (PyPI's Simple API lists it)",
    ),
    "package": (r"[A-Za-z0-9][A-Za-z0-9._-]*", "use a PyPI distribution name, e.g. 'flashinfer-python'"),
    "url": (r"https?://[A-Za-z0-9.-]+(?::[0-9]+)?(?:/[A-Za-z0-9._~%/+-]*)?", "use a plain http(s) URL"),
    "gpu": (r"sm_[0-9]{2,3}[af]?", "use a CUDA SM target like 'sm_121'"),
    "cuda": (r"[0-9]{2}\.[0-9]", "use the CUDA major.minor, e.g. '13.0'"),
    "python": (r"3\.[0-9]{1,2}", "use a Python major.minor, e.g. '3.12'"),
    "arch": (
        r"[0-9]{1,2}\.[0-9][af]?(?:\+PTX)?",
        "use TORCH_CUDA_ARCH_LIST entries like '12.1a', '12.0f', '9.0+PTX'",
    ),
    "identifier": (
        r"[A-Za-z_][A-Za-z0-9_]*",
        "use a Python class name, e.g. 'Qwen3_5MoeForConditionalGeneration'",
    ),
    "model_type": (r"[a-z0-9_]+", "use a transformers model type, e.g. 'qwen3_5_moe'"),
    "deb_package": (r"[a-z0-9][a-z0-9.+-]+", "use a Debian/Ubuntu package name, e.g. 'libnuma1'"),
    "env_name": (r"[A-Za-z_][A-Za-z0-9_]*", "use an environment variable name (letters, digits, _)"),
    "env_value": (
        r"[A-Za-z0-9_./:,=+@%-]*",
        "use letters, digits and _ . / : , = + @ % - only (no spaces or quotes)",
    ),
    "glob": (r"[A-Za-z0-9_.*?/\[\]-]+", "use a path glob like 'vllm/_C*.so'"),
    "patch": (
        r"patches/(?!\.\.?/)[A-Za-z0-9_.-]+/(?!\.\.?\.patch$)[A-Za-z0-9_.-]+\.patch",
        "use a path like 'patches/vllm/0001-fix.patch' (no '.' or '..' segments)",
    ),
    "tag": (r"[A-Za-z0-9_{}][A-Za-z0-9_.{}-]{0,127}", "use a tag template like '{vllm}-cu{cuda}-{date}'"),
    "key_path": (
        r"[A-Za-z0-9_./-]+\.pub",
        "use the path of a cosign public key file, e.g. 'keys/cosign.pub'",
    ),
    "trust_root": (
        r"(?!.*(?:^|/)\.\.?(?:/|$))[A-Za-z0-9_./-]+\.root\.json",
        "use the path (in this repository) of the TUF root file, e.g. 'trust/ghcr.io_me_vllm.root.json'",
    ),
    "source": (
        r"https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+",
        "use the source repository's URL, e.g. 'https://github.com/me/sparkforge'",
    ),
    "identity": (
        r"[A-Za-z0-9_.:/@^$*+?()|\[\]\\-]{1,300}",
        "use the signer's certificate identity (a regexp), e.g. "
        "'^https://github.com/ORG/REPO/.github/workflows/images.yml@refs/heads/main$'",
    ),
    "probe_source": (
        r"csrc/[A-Za-z0-9_./-]+\.(?:cu|cpp)",
        "use a vLLM source path under csrc/, e.g. 'csrc/libtorch_stable/activation_kernels.cu'",
    ),
    "description": (
        r"[A-Za-z0-9 .,:;()+/_=@%#\[\]-]{1,200}",
        "use one line of plain text: letters, digits, spaces and . , : ; ( ) + / _ = @ % # [ ] -",
    ),
}
TAG_PLACEHOLDERS = ("recipe", "vllm", "torch", "cuda", "date", "hash")


class Shape(str):
    """A pattern's form in words (its fix without 'use'), for the docs table of recipe keys (recipe/fields.py)."""


def _pattern(kind: str) -> Any:
    regex, fix = _PATTERNS[kind]
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not valid here; fix: {fix}")
        return value

    return Annotated[StrictStr, AfterValidator(check), Shape(fix.removeprefix("use "))]


def _exact_version(value: str) -> str:
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", value):
        raise ValueError(
            f"{value!r} is not an exact version; fix: pin one release, e.g. '2.13.0' (no ranges)"
        )
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(f"{value!r} is not a PEP 440 version; fix: pin one release, e.g. '5.17.0'") from None
    return value


ExactVersion = Annotated[StrictStr, AfterValidator(_exact_version)]
PinnedImage = _pattern("image")  # a recipe's base image, pinned by digest (parsing: preflight.images)
# The same patterns for other typed files (overlay recipes: imagebuild/overlay/model.py).
PatchPath = _pattern("patch")
Sha256Hex = _pattern("sha256_hex")
Description = _pattern("description")
PathGlob = _pattern("glob")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Images(StrictModel):
    """The base images, pinned by digest."""

    builder: PinnedImage = Field(description="image the compile stages run in (needs nvcc)")
    runtime: PinnedImage = Field(description="image the final stage starts from")


class Component(StrictModel):
    package: _pattern("package") | None = Field(None, description="PyPI name; defaults to the component key")
    version: ExactVersion = Field(description="exact PEP 440 version (no ranges)")
    source: Literal["wheel", "git"] = Field(
        "wheel", description="pinned wheel, or git commit + patches + compile"
    )
    index: _pattern("url") | None = Field(None, description="extra package index for this component")
    commit: _pattern("sha_short") | None = Field(None, description="commit the component is built from")
    repository: _pattern("url") | None = Field(None, description="git repository (source: git)")
    patches: list[_pattern("patch")] = Field(
        default_factory=list, description="patch series, applied in order"
    )
    # Left out of the recipe hash at their defaults (exclude_if): existing recipes hash as before.
    sha256: _pattern("sha256_hex") | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="the one wheel file pip may install (hash-checking mode; source: wheel)",
    )
    requires: Literal["declared", "without-torch"] = Field(
        "declared",
        exclude_if=lambda v: v == "declared",
        description="without-torch: install the wheel with --no-deps, then its declared requirements except "
        "its torch pin (a CPU build pinning torch==X+cpu, a local version PyPI does not serve)",
    )

    @model_validator(mode="after")
    def _source_needs(self) -> Component:
        if self.source == "git":
            if self.commit is None or not re.fullmatch(_PATTERNS["sha40"][0], self.commit):
                raise ValueError(
                    "source 'git' needs 'commit' as the full 40-character SHA; fix: add commit: <40 hex> "
                    "(a branch or tag is not a pin; 'invoke lock' resolves one)"
                )
            if self.repository is None:
                raise ValueError(
                    "source 'git' needs 'repository'; fix: add repository: https://github.com/<org>/<repo>"
                )
        elif self.patches:
            raise ValueError("patches apply only to source 'git'; fix: set source: git or remove patches")
        if self.source == "git" and (self.sha256 is not None or self.requires != "declared"):
            raise ValueError("sha256 and requires apply only to source 'wheel'; fix: remove them")
        return self


class Components(StrictModel):
    """How each component is obtained: a pinned wheel, or a git commit with patches, compiled."""

    vllm: Component
    torch: Component
    transformers: Component
    flashinfer: Component | None = None
    # vLLM's `b12x` extra (0.33.0: b12x==1.5.1): CuTe DSL kernels JIT-compiled for sm_121a at serve time.
    b12x: Component | None = Field(None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _vllm_commit(self) -> Components:
        if self.vllm.commit is None and self.vllm.sha256 is None:
            raise ValueError(
                "components.vllm needs 'commit' (or, for a wheel that records none, its file's 'sha256'); fix: add "
                "the commit the release was built from"
            )
        return self

    def items(self) -> list[tuple[str, Component]]:
        return [
            (k, v) for k in ("vllm", "torch", "transformers", "flashinfer", "b12x") if (v := getattr(self, k))
        ]


# The compile probe's default translation units: what GB10 users run (issue: compile probe).
DEFAULT_PROBE_SOURCES = (
    "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_sm120_fp8.cu",
    "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_blockwise_sm120_fp8.cu",
    "csrc/libtorch_stable/quantization/fp4/nvfp4_scaled_mm_sm120_kernels.cu",
    "csrc/libtorch_stable/activation_kernels.cu",
)


class Probe(StrictModel):
    sources: list[_pattern("probe_source")] = Field(
        default_factory=lambda: list(DEFAULT_PROBE_SOURCES),
        min_length=1,
        description="translation units the probe compiles, relative to the vLLM source root",
    )
    externals: Literal["fetch", "omit"] = Field(
        "fetch",
        description="vLLM's external projects (FlashAttention, ...): fetched, or left out (no GitHub)",
    )
    cutlass: Literal["fetch", "flashinfer"] = Field(
        "fetch", description="CUTLASS: vLLM's own FetchContent, or the headers in the pinned flashinfer wheel"
    )


class Build(StrictModel):
    torch_cuda_arch_list: list[_pattern("arch")] = Field(
        min_length=1, description="TORCH_CUDA_ARCH_LIST, explicit: GPU-less builds cannot detect it"
    )
    max_jobs: StrictInt = Field(6, ge=1, le=64, description="parallel compile jobs; each nvcc job needs GBs")
    nvcc_threads: StrictInt = Field(2, ge=1, le=16, description="threads per nvcc job")
    probe: Probe | None = Field(
        None, description="the compile probe (invoke probe); defaults for source recipes"
    )
    rust: bool | None = Field(
        None, description="build vLLM's Rust extensions (vllm-rs, _rust_tool_parser); source recipes must say"
    )
    cuda_wheels: ExactVersion | None = Field(
        None, description="install CUDA's compiler from NVIDIA's PyPI cuda-toolkit wheels of this version"
    )

    @property
    def probe_settings(self) -> Probe:
        """The probe as configured, or the defaults (DEFAULT_PROBE_SOURCES, fetch, fetch)."""
        return self.probe or Probe()


def _nccl_version(value: str) -> str:
    if not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", value):
        raise ValueError(
            f"{value!r} is not an NCCL version; fix: major.minor.patch as NCCL reports it, e.g. 2.30.7"
        )
    return value


class NcclPin(StrictModel):
    """The libnccl the image's torch loads, pinned: every rank of a multi-node launch must load these bytes."""

    version: Annotated[StrictStr, AfterValidator(_nccl_version)] = Field(
        description="NCCL's version, e.g. 2.30.7"
    )
    sha256: _pattern("sha256_hex") = Field(description="sha256 of the libnccl.so.2 file torch loads")
    variant: Literal["stock", "switchless"] = Field(
        "stock",
        description="switchless: NCCL built for switchless rings (ring-only connections, subnet-aware routing); "
        "what a TP group across a ring needs",
    )


class Runtime(StrictModel):
    jit_toolchain: bool = Field(
        True,
        description="ship nvcc, ptxas and CUDA headers (NVIDIA's CUDA wheels) and g++ for Triton's and "
        "FlashInfer's serve-time JIT; without them the first JIT-compiled kernel fails on the GPU node",
    )
    strip: bool = Field(
        True,
        description="strip local symbols and debug sections from shared libraries (dynamic "
        "symbols stay: loading and backtraces are unchanged; only offline debuggers lose names)",
    )
    system_packages: list[_pattern("deb_package")] = Field(
        default_factory=list,
        exclude_if=lambda v: not v,  # left out of the recipe hash when empty: existing recipes hash as before
        description="Debian/Ubuntu libraries the recipe's wheels load that the runtime base lacks (e.g. libnuma1)",
    )
    remove: list[Removal] = Field(
        default_factory=list,
        exclude_if=lambda v: not v,  # absent: the hash as before
        description="files below site-packages left out, with why (recipe/budget.py)",
    )
    rdma: RdmaUserspace | None = Field(
        None,
        exclude_if=lambda v: v is None,  # recipes without it hash as before
        description="pinned RDMA userspace (libibverbs, mlx5 provider, librdmacm; perftest for the link test)",
    )
    nccl: NcclPin | None = Field(
        None,
        exclude_if=lambda v: v is None,  # recipes without it hash as before
        description="the NCCL the image carries (version, sha256, variant): verify checks it, the doctor "
        "checks every rank loads it",
    )


class Models(StrictModel):
    architectures: list[_pattern("identifier")] = Field(
        min_length=1, description="model classes vLLM must register (preflight and verify)"
    )
    model_types: list[_pattern("model_type")] = Field(
        default_factory=list, description="transformers model types transformers must know (preflight)"
    )


class Audit(StrictModel):
    require: list[_pattern("glob")] = Field(
        default_factory=list, description="libraries that must have kernels for `gpu`"
    )


class Keyless(StrictModel):
    """The CI identities that sign: the publishing workflow, and (separately) the GPU verify attestation's."""

    identity: Annotated[_pattern("identity"), AfterValidator(pinned_identity)] = Field(
        description="the publishing workflow's certificate identity (a regexp pinned to a workflow and ref)"
    )
    verify_identity: Annotated[_pattern("identity"), AfterValidator(pinned_verify_identity)] = Field(
        description="the GPU verify workflow's identity: its attestations count as GPU-verified"
    )
    issuer: _pattern("url") = Field(
        "https://token.actions.githubusercontent.com", description="the OIDC issuer of both identities"
    )

    @model_validator(mode="after")
    def _separate(self) -> Keyless:
        if parse_identity(self.identity).workflow == parse_identity(self.verify_identity).workflow:
            raise ValueError(
                "verify_identity names the same workflow as identity, so the publishing job could attest a GPU "
                "pass; fix: name the GPU verify workflow (.github/workflows/gpu-attest.yml) in verify_identity"
            )
        return self


class Signing(StrictModel):
    """Who may sign the recipe's images: public keys (paths in the repo) or keyless CI identities."""

    key: _pattern("key_path") | None = Field(
        None, description="the cosign public key that signs (or keyless)"
    )
    verify_key: _pattern("key_path") | None = Field(
        None, description="the key whose verify attestations count (GPU-verified); default: `key` itself"
    )
    keyless: Keyless | None = None
    trust_root: _pattern("trust_root") | None = Field(
        None,
        description="the TUF root this recipe's tags are trusted with (a file in this repository; default: "
        "the root sparkforge ships for the repository)",
    )
    source: _pattern("source") | None = Field(
        None, description="the source repository its signed provenance must name (default: sparkforge's)"
    )

    @model_validator(mode="after")
    def _one_way(self) -> Signing:
        if (self.key is None) == (self.keyless is None):
            raise ValueError("give exactly one of 'key' (a cosign public key path) or 'keyless' (identity)")
        if self.verify_key is not None and self.key is None:
            raise ValueError("verify_key goes with key; keyless signing names verify_identity instead")
        return self


class Publish(StrictModel):
    repository: _pattern("repository") = Field(description="where images are published")
    tags: list[_pattern("tag")] = Field(min_length=1, description="immutable tags")
    moving_tags: list[_pattern("tag")] = Field(
        default_factory=list, description="tags moved after verification"
    )
    qemu: bool = Field(False, description="allow building foreign platforms under QEMU in CI")
    # signing hook (sparkforge/signing.py): who signs; not an input of the image, so not in the recipe hash.
    signing: Signing | None = Field(None, exclude=True, description="how 'invoke pull' checks signatures")

    @field_validator("tags", "moving_tags")
    @classmethod
    def _placeholders(cls, value: list[str]) -> list[str]:
        fix = "use one of " + ", ".join("{" + p + "}" for p in TAG_PLACEHOLDERS)
        for tag in value:
            try:
                fields = [name for _, name, spec, conv in string.Formatter().parse(tag) if name is not None]
            except ValueError:
                raise ValueError(
                    f"tag {tag!r} has a stray '{{' or '}}'; fix: write placeholders as {{name}} and {fix}"
                ) from None
            for name in fields:
                if name not in TAG_PLACEHOLDERS:
                    raise ValueError(f"tag {tag!r} uses unknown placeholder {{{name}}}; fix: {fix}")
            if re.search(r"\{[^}]*[^a-z}][^}]*\}", tag):
                raise ValueError(f"tag {tag!r}: a placeholder has a format spec or index; fix: {fix}")
        return value


class RecipeModel(StrictModel):
    description: _pattern("description") = Field(
        description="shown by `invoke recipes`, OCI description label"
    )
    # cpu: a test vehicle (vLLM's CPU platform) for the serve path without a GPU; out of the hash at its default.
    device: Literal["cuda", "cpu"] = Field(
        "cuda",
        exclude_if=lambda v: v == "cuda",
        description="cpu: a test vehicle (vLLM's CPU platform) for the serve path without a GPU",
    )
    gpu: _pattern("gpu") = Field(description="the GPU the image is for (audit and verify target, label)")
    platforms: list[Literal["linux/arm64", "linux/amd64"]] = Field(
        min_length=1, description="platforms to build and publish (all or nothing)"
    )
    cuda: _pattern("cuda") = Field(description="CUDA major.minor of the bases and torch")
    python: _pattern("python") = Field(description="Python of the base image")
    images: Images = Field(description="the base images, pinned by digest")
    components: Components = Field(
        description="how vLLM, torch, transformers (and flashinfer, b12x) are obtained"
    )
    build: Build = Field(description="how the compile stages run")
    models: Models = Field(description="the model classes the image must serve")
    env: dict[_pattern("env_name"), _pattern("env_value")] = Field(
        default_factory=dict,
        description="runtime environment of the image (e.g. TRITON_PTXAS_PATH), allow-listed",
    )
    audit: Audit = Field(default_factory=Audit, description="the kernel-coverage audit of the image")
    runtime: Runtime = Field(default_factory=Runtime, description="what the runtime stage ships")
    image: ImageBudget = Field(default_factory=ImageBudget, exclude_if=lambda v: v.max_size is None)
    publish: Publish = Field(description="where and how the images are published")

    @model_validator(mode="after")
    def _source_build_choices(self) -> RecipeModel:
        if self.components.vllm.source == "git" and self.build.rust is None:
            raise ValueError(
                "build.rust is not set; fix: state build.rust: false (vLLM's Rust extensions vllm-rs and "
                "_rust_tool_parser are left out; verify checks the image has none) or true (needs cargo >= 1.95 "
                "in the builder image)"
            )
        wheels = self.build.cuda_wheels
        if wheels is not None and ".".join(wheels.split(".")[:2]) != self.cuda:
            raise ValueError(
                f"build.cuda_wheels {wheels} is not CUDA {self.cuda}; fix: pin a cuda-toolkit release of CUDA {self.cuda}"
            )
        return self

    @field_validator("env")
    @classmethod
    def _image_env_allowed(cls, value: dict[str, str]) -> dict[str, str]:
        refused = image_env_refusals(value)
        if refused:
            raise ValueError("not on the image allow-list: " + "; ".join(refused))
        return value

    @model_validator(mode="after")
    def _torch_index_matches_cuda(self) -> RecipeModel:
        index = self.components.torch.index
        match = re.search(r"/whl/(?:[a-z]+/)?cu([0-9]+)/?$", index or "")
        expected = "cu" + self.cuda.replace(".", "")
        if match and "cu" + match.group(1) != expected:
            raise ValueError(
                f"components.torch.index {index} is the cu{match.group(1)} index but the recipe's cuda is "
                f"{self.cuda}; fix: use https://download.pytorch.org/whl/{expected} (or change cuda)"
            )
        return self

    @field_validator("platforms")
    @classmethod
    def _unique_platforms(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a platform is listed twice; fix: list each platform once")
        return value

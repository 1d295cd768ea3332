"""An image's bill of materials (SPDX 2.3 JSON), read from the image itself after the build.

What is listed: every installed Debian package (dpkg's status), every Python distribution of every environment
in the image (its dist-info METADATA; its checksum is the sha256 of its RECORD, which holds every installed
file's hash), the CUDA libraries (hash from the owning distribution's RECORD, else of the file), and the vLLM
build facts (commit from the pin label, patches and CUDA arch list from the image's lock). The image's files
are read from the engine's layer store (verify/imagefs.py): nothing in the image runs. Why after the build and
not BuildKit's SBOM generator: docs/sbom.md.

The same image gives the same document, byte for byte (its time is the image's own `created` label), so a
pulled image's SBOM can be regenerated and compared with the signed one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import IO, Any

from sparkforge.boundary import parse_json
from sparkforge.errors import AuditError

SPDX_PREDICATE = "https://spdx.dev/Document"  # cosign's `--type spdxjson`: the in-toto predicate type
LOCK_PATH = "opt/sparkforge/lock.json"
DPKG_STATUS = "var/lib/dpkg/status"
TOOL = "sparkforge"
BUILD_ANNOTATION = (
    "sparkforge.vllm-build="  # the prefix of the vLLM package's annotation comment (JSON after)
)
LOCK_ANNOTATION = "sparkforge.lock-sha256="
# The CUDA runtime's own libraries by file name (not libcurl, not a project's lib*cuda_ext*.so).
CUDA_LIB = re.compile(
    r"lib(cuda|cudart|cublas|cublasLt|cufft|cufftw|cufile|cufile_rdma|cupti|curand|cusolver|cusolverMg|cusparse"
    r"|cusparseLt|nvJitLink|nvrtc|nvrtc-builtins|nvvm|nccl|cudnn(_[a-z_]+)?|nvshmem_host|nvjpeg|nvblas|nvToolsExt"
    r"|nvtx3interop|nvperf_host|nvperf_target)([-.][0-9a-f.]+)?\.so(\.[0-9.]+)?"
)
MAX_META_BYTES = 4 << 20  # one METADATA/RECORD file; dpkg's status of a full image is ~1 MB


@dataclass(frozen=True, order=True)
class Package:
    """One installed package: a Debian package or a Python distribution in one environment."""

    kind: str  # "deb" | "python"
    name: str
    version: str
    location: str = ""  # python: the environment's site-packages directory; deb: the architecture
    sha256: str = ""  # python: of its RECORD (or PKG-INFO); deb: of its md5sums list ("" when it has none)

    @property
    def key(self) -> str:
        """What identifies it across two images: kind, normalised name and where it lives."""
        return f"{self.kind}:{normalise(self.name)}@{self.location}"

    @property
    def purl(self) -> str:
        if self.kind == "deb":
            return f"pkg:deb/debian/{self.name}@{self.version}?arch={self.location}"
        return f"pkg:pypi/{normalise(self.name)}@{self.version}"


@dataclass(frozen=True, order=True)
class CudaLibrary:
    path: str  # inside the image, no leading "/"
    sha256: str
    owner: str = ""  # the Package.key of the distribution whose RECORD lists it ("" none)


@dataclass(frozen=True)
class VllmBuild:
    version: str
    commit: str
    patches: tuple[str, ...]
    arch_list: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "commit": self.commit,
            "patches": list(self.patches),
            "archList": list(self.arch_list),
        }


@dataclass(frozen=True)
class Sbom:
    """What one image holds; `to_spdx` writes it as an SPDX 2.3 document, `from_spdx` reads one back."""

    subject: str  # the image reference it was read from
    image_id: str  # sha256:... of the image config
    recipe: str
    recipe_hash: str
    created: str
    packages: tuple[Package, ...]
    cuda: tuple[CudaLibrary, ...] = ()
    vllm: VllmBuild | None = None
    lock_sha256: str = ""
    lock: Mapping[str, Any] = field(default_factory=dict, compare=False)  # the image's lock (not in SPDX)

    def to_spdx(self) -> dict[str, Any]:
        image_id = spdx_id("image", self.recipe or "image")
        packages: list[dict[str, Any]] = [
            {
                "name": self.recipe or self.subject,
                "SPDXID": image_id,
                "versionInfo": self.image_id,
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": False,
                "primaryPackagePurpose": "CONTAINER",
                "checksums": [
                    {"algorithm": "SHA256", "checksumValue": self.image_id.removeprefix("sha256:")}
                ],
                "comment": f"recipe {self.recipe} hash {self.recipe_hash}",
                **_annotations(self.created, self._notes()),
            }
        ]
        relationships = [_rel("SPDXRef-DOCUMENT", "DESCRIBES", image_id)]
        for package in self.packages:
            ident = spdx_id(package.kind, package.key)
            entry: dict[str, Any] = {
                "name": package.name,
                "SPDXID": ident,
                "versionInfo": package.version,
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": False,
                "primaryPackagePurpose": "LIBRARY",
                "externalRefs": [
                    {
                        "referenceCategory": "PACKAGE-MANAGER",
                        "referenceType": "purl",
                        "referenceLocator": package.purl,
                    }
                ],
                "sourceInfo": f"{package.kind} {package.location}".strip(),
            }
            if package.sha256:
                entry["checksums"] = [{"algorithm": "SHA256", "checksumValue": package.sha256}]
            packages.append(entry)
            relationships.append(_rel(image_id, "CONTAINS", ident))
        for lib in self.cuda:  # packages, not SPDX files: a file entry needs a SHA-1, RECORD holds SHA-256
            ident = spdx_id("cuda", lib.path)
            packages.append(
                {
                    "name": lib.path.rsplit("/", 1)[-1],
                    "SPDXID": ident,
                    "versionInfo": "NOASSERTION",
                    "packageFileName": "/" + lib.path,
                    "downloadLocation": "NOASSERTION",
                    "filesAnalyzed": False,
                    "primaryPackagePurpose": "LIBRARY",
                    "checksums": [{"algorithm": "SHA256", "checksumValue": lib.sha256}],
                    "sourceInfo": f"cuda {lib.path}",
                    "comment": "CUDA library",
                }
            )
            owner = spdx_id("python", lib.owner) if lib.owner else image_id
            relationships.append(_rel(owner, "CONTAINS", ident))
        return {
            "spdxVersion": "SPDX-2.3",
            "dataLicense": "CC0-1.0",
            "SPDXID": "SPDXRef-DOCUMENT",
            "name": f"{self.recipe or 'image'} {self.image_id}",
            "documentNamespace": f"https://sparkforge.dev/spdx/{self.image_id.removeprefix('sha256:')}",
            "creationInfo": {"created": self.created, "creators": [f"Tool: {TOOL}"]},
            "packages": packages,
            "relationships": relationships,
        }

    def _notes(self) -> list[str]:
        """The image package's annotations: the lock's sha256 and the vLLM build facts (JSON)."""
        notes = [LOCK_ANNOTATION + self.lock_sha256] if self.lock_sha256 else []
        if self.vllm:
            notes.append(BUILD_ANNOTATION + json.dumps(self.vllm.to_json(), sort_keys=True))
        return notes


def normalise(name: str) -> str:
    """PEP 503's normalised project name (Foo_Bar.baz -> foo-bar-baz)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def spdx_id(kind: str, text: str) -> str:
    """An SPDX identifier (letters, digits, '.', '-') for `text`, unique by a short hash of it."""
    readable = re.sub(r"[^A-Za-z0-9.-]+", "-", text)[-60:].strip("-")
    return f"SPDXRef-{kind}-{readable}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def _rel(a: str, kind: str, b: str) -> dict[str, str]:
    return {"spdxElementId": a, "relationshipType": kind, "relatedSpdxElement": b}


def _annotations(created: str, comments: Sequence[str]) -> dict[str, Any]:
    if not comments:
        return {}
    return {
        "annotations": [
            {"annotationDate": created, "annotationType": "OTHER", "annotator": f"Tool: {TOOL}", "comment": c}
            for c in comments
        ]
    }


# ---- reading the image's files ------------------------------------------------------------------


def dpkg_packages(status: str, md5sums: Mapping[str, str]) -> list[Package]:
    """The installed packages of a dpkg status file; `md5sums`: package name (or name:arch) -> sha256 of its list."""
    out = []
    for paragraph in status.split("\n\n"):
        fields = dict(_fields(paragraph))
        if not fields.get("Package") or not fields.get("Status", "").endswith(" installed"):
            continue
        name, arch = fields["Package"], fields.get("Architecture", "")
        digest = md5sums.get(f"{name}:{arch}") or md5sums.get(name, "")
        out.append(Package("deb", name, fields.get("Version", ""), arch, digest))
    return sorted(out)


def _fields(paragraph: str) -> Iterable[tuple[str, str]]:
    for line in paragraph.splitlines():
        if line and not line[0].isspace() and ":" in line:
            key, _, value = line.partition(":")
            yield key, value.strip()


def record_hashes(record: str) -> dict[str, str]:
    """RECORD's path -> sha256 hex (its `sha256=<urlsafe base64>` column)."""
    out = {}
    for line in record.splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1].startswith("sha256="):
            raw = parts[1][7:]
            out[parts[0].strip('"')] = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
    return out


def _read(files: Mapping[str, Path | bytes], path: str) -> bytes:
    """One metadata file: in memory (the export reader's), or read from the layer store."""
    from sparkforge.verify import imagefs

    source = files[path]
    data = source if isinstance(source, bytes) else imagefs.read_file(source, MAX_META_BYTES)
    if len(data) > MAX_META_BYTES:
        raise AuditError(f"{path} in the image is over {MAX_META_BYTES} bytes; not a package database")
    return data


def sbom_of_files(
    files: Mapping[str, Path | bytes],
    subject: str,
    image_id: str,
    labels: Mapping[str, str],
    hashed: Mapping[str, str] | None = None,
) -> Sbom:
    """The SBOM of an image whose visible files are `files` (path inside the image -> a host path in the layer
    store, or the file's bytes).

    `hashed`: sha256 of files already read (the export reader hashes CUDA libraries as they stream by)."""
    hashed = hashed or {}
    md5sums = {
        p.rsplit("/", 1)[1].removesuffix(".md5sums"): hashlib.sha256(_read(files, p)).hexdigest()
        for p in files
        if p.startswith("var/lib/dpkg/info/") and p.endswith(".md5sums")
    }
    packages = (
        dpkg_packages(_read(files, DPKG_STATUS).decode("utf-8", "replace"), md5sums)
        if DPKG_STATUS in files
        else []
    )
    owners: dict[str, tuple[str, str]] = {}  # image path -> (owner key, sha256 from its RECORD)
    for path in sorted(files):
        folder, _, leaf = path.rpartition("/")
        dist = (leaf == "METADATA" and folder.endswith(".dist-info")) or (
            leaf == "PKG-INFO" and folder.endswith(".egg-info")
        )
        if not dist:
            continue
        env = folder.rpartition("/")[0]
        meta = HeaderParser().parsestr(_read(files, path).decode("utf-8", "replace"))
        record = f"{folder}/RECORD"
        proof = _read(files, record) if record in files else _read(files, path)
        package = Package("python", str(meta["Name"] or ""), str(meta["Version"] or ""), env, _sha(proof))
        packages.append(package)
        if record in files:
            for rel, digest in record_hashes(proof.decode("utf-8", "replace")).items():
                owners[f"{env}/{rel}"] = (package.key, digest)
    cuda = []
    for path in sorted(files):
        if CUDA_LIB.fullmatch(path.rsplit("/", 1)[-1]):
            owner, digest = owners.get(path, ("", ""))
            cuda.append(CudaLibrary(path, digest or hashed.get(path) or _file_sha(files[path]), owner))
    lock: dict[str, Any] = {}
    lock_sha = ""
    if LOCK_PATH in files:
        raw = _read(files, LOCK_PATH)
        lock, lock_sha = parse_json(raw.decode("utf-8", "replace"), LOCK_PATH), _sha(raw)
    return Sbom(
        subject,
        image_id,
        labels.get("dev.sparkforge.recipe", ""),
        labels.get("dev.sparkforge.recipe-hash", ""),
        labels.get("org.opencontainers.image.created") or "1970-01-01T00:00:00Z",
        tuple(sorted(packages)),
        tuple(cuda),
        vllm_build(labels, lock),
        lock_sha,
        lock,
    )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(source: Path | bytes) -> str:
    from sparkforge.verify import imagefs

    return _sha(source) if isinstance(source, bytes) else imagefs.file_sha256(source)


def vllm_build(labels: Mapping[str, str], lock: Mapping[str, Any]) -> VllmBuild | None:
    """The vLLM build facts: version and commit from the pin label, patches and arch list from the lock."""
    pin = labels.get("dev.sparkforge.pin.vllm", "")
    if not pin:
        return None
    version, _, commit = pin.partition("@")
    component = (lock.get("components") or {}).get("vllm") or {}
    patches = [str(p.get("name", p) if isinstance(p, dict) else p) for p in component.get("patches") or []]
    arch = (lock.get("build") or {}).get("torch_cuda_arch_list") or []
    return VllmBuild(version, commit, tuple(patches), tuple(str(a) for a in arch))


def image_sbom(ref: str, reader: str = "auto") -> Sbom:
    """The SBOM of a local image, read from the engine's layer store (`reader` "auto" falls back to the export
    stream where the store is not readable here; "export" always streams). Nothing in the image runs."""
    from sparkforge import engine
    from sparkforge.verify import imagefs

    info = engine.inspect_image(ref)
    labels = (info.get("Config") or {}).get("Labels") or {}
    tree = imagefs.image_tree(ref) if reader != "export" else None
    if tree is not None:
        return sbom_of_files({f.path: f.source for f in tree.files}, ref, str(info["Id"]), labels)
    # another store (containerd's snapshotter), a remote engine: the files it needs, from the export stream
    with engine.ExportedFilesystem(ref) as stream:
        files, hashed = _from_export(stream)
    return sbom_of_files(files, ref, str(info["Id"]), labels, hashed)


def wanted(path: str) -> bool:
    """The files an SBOM reads: dpkg's database, distribution metadata, the lock (CUDA libraries are hashed)."""
    folder, _, leaf = path.rpartition("/")
    return (
        path in (DPKG_STATUS, LOCK_PATH)
        or (folder == "var/lib/dpkg/info" and leaf.endswith(".md5sums"))
        or (folder.endswith(".dist-info") and leaf in ("METADATA", "RECORD"))
        or (folder.endswith(".egg-info") and leaf == "PKG-INFO")
    )


def _from_export(stream: IO[bytes]) -> tuple[dict[str, Path | bytes], dict[str, str]]:
    """The SBOM's files of an exported filesystem (their bytes), and each CUDA library's sha256 (streamed, never
    kept)."""
    files: dict[str, Path | bytes] = {}
    hashed: dict[str, str] = {}
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            path = member.name.removeprefix("./").lstrip("/")
            link = member.linkname.removeprefix("./").lstrip("/")
            if member.islnk() and link in files:
                files[path] = files[link]
                if link in hashed:
                    hashed[path] = hashed[link]
                continue
            if not member.isfile():
                continue
            is_cuda = bool(CUDA_LIB.fullmatch(path.rsplit("/", 1)[-1]))
            if not (is_cuda or (wanted(path) and member.size <= MAX_META_BYTES)):
                continue
            handle = archive.extractfile(member)
            assert handle is not None
            if is_cuda:
                digest = hashlib.sha256()
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
                hashed[path], files[path] = digest.hexdigest(), b""
                continue
            files[path] = handle.read(MAX_META_BYTES + 1)
    return files, hashed


# ---- reading a document back, and checking it ---------------------------------------------------


def from_spdx(doc: Mapping[str, Any]) -> Sbom:
    """An SBOM back from an SPDX document this module wrote (or AuditError naming what is wrong)."""
    if doc.get("spdxVersion") != "SPDX-2.3" or not isinstance(doc.get("packages"), list):
        raise AuditError(
            "not an SPDX 2.3 JSON document with packages; fix: pass what 'invoke sbom --json' wrote"
        )
    top, *rest = doc["packages"] or [{}]
    packages, vllm, lock_sha = [], None, ""
    for note in top.get("annotations") or []:
        comment = str(note.get("comment", ""))
        if comment.startswith(LOCK_ANNOTATION):
            lock_sha = comment[len(LOCK_ANNOTATION) :]
        if comment.startswith(BUILD_ANNOTATION):
            facts = parse_json(comment[len(BUILD_ANNOTATION) :], "the SBOM's vLLM build annotation")
            vllm = VllmBuild(
                str(facts.get("version")),
                str(facts.get("commit")),
                tuple(facts.get("patches") or ()),
                tuple(facts.get("archList") or ()),
            )
    cuda = []
    for entry in rest:
        kind, _, location = str(entry.get("sourceInfo", "")).partition(" ")
        sums = [c["checksumValue"] for c in entry.get("checksums") or [] if c.get("algorithm") == "SHA256"]
        if kind == "cuda":
            cuda.append(CudaLibrary(location, sums[0] if sums else ""))
            continue
        packages.append(
            Package(
                kind, str(entry.get("name")), str(entry.get("versionInfo")), location, sums[0] if sums else ""
            )
        )
    match = re.fullmatch(r"recipe (\S*) hash (\S*)", str(top.get("comment", "")))
    recipe, recipe_hash = match.groups() if match else ("", "")
    created = str((doc.get("creationInfo") or {}).get("created", ""))
    return Sbom(
        str(doc.get("name", "")),
        str(top.get("versionInfo", "")),
        recipe,
        recipe_hash,
        created,
        tuple(sorted(packages)),
        tuple(cuda),
        vllm,
        lock_sha,
    )


def lock_problems(sbom: Sbom, lock: Mapping[str, Any]) -> list[str]:
    """Where the SBOM's Python distributions disagree with the lock's components (name and version)."""
    found: dict[str, list[str]] = {}
    for p in sbom.packages:
        if p.kind == "python":
            found.setdefault(normalise(p.name), []).append(p.version)
    problems = []
    for name, component in sorted((lock.get("components") or {}).items()):
        if component.get("source") not in (None, "wheel", "source", "git"):
            continue
        dist = normalise(str(component.get("package") or name))
        want = str(component.get("version", ""))
        versions = found.get(dist, [])
        if not any(v == want or v.startswith(want + "+") for v in versions):
            problems.append(f"the lock pins {dist}=={want}, the image has {', '.join(versions) or 'none'}")
    return problems


def label_problems(sbom: Sbom, labels: Mapping[str, str]) -> list[str]:
    """Where the SBOM disagrees with the image's labels (recipe, recipe hash, the vLLM pin)."""
    problems = []
    for what, have, want in (
        ("recipe", sbom.recipe, labels.get("dev.sparkforge.recipe", "")),
        ("recipe hash", sbom.recipe_hash, labels.get("dev.sparkforge.recipe-hash", "")),
    ):
        if have != want:
            problems.append(f"its {what} is {have!r}, the label says {want!r}")
    build = vllm_build(labels, {})
    if build and (
        sbom.vllm is None or (sbom.vllm.version, sbom.vllm.commit) != (build.version, build.commit)
    ):
        have = f"{sbom.vllm.version}@{sbom.vllm.commit}" if sbom.vllm else "none"
        problems.append(f"its vLLM build is {have}, the pin label says {build.version}@{build.commit}")
    return problems


def content_problems(signed: Sbom, actual: Sbom, limit: int = 8) -> list[str]:
    """Where a signed SBOM and the SBOM read from the image itself differ (packages, CUDA libraries, lock)."""
    changes = package_changes(signed, actual)
    problems = [c.describe() for c in changes[:limit]]
    if len(changes) > limit:
        problems.append(f"... and {len(changes) - limit} more package changes")
    if signed.image_id != actual.image_id:
        problems.append(f"it is of image {signed.image_id[:19]}, this image is {actual.image_id[:19]}")
    if {(c.path, c.sha256) for c in signed.cuda} != {(c.path, c.sha256) for c in actual.cuda}:
        problems.append("its CUDA libraries differ from the image's")
    if signed.lock_sha256 != actual.lock_sha256:
        problems.append(
            f"its lock sha256 {signed.lock_sha256[:12]} is not the image's {actual.lock_sha256[:12]}"
        )
    if signed.vllm != actual.vllm:
        problems.append("its vLLM build facts differ from the image's labels and lock")
    return problems


@dataclass(frozen=True)
class Change:
    """One package that differs between two SBOMs."""

    key: str
    kind: str
    name: str
    before: str  # "version (sha256[:12])", "" when added
    after: str  # "" when removed

    @property
    def what(self) -> str:
        return "added" if not self.before else "removed" if not self.after else "changed"

    def describe(self) -> str:
        return f"{self.kind} {self.name} {self.what}: {self.before or '-'} -> {self.after or '-'}"

    def to_json(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "name": self.name,
            "change": self.what,
            "before": self.before,
            "after": self.after,
        }


def package_changes(a: Sbom, b: Sbom) -> list[Change]:
    """Packages added, removed, or with another version or checksum from `a` to `b`."""

    def index(s: Sbom) -> dict[str, Package]:
        return {p.key: p for p in s.packages}

    def text(p: Package | None) -> str:
        return f"{p.version} ({p.sha256[:12] or 'no hash'})" if p else ""

    left, right = index(a), index(b)
    out = []
    for key in sorted(set(left) | set(right)):
        x, y = left.get(key), right.get(key)
        if x is None or y is None or (x.version, x.sha256) != (y.version, y.sha256):
            p = x or y
            assert p is not None
            out.append(Change(key, p.kind, p.name, text(x), text(y)))
    return out


def release_notes(old: Sbom, new: Sbom, old_ref: str, new_ref: str) -> str:
    """The release notes' "what changed inside" section from two SBOMs: the vLLM build, then every package
    added, removed or changed (Debian, Python, CUDA libraries by checksum), one Markdown table per kind."""
    from sparkforge.console import md_cell, md_code

    lines = [f"## What changed inside: {md_code(old_ref)} -> {md_code(new_ref)}", ""]
    if old.vllm != new.vllm:

        def build(v: VllmBuild | None) -> str:
            return (
                f"{v.version} {v.commit or '-'} (patches: {', '.join(v.patches) or 'none'})" if v else "none"
            )

        lines += [f"- vLLM build: {md_cell(build(old.vllm))} -> {md_cell(build(new.vllm))}", ""]
    changes = package_changes(old, new)
    cuda_old = {c.path: c.sha256 for c in old.cuda}
    cuda_new = {c.path: c.sha256 for c in new.cuda}
    cuda = [
        (path, cuda_old.get(path, ""), cuda_new.get(path, ""))
        for path in sorted(set(cuda_old) | set(cuda_new))
        if cuda_old.get(path) != cuda_new.get(path)
    ]
    if not changes and not cuda:
        lines.append("No package changed (Debian, Python, CUDA libraries).")
        return "\n".join(lines) + "\n"
    for kind, title in (("deb", "Debian packages"), ("python", "Python distributions")):
        rows = [c for c in changes if c.kind == kind]
        if rows:
            lines += [
                f"### {title} ({len(rows)})",
                "",
                "| package | change | before | after |",
                "|---|---|---|---|",
            ]
            lines += [
                f"| {md_cell(c.name)} | {c.what} | {md_cell(c.before or '-')} | {md_cell(c.after or '-')} |"
                for c in rows
            ]
            lines.append("")
    if cuda:
        lines += [f"### CUDA libraries ({len(cuda)})", "", "| library | before | after |", "|---|---|---|"]
        lines += [f"| {md_code(p)} | {b[:12] or '-'} | {a[:12] or '-'} |" for p, b, a in cuda]
        lines.append("")
    return "\n".join(lines)

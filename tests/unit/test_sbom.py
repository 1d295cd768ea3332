"""The SBOM read from an image's files (a real tree of files here; the real image in tests/engine/test_sbom.py):
dpkg's status, dist-info RECORD hashes, CUDA libraries, the vLLM build facts, SPDX written and read back, and
what the checks at pull find wrong."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from sparkforge.verify import sbom

STATUS = """Package: bash
Status: install ok installed
Architecture: amd64
Version: 5.2.15-2+b13
Description: GNU Bourne Again SHell
 continued line: Version: 9

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: libc6
Status: install ok installed
Architecture: amd64
Multi-Arch: same
Version: 2.36-9+deb12u10
"""
ENV = "opt/venv/lib/python3.11/site-packages"
LABELS = {
    "dev.sparkforge.recipe": "demo",
    "dev.sparkforge.recipe-hash": "ab" * 32,
    "dev.sparkforge.pin.vllm": "0.33.0@4ba787ec9",
    "org.opencontainers.image.created": "2026-12-04T19:48:02Z",
}
LOCK = {
    "components": {
        "vllm": {
            "version": "0.33.0",
            "commit": "4ba787ec9",
            "source": "wheel",
            "patches": ["0001-fix.patch"],
        },
        "flashinfer": {"package": "flashinfer-python", "version": "0.7.2.post1", "source": "wheel"},
    },
    "build": {"torch_cuda_arch_list": ["12.0", "12.1a"]},
}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _tree(root: Path, versions: dict[str, str] | None = None) -> dict[str, Path]:
    """An image's files: dpkg, two Python environments, a CUDA library owned by a wheel, one not, the lock."""
    versions = {"vllm": "0.33.0", "flashinfer_python": "0.7.2.post1", **(versions or {})}
    files: dict[str, bytes] = {
        sbom.DPKG_STATUS: STATUS.encode(),
        "var/lib/dpkg/info/bash.md5sums": b"abc  bin/bash\n",
        "var/lib/dpkg/info/libc6:amd64.md5sums": b"def  lib/libc.so.6\n",
        sbom.LOCK_PATH: json.dumps(LOCK).encode(),
        "usr/lib/python3/dist-packages/pip-23.0.1.dist-info/METADATA": b"Name: pip\nVersion: 23.0.1\n",
        "usr/lib/x86_64-linux-gnu/libcurl-gnutls.so.4.8.0": b"not cuda",
        "usr/local/cuda/lib64/libcudart.so.13": b"a runtime outside any wheel",
    }
    for dist, version in versions.items():
        info = f"{dist}-{version}.dist-info"
        files[f"{ENV}/{info}/METADATA"] = (
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
        )
    lib = b"\x7fELF cublas"
    files[f"{ENV}/nvidia/cu13/lib/libcublas.so.13"] = lib
    files[f"{ENV}/nvidia_cublas-13.0.0.dist-info/METADATA"] = b"Name: nvidia-cublas\nVersion: 13.0.0\n"
    files[f"{ENV}/nvidia_cublas-13.0.0.dist-info/RECORD"] = (
        f"nvidia/cu13/lib/libcublas.so.13,sha256={_b64(lib)},{len(lib)}\n"
        "nvidia_cublas-13.0.0.dist-info/RECORD,,\n"
    ).encode()
    out = {}
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        out[rel] = path
    return out


def _read(tmp_path: Path, **versions: str) -> sbom.Sbom:
    return sbom.sbom_of_files(_tree(tmp_path, versions), "demo:1", "sha256:" + "1" * 64, LABELS)


def test_lists_installed_debian_packages_with_their_md5sums_hash(tmp_path: Path) -> None:
    found = _read(tmp_path)
    debs = {p.name: p for p in found.packages if p.kind == "deb"}
    assert set(debs) == {"bash", "libc6"}  # the de-installed one is not in the image
    assert debs["bash"].version == "5.2.15-2+b13" and debs["bash"].location == "amd64"
    assert debs["bash"].sha256 == hashlib.sha256(b"abc  bin/bash\n").hexdigest()
    assert debs["libc6"].sha256 == hashlib.sha256(b"def  lib/libc.so.6\n").hexdigest()  # name:arch list


def test_every_python_distribution_of_every_environment_and_cuda_libraries(tmp_path: Path) -> None:
    found = _read(tmp_path)
    python = {(p.name, p.version, p.location) for p in found.packages if p.kind == "python"}
    assert python == {
        ("pip", "23.0.1", "usr/lib/python3/dist-packages"),
        ("vllm", "0.33.0", ENV),
        ("flashinfer_python", "0.7.2.post1", ENV),
        ("nvidia-cublas", "13.0.0", ENV),
    }
    cublas = next(p for p in found.packages if p.name == "nvidia-cublas")
    record = (tmp_path / ENV / "nvidia_cublas-13.0.0.dist-info" / "RECORD").read_bytes()
    assert cublas.sha256 == hashlib.sha256(record).hexdigest()
    libs = {c.path.rsplit("/", 1)[1]: c for c in found.cuda}
    assert set(libs) == {"libcublas.so.13", "libcudart.so.13"}  # not libcurl
    assert libs["libcublas.so.13"].sha256 == hashlib.sha256(b"\x7fELF cublas").hexdigest()  # from RECORD
    assert libs["libcublas.so.13"].owner == cublas.key
    assert libs["libcudart.so.13"].sha256 == hashlib.sha256(b"a runtime outside any wheel").hexdigest()
    assert found.vllm == sbom.VllmBuild("0.33.0", "4ba787ec9", ("0001-fix.patch",), ("12.0", "12.1a"))


def test_spdx_document_is_deterministic_and_reads_back(tmp_path: Path) -> None:
    found = _read(tmp_path)
    doc = found.to_spdx()
    assert json.dumps(doc) == json.dumps(_read(tmp_path).to_spdx())  # same image, same bytes
    assert (
        doc["spdxVersion"] == "SPDX-2.3"
        and doc["creationInfo"]["created"] == LABELS["org.opencontainers.image.created"]
    )
    ids = [p["SPDXID"] for p in doc["packages"]]
    assert len(ids) == len(set(ids)) and all(i.startswith("SPDXRef-") for i in ids)
    purls = {r["referenceLocator"] for p in doc["packages"] for r in p.get("externalRefs", [])}
    assert "pkg:deb/debian/bash@5.2.15-2+b13?arch=amd64" in purls and "pkg:pypi/vllm@0.33.0" in purls
    back = sbom.from_spdx(json.loads(json.dumps(doc)))
    assert sbom.content_problems(back, found) == []
    assert (back.recipe, back.recipe_hash, back.vllm) == ("demo", "ab" * 32, found.vllm)


def test_lock_and_label_problems(tmp_path: Path) -> None:
    good = _read(tmp_path / "a")
    assert sbom.lock_problems(good, LOCK) == [] and sbom.label_problems(good, LABELS) == []
    wrong = _read(tmp_path / "b", flashinfer_python="0.7.1")
    assert sbom.lock_problems(wrong, LOCK) == [
        "the lock pins flashinfer-python==0.7.2.post1, the image has 0.7.1"
    ]
    other = {**LABELS, "dev.sparkforge.pin.vllm": "0.33.0@deadbeef1", "dev.sparkforge.recipe-hash": "cd" * 32}
    problems = sbom.label_problems(good, other)
    assert any("recipe hash" in p for p in problems) and any("deadbeef1" in p for p in problems)


def test_package_changes_name_exactly_the_changed_package(tmp_path: Path) -> None:
    a, b = _read(tmp_path / "a"), _read(tmp_path / "b", vllm="0.33.1")
    changes = sbom.package_changes(a, b)
    assert [(c.name, c.what) for c in changes] == [("vllm", "changed")]
    assert changes[0].before.startswith("0.33.0") and changes[0].after.startswith("0.33.1")
    tampered = sbom.from_spdx(a.to_spdx())
    doc = a.to_spdx()
    doc["packages"][1]["versionInfo"] = "9.9"  # an edit of the document after it was written
    assert sbom.content_problems(sbom.from_spdx(doc), a) and not sbom.content_problems(tampered, a)


def test_release_notes_name_exactly_what_changed_inside(tmp_path: Path) -> None:
    a, b = _read(tmp_path / "a"), _read(tmp_path / "b", vllm="0.33.1")
    notes = sbom.release_notes(a, b, "repo@sha256:old", "repo@sha256:new")
    assert notes.startswith("## What changed inside: `repo@sha256:old` -> `repo@sha256:new`")
    assert "### Python distributions (1)" in notes and "| vllm | changed | 0.33.0 (" in notes
    assert "Debian packages" not in notes  # only the kinds that changed get a table
    same = sbom.release_notes(a, a, "x", "x")
    assert "No package changed" in same and "###" not in same

"""The kernel audit's per-file cache (verify/auditcache.py) and the scoped audit of layer directories, on real
fatbinaries built by nvcc 13 (tests/unit/audit_fixtures.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from audit_fixtures import BY_NAME, build_fixtures, nvcc_available

from sparkforge.audit.fatbin import read_fatbin_file
from sparkforge.verify import auditcache, imagefs

pytestmark = pytest.mark.skipif(
    not nvcc_available(), reason="nvcc 13 not found at /usr/local/cuda-13.0/bin/nvcc"
)
LAYER = "sha256:" + "a" * 64


@pytest.fixture(scope="module")
def binaries() -> dict[str, Path]:
    return build_fixtures([BY_NAME[n] for n in ("mix_so", "mix_zstd", "sm_90", "embedded")])


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPARKFORGE_CACHE", str(root))
    return root


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "kernels" / "files").rglob("*.json"))


def test_a_kept_answer_is_the_reader_s_answer(binaries: dict[str, Path], cache: Path) -> None:
    for name, path in binaries.items():
        digest = auditcache.layer_file_digest(LAYER, name)
        assert auditcache.load(digest) is auditcache.MISS
        fatbin = read_fatbin_file(path, name)
        auditcache.store(digest, fatbin)
        assert auditcache.load(digest) == fatbin  # every container, entry, offset, flag and name
    assert len(_entries(cache)) == len(binaries)
    assert not list(cache.rglob("*.part"))  # written through a temporary file renamed into place


def test_a_file_is_read_once_per_content_digest(
    binaries: dict[str, Path], cache: Path, tmp_path: Path
) -> None:
    lib = tmp_path / "lib.so"
    shutil.copy(binaries["mix_so"], lib)
    digest = auditcache.layer_file_digest(LAYER, "pkg/lib.so")
    (first,) = auditcache.scan_known([("pkg/lib.so", lib, digest)])
    # Another file's bytes at the same place: the digest names the old content, so the kept answer stands
    shutil.copy(binaries["sm_90"], lib)
    (again,) = auditcache.scan_known([("pkg/lib.so", lib, digest)])
    assert again.fatbin == first.fatbin and again.path == "pkg/lib.so"
    # Another digest (another layer) is read from the file
    (other,) = auditcache.scan_known(
        [("pkg/lib.so", lib, auditcache.layer_file_digest("sha256:" + "b" * 64, "pkg/lib.so"))]
    )
    assert other.fatbin == read_fatbin_file(binaries["sm_90"]) != first.fatbin
    # A file without device code is kept as such; an unreadable one is reported and not kept
    host = tmp_path / "host.so"
    shutil.copy(shutil.which("true") or "/bin/true", host)
    none = auditcache.layer_file_digest(LAYER, "bin/true")
    assert auditcache.scan_known([("bin/true", host, none)]) == []
    assert auditcache.load(none) is None
    broken = tmp_path / "broken.so"
    broken.write_bytes(binaries["mix_so"].read_bytes()[:100])  # an ELF header whose sections are gone
    bad = auditcache.layer_file_digest(LAYER, "pkg/broken.so")
    (unreadable,) = auditcache.scan_known([("pkg/broken.so", broken, bad)])
    assert unreadable.fatbin is None and "pkg/broken.so" in unreadable.error
    assert auditcache.load(bad) is auditcache.MISS


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: "{",  # a torn or foreign file
        lambda data: json.dumps({**data, "version": data["version"] + 1}),  # another reader's answer
        lambda data: json.dumps(
            {**data, "containers": [[0, 1, ".nv_fatbin", [["sass", 121, "z", "none", 0, 64, 1, 1, 0, ""]]]]}
        ),
        lambda data: json.dumps(
            {**data, "containers": [[0, 1, ".nv_fatbin", [["sass", -1, "", "none", 0, 64, 1, 1, 0, ""]]]]}
        ),
        lambda data: json.dumps({**data, "format": "pe"}),
        lambda data: json.dumps({"version": data["version"]}),
    ],
)
def test_a_damaged_entry_is_ignored_and_rewritten(binaries: dict[str, Path], cache: Path, damage) -> None:
    digest = auditcache.layer_file_digest(LAYER, "pkg/_C.so")
    want = read_fatbin_file(binaries["mix_zstd"])
    auditcache.scan_known([("pkg/_C.so", binaries["mix_zstd"], digest)])
    (entry,) = _entries(cache)
    entry.write_text(damage(json.loads(entry.read_text())))
    assert auditcache.load(digest) is auditcache.MISS
    (found,) = auditcache.scan_known([("pkg/_C.so", binaries["mix_zstd"], digest)])
    assert found.fatbin == want and auditcache.load(digest) == want


def test_the_reader_version_is_part_of_the_key(
    binaries: dict[str, Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = auditcache.layer_file_digest(LAYER, "pkg/_C.so")
    auditcache.scan_known([("pkg/_C.so", binaries["mix_so"], digest)])
    monkeypatch.setattr(auditcache, "READER_VERSION", auditcache.READER_VERSION + 1)
    assert auditcache.load(digest) is auditcache.MISS  # a newer reader never takes an older one's answer
    auditcache.scan_known([("pkg/_C.so", binaries["mix_so"], digest)])
    assert len(_entries(cache)) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts and trusted.* xattrs need root (CI is root)")
def test_the_scoped_audit_of_layers_is_the_full_audit_of_the_libraries_in_scope(
    binaries: dict[str, Path], cache: Path, tmp_path: Path
) -> None:
    low, mid, top = (tmp_path / "store" / n for n in "012")
    for layer, rel, name in (
        (low, "venv/vllm/_C.abi3.so", "sm_90"),  # replaced by the top layer's
        (low, "venv/vllm/_moe_C.abi3.so", "mix_zstd"),
        (low, "old/vllm/_C.abi3.so", "mix_so"),  # deleted by the middle layer's whiteout of old/
        (low, "venv/torch/lib/libtorch_cuda.so", "embedded"),
        (top, "venv/vllm/_C.abi3.so", "mix_so"),
        (top, "venv/other/_C.so", "sm_90"),  # outside the scope
    ):
        (layer / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(binaries[name], layer / rel)
    mid.mkdir(parents=True)
    os.mknod(mid / "old", 0o600 | 0o020000, os.makedev(0, 0))
    layers, digests = [low, mid, top], ["sha256:" + c * 64 for c in "123"]
    only = ["vllm/_C*.so", "vllm/_moe_C*.so", "torch/lib/libtorch_cuda.so"]
    scoped = imagefs.audit_layers("img", layers, digests, "sm_121", only, only)
    tree = imagefs.read_layers(layers, "img")
    full = imagefs.audit_layers("img", layers, digests, "sm_121", only, None)
    in_scope = [lib for lib in full.extra["libraries"] if lib["path"] != "venv/other/_C.so"]
    assert scoped.extra["libraries"] == in_scope and len(in_scope) == 3
    assert [c.to_dict() | {"duration_s": 0} for c in scoped.checks] == [
        c.to_dict() | {"duration_s": 0} for c in full.checks
    ]
    summary = scoped.extra["summary"]
    # Every regular file of the layers is counted by name, those the upper layers hide (2 here) too
    assert summary["files_scanned"] == len(tree.files) + 2 == 6 and summary["not_opened"] == 6 - 3
    assert len(_entries(cache)) == 3  # one kept answer per library opened
    # Another image sharing these layers: nothing is read again (a library's bytes changed behind the cache's
    # back would show, as the layer digest promises they cannot)
    shutil.copy(binaries["sm_90"], top / "venv/vllm/_C.abi3.so")
    again = imagefs.audit_layers("img2", layers, digests, "sm_121", only, only)
    assert again.extra["libraries"] == scoped.extra["libraries"]
    # No digest per layer: every library is read
    fresh = imagefs.audit_layers("img3", layers, digests[:2], "sm_121", only, only)
    assert fresh.extra["libraries"] != scoped.extra["libraries"]

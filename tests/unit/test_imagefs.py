"""Layer directories merged by overlayfs' rules, the size report's duplicate rule, the torch-index check.

Whiteouts are real character devices 0/0 and opaque directories carry the real trusted.overlay.opaque
attribute, as the engine's overlay2 store writes them: making them needs root (CI runs as root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkforge.errors import RecipeError
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.verify import imagefs, size

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="whiteouts and trusted.* xattrs need root (CI is root)"
)


def _write(root: Path, rel: str, data: bytes = b"x") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _whiteout(root: Path, rel: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o600 | 0o020000, os.makedev(0, 0))


@needs_root
def test_layers_merge_with_whiteouts_opaque_dirs_and_links(tmp_path: Path) -> None:
    low, mid, top = (tmp_path / n for n in ("0", "1", "2"))
    _write(low, "usr/lib/libkeep.so", b"a" * 10)
    _write(low, "usr/lib/libgone.so", b"b" * 20)
    _write(low, "pkg/old/one.py", b"c" * 30)
    _write(low, "pkg/old/two.py", b"d" * 40)
    _write(low, "opaque/lower.txt", b"e" * 50)
    _write(low, "replaced.bin", b"f" * 60)
    _whiteout(mid, "usr/lib/libgone.so")
    _whiteout(mid, "pkg/old")  # a whole directory deleted
    (mid / "opaque").mkdir(parents=True)
    os.setxattr(mid / "opaque", imagefs.OPAQUE_XATTR, b"y")
    _write(mid, "opaque/upper.txt", b"g" * 5)
    _write(top, "replaced.bin", b"h" * 6)
    first = _write(top, "hard/a.so", b"i" * 7)
    os.link(first, top / "hard/b.so")
    (top / "link.so").symlink_to("usr/lib/libkeep.so")

    tree = imagefs.read_layers([low, mid, top], "test")

    visible = {f.path: f.size for f in tree.files}
    assert visible == {
        "usr/lib/libkeep.so": 10,
        "opaque/upper.txt": 5,
        "replaced.bin": 6,
        "hard/a.so": 7,  # its hard link b.so is the same file, listed once as the export does
    }
    assert [s.bytes for s in tree.layers] == [210, 5, 13]  # a hard link's bytes count once
    assert [s.hidden_bytes for s in tree.layers] == [200, 0, 0]  # deleted, hidden by opaque, overwritten


def _layers(tmp_path: Path) -> list[Path]:
    low, mid, top = (tmp_path / n for n in ("0", "1", "2"))
    _write(low, "usr/lib/libkeep.so", b"a" * 10)
    _write(low, "usr/lib/libgone.so", b"b" * 20)
    _write(low, "opaque/lower.txt", b"e" * 50)
    _whiteout(mid, "usr/lib/libgone.so")
    (mid / "opaque").mkdir(parents=True)
    os.setxattr(mid / "opaque", imagefs.OPAQUE_XATTR, b"y")
    _write(mid, "opaque/upper.txt", b"g" * 5)
    first = _write(top, "hard/a.so", b"i" * 7)
    os.link(first, top / "hard/b.so")
    return [low, mid, top]


def _view(tree: imagefs.ImageTree) -> tuple[object, ...]:
    return tuple((f.path, f.size, f.layer, f.location, f.inode, f.links) for f in tree.files), tuple(
        (s.files, s.bytes, s.hidden_bytes) for s in tree.layers
    )


@needs_root
def test_layer_listings_are_kept_by_digest_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARKFORGE_CACHE", str(tmp_path / "cache"))
    layers = _layers(tmp_path / "store")
    digests = ["sha256:" + c * 64 for c in "abc"]
    walked = imagefs.read_layers(layers, "test")  # no digests: nothing kept
    assert not (tmp_path / "cache").exists()
    first = imagefs.read_layers(layers, "test", digests)
    assert _view(first) == _view(walked)
    assert len(list((tmp_path / "cache" / "layers").glob("*.json"))) == 3
    # A layer never changes once written: the second read lists nothing (a file removed behind its back stays)
    (layers[0] / "usr/lib/libkeep.so").unlink()
    again = imagefs.read_layers(layers, "test", digests)
    assert _view(again) == _view(first)
    # Another directory (the image pulled again) or another digest is listed afresh
    assert "usr/lib/libkeep.so" not in {
        f.path for f in imagefs.read_layers(layers, "test", digests[::-1]).files
    }
    moved = tmp_path / "moved"
    shutil.copytree(layers[0], moved)
    assert "usr/lib/libkeep.so" not in {
        f.path for f in imagefs.read_layers([moved, layers[1], layers[2]], "test", digests).files
    }
    # A damaged listing is listed again, and digests that do not pair with the layers are not used
    for cached in (tmp_path / "cache" / "layers").glob("*.json"):
        cached.write_text("{")
    assert _view(imagefs.read_layers(layers, "test", digests)) != _view(first)
    assert len(imagefs.read_layers(layers, "test", digests[:2]).files) == len(again.files) - 1


def test_text_files_are_never_opened_by_the_audit() -> None:
    assert not imagefs.may_carry_device_code("opt/venv/lib/python3.11/site-packages/vllm/__init__.py")
    assert not imagefs.may_carry_device_code("x/__pycache__/a.cpython-311.pyc")
    assert imagefs.may_carry_device_code("torch/lib/libtorch_cuda.so")
    assert imagefs.may_carry_device_code("nvidia/cu13/bin/ptxas")
    assert imagefs.may_carry_device_code("kernels/gemm.cubin")


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("nvidia/cu13/lib/libcublasLt.so.13", "libcublasLt"),
        ("torch.libs/libgomp-a34b3233.so.1", "libgomp"),
        ("triton/backends/nvidia/lib/cupti/libcupti.so.2025.1.1", "libcupti"),
        ("triton/backends/nvidia/bin/ptxas", "ptxas"),
        ("vllm/_C.abi3.so", None),
        ("numpy/core/_multiarray.cpython-311-x86_64-linux-gnu.so", None),
    ],
)
def test_library_names(path: str, name: str | None) -> None:
    assert size.library_name(path) == name


@needs_root
def test_duplicates_flag_cuda_libraries_at_two_paths(tmp_path: Path) -> None:
    layer = tmp_path / "0"
    _write(layer, "venv/nvidia/cu13/lib/libcupti.so.13", b"cupti" * 100)
    _write(layer, "venv/triton/lib/cupti/libcupti.so", b"cupti" * 100)
    _write(layer, "venv/a.libs/libz-11111111.so.1", b"z1")
    _write(layer, "venv/b.libs/libz-22222222.so.1", b"z22")
    _write(layer, "venv/nvidia/cu13/lib/libcudart.so.13", b"cudart 13")
    _write(
        layer, "venv/video.libs/libcudart-c64a25f3.so.12.3.101", b"cudart 12"
    )  # another library: CUDA 12's
    _write(layer, "venv/nvidia/cu13/bin/ptxas", b"p")
    (layer / "venv/triton/bin").mkdir(parents=True)
    (layer / "venv/triton/bin/ptxas").symlink_to("../../nvidia/cu13/bin/ptxas")  # a link is not a copy
    tree = imagefs.read_layers([layer], "test")
    found = {d.name: d for d in size.duplicates(tree)}
    assert set(found) == {"libcupti", "libz"}
    assert found["libcupti"].cuda and found["libcupti"].identical and found["libcupti"].wasted_bytes == 500
    assert not found["libz"].cuda and not found["libz"].identical


def test_torch_index_must_match_the_recipe_cuda(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO_ROOT / "recipes" / "vllm-qwen35.yaml").read_text())
    data["extends"] = str(REPO_ROOT / "recipes" / "_gb10.yaml")
    data["components"]["torch"]["index"] = "https://download.pytorch.org/whl/cu129"
    path = tmp_path / "wrong-index.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RecipeError, match=r"cu129 index but the recipe's cuda is 13\.0.*whl/cu130"):
        load_recipe(str(path))


def test_slim_venv_script_is_shipped_and_valid_python() -> None:
    script = REPO_ROOT / "dockerfiles" / "files" / "slim-venv.py"
    python = shutil.which("python3") or "python3"
    assert subprocess.run([python, str(script), "--help"], capture_output=True).returncode == 0


@needs_root
@pytest.mark.parametrize(
    "globs",
    [["**"], ["usr/lib/lib*.so"], ["opaque/*.txt"], ["replaced.bin", "gone/**"], ["**/*.so"], ["a.so"], []],
)
def test_the_scoped_read_sees_what_the_full_merge_sees(tmp_path: Path, globs: list[str]) -> None:
    """Whiteouts (of a file, of a directory), an opaque directory, a file over a directory, a directory and a link
    over a file, hard links: the files in scope, merged from the kept files alone, are the full merge's."""
    from sparkforge.audit.coverage import name_filter, scope_filter

    layers = _layers(tmp_path)
    low, mid, top = layers
    _write(low, "gone/deep/x.so", b"x" * 3)
    _write(low, "was_dir/inner.so", b"y" * 4)
    _write(low, "was_file.so", b"z" * 5)
    _write(low, "linked.so", b"l" * 6)
    _write(mid, "gone/deep/y.so", b"x" * 7)
    _whiteout(top, "gone")
    _write(top, "was_dir", b"now a file")  # a file where a directory was: its contents are gone
    _write(top, "was_file.so/inside.so", b"now a directory")
    (top / "linked.so").symlink_to("usr/lib/libkeep.so")
    keep = scope_filter(globs)
    full = [
        (f.path, f.size, f.layer, f.inode) for f in imagefs.read_layers(layers, "t").files if keep(f.path)
    ]
    files, total = imagefs.read_layers_scoped(layers, keep)
    assert [(f.path, f.size, f.layer, f.inode) for f in files] == full
    names = name_filter(globs)  # the audit's first test, on base names alone: the same files
    if names is not None:
        named, _ = imagefs.read_layers_scoped(layers, keep, names)
        assert [(f.path, f.size, f.layer, f.inode) for f in named] == full
    assert total == sum(1 for layer in layers for p in layer.rglob("*") if p.is_file() and not p.is_symlink())
    # A hard link is listed once, under its first name in scope (the full merge's first name may be out of it)
    (only,) = imagefs.read_layers_scoped(layers, scope_filter(["b.so"]))[0]
    assert only.path == "hard/b.so" and only.inode[1] == (top / "hard/a.so").stat().st_ino

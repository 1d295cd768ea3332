"""dockerfiles/files/slim-venv.py, run as the image runs it, on a site-packages laid out like the real one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sparkforge.recipe.loader import REPO_ROOT

SCRIPT = REPO_ROOT / "dockerfiles" / "files" / "slim-venv.py"


def _write(root: Path, rel: str, data: bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_slim_venv_keeps_one_copy_and_leaves_lower_layers_alone(tmp_path: Path) -> None:
    site, toolkit = tmp_path / "site", tmp_path / "site" / "nvidia" / "cu13"
    old = _write(site, "triton_old/backends/nvidia/bin/ptxas", b"older layer")  # written before the step
    time.sleep(0.05)
    stamp = tmp_path / "step-began"
    stamp.touch()
    time.sleep(0.05)
    _write(toolkit, "bin/ptxas", b"ptxas 13")
    _write(toolkit, "lib/libcupti.so.13", b"cupti 13" * 10_000)
    _write(site, "nvidia_cutlass_dsl/cu12/lib/libcute_dsl_runtime.so", b"cu12")
    _write(site, "nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so", b"cu13")
    _write(site, "cutlass/_mlir_libs/_cutlass_ir.cu12.cpython-311-x86_64-linux-gnu.so", b"ir12")
    _write(site, "cutlass/_mlir_libs/_cutlass_ir.cu13.cpython-311-x86_64-linux-gnu.so", b"ir13")
    _write(site, "triton/backends/nvidia/bin/ptxas", b"bundled ptxas 12.8")
    _write(site, "triton/backends/nvidia/bin/ptxas-blackwell", b"bundled ptxas 13.3")
    _write(site, "triton/backends/nvidia/bin/nvdisasm", b"kept")
    _write(site, "triton/backends/nvidia/lib/cupti/libcupti.so.2025.1.1", b"cupti 12" * 10_000)
    _write(site, "triton/backends/nvidia/lib/cupti/libcupti_static.a", b"archive")
    first = _write(site, "z3/lib/libz3.so", b"z" * 100_000)
    _write(site, "z3/lib/libz3.so.4.15", b"z" * 100_000)

    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--site", str(site), "--since", str(stamp), "--cuda", "13.0",
         "--toolkit", str(toolkit)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip

    assert not (site / "nvidia_cutlass_dsl/cu12").exists()
    assert (site / "nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so").read_bytes() == b"cu13"
    assert not (site / "cutlass/_mlir_libs/_cutlass_ir.cu12.cpython-311-x86_64-linux-gnu.so").exists()
    assert (site / "cutlass/_mlir_libs/_cutlass_ir.cu13.cpython-311-x86_64-linux-gnu.so").exists()
    for name in ("ptxas", "ptxas-blackwell"):
        tool = site / "triton/backends/nvidia/bin" / name
        assert tool.is_symlink() and tool.read_bytes() == b"ptxas 13"
    assert not (site / "triton/backends/nvidia/bin/nvdisasm").is_symlink()
    cupti = site / "triton/backends/nvidia/lib/cupti/libcupti.so.2025.1.1"
    assert cupti.is_symlink() and os.readlink(cupti) == str(toolkit / "lib/libcupti.so.13")
    assert not (site / "triton/backends/nvidia/lib/cupti/libcupti_static.a").exists()
    assert (site / "z3/lib/libz3.so.4.15").stat().st_ino == first.stat().st_ino  # one copy, two names
    assert (
        not old.is_symlink() and old.read_bytes() == b"older layer"
    )  # a lower layer's file is never rewritten
    assert "slim-venv: cu12 builds" in done.stdout and "identical copies" in done.stdout


def _load_slim():
    import importlib.util

    spec = importlib.util.spec_from_file_location("slim_venv", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _real_library(tmp_path: Path, compiler: str, code: str) -> tuple[Path, Path, Path]:
    """A site-packages with one library compiled (with debug info) after its step began: (site, stamp, library)."""
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    stamp = tmp_path / "step-began"
    stamp.touch()
    time.sleep(0.05)
    source = tmp_path / "answer.c"
    source.write_text(code)
    library = site / "pkg" / "libanswer.so"
    subprocess.run([compiler, "-g", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    return site, stamp, library


def test_strip_keeps_libraries_loadable_and_refuses_a_broken_layout(tmp_path: Path) -> None:
    import ctypes
    import shutil
    import struct

    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None or shutil.which("strip") is None:
        import pytest

        pytest.skip("gcc and binutils' strip are needed to make and strip a real library")
    slim = _load_slim()
    code = "static int hidden(void) { return 42; }\nint answer(void) { return hidden(); }\n"
    site, stamp, library = _real_library(tmp_path, compiler, code)
    before = library.stat().st_size
    subprocess.run(
        [sys.executable, str(SCRIPT), "--site", str(site), "--since", str(stamp), "--cuda", "13.0", "--strip"],
        check=True, capture_output=True,
    )  # fmt: skip
    assert library.stat().st_size < before  # debug info and local symbols gone
    assert ctypes.CDLL(str(library)).answer() == 42  # the dynamic symbol stays and the library loads
    assert slim.loadable(library)
    data = bytearray(library.read_bytes())
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for index in range(phnum):
        at = phoff + index * phentsize
        if struct.unpack_from("<I", data, at)[0] == 1 and struct.unpack_from("<Q", data, at + 8)[0] > 0:
            struct.pack_into(
                "<Q", data, at + 8, struct.unpack_from("<Q", data, at + 8)[0] + 8
            )  # shift an offset
            break
    broken = tmp_path / "broken.so"
    broken.write_bytes(bytes(data))
    assert not slim.loadable(broken)


def test_strip_refreshes_record_and_makes_two_compiles_identical(tmp_path: Path) -> None:
    """Two compiles whose sources differ only in their file name (as nvcc's `tmpxft_<pid>_...` temp files do):
    after --strip the libraries and their dists' RECORDs are byte-identical, and RECORD matches the files."""
    import base64
    import hashlib
    import shutil

    import pytest

    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None or shutil.which("strip") is None:
        pytest.skip("gcc and binutils' strip are needed to make and strip a real library")
    code = "static int hidden(void) { return 42; }\nint answer(void) { return hidden(); }\n"
    other = b"print('kept')\n"
    sites = []
    for run in (1, 2):
        site = tmp_path / f"site{run}"
        stamp = tmp_path / f"began{run}"
        stamp.touch()
        time.sleep(0.05)
        source = _write(tmp_path, f"tmp{run}/tmpxft_0000{run}_answer.c", code.encode())
        library = site / "pkg" / "libanswer.so"
        library.parent.mkdir(parents=True)
        subprocess.run([compiler, "-shared", "-fPIC", "-O2", str(source), "-o", str(library)], check=True)
        _write(site, "pkg/kept.py", other)
        record = (
            "".join(
                f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\r\n"
                for name, data in (("pkg/kept.py", other), ("pkg/libanswer.so", library.read_bytes()))
            )
            + "pkg-1.0.dist-info/RECORD,,\r\n"
        )
        _write(site, "pkg-1.0.dist-info/RECORD", record.encode())
        subprocess.run(
            [sys.executable, str(SCRIPT), "--site", str(site), "--since", str(stamp), "--cuda", "13.0", "--strip"],
            check=True, capture_output=True,
        )  # fmt: skip
        sites.append(site)
    first, second = sites
    before = (tmp_path / "tmp1" / "tmpxft_00001_answer.c").name
    assert before.encode() not in (first / "pkg" / "libanswer.so").read_bytes()  # the temp name is gone
    assert (first / "pkg" / "libanswer.so").read_bytes() == (second / "pkg" / "libanswer.so").read_bytes()
    records = [(s / "pkg-1.0.dist-info" / "RECORD").read_bytes() for s in sites]
    assert records[0] == records[1]
    lines = records[0].decode().split("\r\n")
    data = (first / "pkg" / "libanswer.so").read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert lines[1] == f"pkg/libanswer.so,sha256={digest},{len(data)}"  # the stripped bytes, pip's form
    assert lines[0].startswith("pkg/kept.py,sha256=") and lines[2] == "pkg-1.0.dist-info/RECORD,,"


def test_strip_keeps_a_library_whose_mapped_layout_strip_changed(tmp_path: Path) -> None:
    """GNU strip rewrote NVIDIA's BOLT-processed aarch64 libcudnn.so.9 into overlapping segments (the loader:
    "cannot change memory protections"), offsets still congruent. A real strip keeps every program header; a strip
    that moves one (here: the real strip, then one PT_LOAD's address moved by a page) leaves the library as shipped."""
    import shutil

    import pytest

    compiler, real_strip = shutil.which("gcc") or shutil.which("cc"), shutil.which("strip")
    if compiler is None or real_strip is None:
        pytest.skip("gcc and binutils' strip are needed to make and strip a real library")
    slim = _load_slim()
    site, stamp, library = _real_library(tmp_path, compiler, "int answer(void) { return 42; }\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shipped = library.read_bytes()
    copy = tmp_path / "copy.so"
    copy.write_bytes(shipped)
    subprocess.run([real_strip, "--strip-unneeded", str(copy)], check=True)
    assert slim.load_layout(copy) == slim.load_layout(library)  # what a working strip does
    mover = bin_dir / "strip"
    mover.write_text(
        f"#!{sys.executable}\nimport struct, subprocess, sys\n"
        f"subprocess.run([{real_strip!r}, *sys.argv[1:]], check=True)\n"
        "data = bytearray(open(sys.argv[-1], 'rb').read())\n"
        "phoff = struct.unpack_from('<Q', data, 0x20)[0]\n"
        "size, count = struct.unpack_from('<HH', data, 0x36)\n"
        "at = [phoff + i * size for i in range(count) if struct.unpack_from('<I', data, phoff + i * size)[0] == 1][-1]\n"
        "struct.pack_into('<Q', data, at + 16, struct.unpack_from('<Q', data, at + 16)[0] - 0x1000)\n"
        "open(sys.argv[-1], 'wb').write(data)\n"
    )
    mover.chmod(0o755)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--site", str(site), "--since", str(stamp), "--cuda", "13.0", "--strip"],
        check=True, capture_output=True, text=True, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert library.read_bytes() == shipped  # restored exactly
    assert "left unstripped" in done.stdout
    assert not list(site.rglob("*.slim-venv-orig"))

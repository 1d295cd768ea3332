"""Audit targets (directory, wheel, tar stream, tar file), `--require` globs, the report and the table."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from audit_fixtures import build_fixtures, nvcc_available

from sparkforge.audit.coverage import format_audit_table, glob_matches
from sparkforge.audit.fatbin import parse_buffer
from sparkforge.audit.scan import audit_tar_stream, audit_target, parse_stream
from sparkforge.report import load_report

IMAGE_PREFIX = "usr/local/lib/python3.12/dist-packages/"


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("vllm/_C*.so", "vllm/_C.abi3.so", True),
        ("vllm/_C*.so", "vllm/_C_stable_libtorch.abi3.so", True),
        ("vllm/_C*.so", IMAGE_PREFIX + "vllm/_C.abi3.so", True),
        ("vllm/_C*.so", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", False),
        ("vllm/_C*.so", "myvllm/_C.abi3.so", False),  # suffixes start at a `/`
        ("vllm/_C*.so", "vllm/_C.abi3.so.bak", False),
        ("/vllm/_C*.so", "vllm/_C.abi3.so", True),  # a leading `/` anchors at the root
        ("/vllm/_C*.so", IMAGE_PREFIX + "vllm/_C.abi3.so", False),
        ("vllm/**/*.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", True),
        ("vllm/**/_C*.so", "vllm/_C.abi3.so", True),
        ("**/_qutlass_C*.so", IMAGE_PREFIX + "vllm/_qutlass_C.abi3.so", True),
        ("*.so", "torch/lib/libtorch_cuda.so", True),
        ("lib?orch_cuda.so", "torch/lib/libtorch_cuda.so", True),
        ("lib[!t]*.so", "torch/lib/libtorch_cuda.so", False),
        ("lib[a-t]*.so", "torch/lib/libtorch_cuda.so", True),
        ("a+b(c).so", "x/a+b(c).so", True),  # regex characters are literal
    ],
)
def test_glob_matches_at_path_boundaries(pattern: str, path: str, matches: bool) -> None:
    assert glob_matches(pattern, path) is matches


needs_nvcc = pytest.mark.skipif(
    not nvcc_available(), reason="nvcc 13 not found at /usr/local/cuda-13.0/bin/nvcc"
)

# The layout of a small vLLM-like package, built from the compiled fixtures.
LAYOUT = {
    "vllm/_C.abi3.so": "mix_so",  # native everywhere
    "vllm/_moe_C.abi3.so": "sm_120f",  # family on GB10
    "vllm/_qutlass_C.abi3.so": "sm_100f",  # nothing runs on GB10
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "ptx_90",  # JIT only
    "vllm/third_party/libembedded.so": "embedded",
}


@pytest.fixture(scope="module")
def compiled() -> dict[str, Path]:
    if not nvcc_available():
        pytest.skip("nvcc 13 not found at /usr/local/cuda-13.0/bin/nvcc")
    return build_fixtures()


def _files(compiled: dict[str, Path]) -> Iterator[tuple[str, bytes]]:
    for rel, name in LAYOUT.items():
        yield rel, compiled[name].read_bytes()
    yield "vllm/__init__.py", b"# python\n"
    yield "vllm/cumem_allocator.abi3.so", Path("/bin/ls").read_bytes()  # host-only ELF
    yield "vllm/empty.so", b""


@pytest.fixture
def tree(tmp_path: Path, compiled: dict[str, Path]) -> Path:
    root = tmp_path / "site"
    for rel, data in _files(compiled):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "vllm" / "_C.so").symlink_to("_C.abi3.so")  # links are not audited twice
    return root


@pytest.fixture
def wheel(tmp_path: Path, compiled: dict[str, Path]) -> Path:
    path = tmp_path / "vllm-0.0.0-cp38-abi3-linux_aarch64.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for rel, data in _files(compiled):
            archive.writestr(rel, data)
        archive.writestr("vllm-0.0.0.dist-info/RECORD", "")
    return path


def _image_tar(compiled: dict[str, Path]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for rel, data in [*_files(compiled), ("usr/bin/python3", Path("/bin/ls").read_bytes())]:
            name = "./" + (rel if rel.startswith("usr/") else IMAGE_PREFIX + rel)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("./" + IMAGE_PREFIX + "vllm/_C.so")
        link.type, link.linkname = tarfile.SYMTYPE, "_C.abi3.so"
        archive.addfile(link)
    return out.getvalue()


def _paths(report: object) -> list[str]:
    return [lib["path"] for lib in report.extra["libraries"]]  # type: ignore[attr-defined]


@needs_nvcc
def test_directory_report_shape(tree: Path) -> None:
    report = audit_target(tree, gpu="sm_121", require=["vllm/_C*.so"])
    data = json.loads(json.dumps(report.to_dict()))
    assert set(data) == {"tool", "version", "command", "recipe", "subject", "status", "checks", "target",
                         "libraries", "summary"}  # fmt: skip
    assert data["command"] == "audit" and data["target"] == "sm_121" and data["status"] == "passed"
    by_path = {lib["path"]: lib for lib in data["libraries"]}
    assert sorted(by_path) == sorted(LAYOUT)
    c = by_path["vllm/_C.abi3.so"]
    assert set(c) == {"path", "entries", "verdict", "required", "units", "stranded_units"}
    assert c["entries"] == {"sass_90": 2, "sass_120": 2, "sass_121a": 2, "ptx_90": 1}
    assert c["verdict"] == "native" and c["required"] is True
    assert c["units"] == {"native": 2, "family": 0, "jit": 0, "none": 0}
    assert by_path["vllm/_moe_C.abi3.so"]["verdict"] == "family"
    assert by_path["vllm/_qutlass_C.abi3.so"] | {"units": None} == {
        "path": "vllm/_qutlass_C.abi3.so", "entries": {"sass_100f": 1}, "verdict": "none", "required": False,
        "units": None, "stranded_units": 0,
    }  # fmt: skip
    assert by_path["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]["verdict"] == "jit"
    assert by_path["vllm/third_party/libembedded.so"]["entries"] == {"sass_120": 1, "ptx_90": 1}
    assert data["summary"]["libraries"] == 5
    assert data["summary"]["entries"] == 7 + 1 + 1 + 1 + 2
    assert data["summary"]["by_verdict"] == {"native": 2, "family": 1, "jit": 1, "none": 1}
    assert data["summary"]["files_scanned"] == len(LAYOUT) + 3
    (check,) = data["checks"]
    assert check["name"] == "require:vllm/_C*.so" and check["status"] == "passed"


@needs_nvcc
def test_verdicts_follow_the_target(tree: Path) -> None:
    hopper = {lib["path"]: lib["verdict"] for lib in audit_target(tree, gpu="sm_90").extra["libraries"]}
    assert hopper == {
        "vllm/_C.abi3.so": "native",
        "vllm/_moe_C.abi3.so": "none",
        "vllm/_qutlass_C.abi3.so": "none",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "jit",
        "vllm/third_party/libembedded.so": "jit",
    }


@needs_nvcc
def test_wheel_and_directory_agree(tree: Path, wheel: Path) -> None:
    from_dir = audit_target(tree, require=["vllm/_qutlass_C*.so"])
    from_wheel = audit_target(wheel, require=["vllm/_qutlass_C*.so"])
    assert from_wheel.extra["libraries"] == from_dir.extra["libraries"]
    assert from_wheel.extra["summary"]["by_verdict"] == from_dir.extra["summary"]["by_verdict"]
    assert [c.status for c in from_wheel.checks] == ["failed"]
    assert "no kernel runs on sm_121 in vllm/_qutlass_C.abi3.so (sass_100f)" in from_wheel.checks[0].reason


@needs_nvcc
def test_image_tar_stream_paths_and_suffix_globs(tree: Path, compiled: dict[str, Path]) -> None:
    data = _image_tar(compiled)
    read_fd, write_fd = os.pipe()  # a pipe, like `docker export` stdout: no seeking possible

    def feed() -> None:
        with os.fdopen(write_fd, "wb") as sink:
            sink.write(data)

    writer = threading.Thread(target=feed)
    writer.start()
    with os.fdopen(read_fd, "rb") as source:
        report = audit_tar_stream(source, subject="image:test", require=["vllm/_C*.so", "vllm/_moe_C*.so"])
    writer.join()
    assert report.subject == "image:test"
    assert sorted(_paths(report)) == sorted(IMAGE_PREFIX + rel for rel in LAYOUT)
    assert [c.status for c in report.checks] == ["passed", "passed"]
    from_dir = audit_target(tree, require=["vllm/_C*.so", "vllm/_moe_C*.so"])
    strip = [{**lib, "path": lib["path"].removeprefix(IMAGE_PREFIX)} for lib in report.extra["libraries"]]
    assert strip == from_dir.extra["libraries"]


@needs_nvcc
def test_tar_file_target(tmp_path: Path, compiled: dict[str, Path]) -> None:
    path = tmp_path / "rootfs.tar"
    path.write_bytes(_image_tar(compiled))
    report = audit_target(path, gpu="sm_121", require=["/usr/bin/python3"])
    assert len(report.extra["libraries"]) == len(LAYOUT)
    (check,) = report.checks
    assert check.status == "failed" and "no library with device code matches" in check.reason


@needs_nvcc
def test_require_semantics(tree: Path) -> None:
    report = audit_target(
        tree, require=["vllm/_C*.so", "vllm/vllm_flash_attn/*.so", "vllm/_qutlass_C*.so", "vllm/_missing*.so"]
    )
    checks = {c.name: c for c in report.checks}
    assert checks["require:vllm/_C*.so"].status == "passed"
    jit = checks["require:vllm/vllm_flash_attn/*.so"]
    assert jit.status == "passed" and jit.reason.startswith("JIT only: slow first start")
    assert checks["require:vllm/_qutlass_C*.so"].status == "failed"
    assert checks["require:vllm/_missing*.so"].status == "failed"
    assert report.status == "failed"
    required = {lib["path"] for lib in report.extra["libraries"] if lib["required"]}
    assert required == {
        "vllm/_C.abi3.so",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
        "vllm/_qutlass_C.abi3.so",
    }


@needs_nvcc
def test_no_require_gives_one_passing_coverage_check(tree: Path) -> None:
    (check,) = audit_target(tree).checks
    assert check.name == "coverage" and check.status == "passed"
    assert check.reason.startswith(
        "5 libraries with device code (12 entries) on sm_121: native 2, family 1, jit 1"
    )


@needs_nvcc
def test_table_and_json_round_trip(tree: Path, tmp_path: Path) -> None:
    report = audit_target(tree, require=["vllm/_qutlass_C*.so"])
    table = format_audit_table(report)
    lines = table.splitlines()
    assert lines[0].split() == ["library", "entries", "verdict", "units", "n/f/j/x"]
    row = next(line for line in lines if line.startswith("vllm/_C.abi3.so "))
    assert row.split() == [
        "vllm/_C.abi3.so",
        "sass",
        "90:2",
        "120:2",
        "121a:2",
        "|",
        "ptx",
        "90:1",
        "native",
        "2/0/0/0",
    ]
    assert any(line.startswith("vllm/_qutlass_C.abi3.so *") and "none" in line for line in lines)
    assert lines[-1].startswith("sm_121: 5 libraries, 12 entries; native 2, family 1, jit 1, none 1; FAILED")
    path = tmp_path / "audit.json"
    report.write_json(path)
    assert format_audit_table(load_report(path)) == table


@needs_nvcc
def test_many_files_in_parallel_match_serial(tmp_path: Path, compiled: dict[str, Path]) -> None:
    root = tmp_path / "many"
    for i in range(700):  # several pool batches
        sub = root / f"d{i % 7}"
        sub.mkdir(parents=True, exist_ok=True)
        if i % 50 == 0:
            shutil.copy(compiled["sm_121f"], sub / f"lib{i}.so")
        else:
            (sub / f"f{i}.py").write_text("x = 1\n")
    serial = audit_target(root, workers=1)
    parallel = audit_target(root, workers=4)
    assert parallel.extra["libraries"] == serial.extra["libraries"]
    assert len(parallel.extra["libraries"]) == 14
    assert parallel.extra["summary"]["files_scanned"] == 700


@needs_nvcc
def test_spooled_members_parse_like_in_memory(compiled: dict[str, Path]) -> None:
    data = compiled["mix_so"].read_bytes()
    stream = io.BytesIO(data)
    head = stream.read(4)
    spooled = parse_stream(head, stream, len(data), "mix_so", memory_limit=0)
    assert spooled == parse_buffer(data, "mix_so")


@needs_nvcc
def test_big_wheels_are_read_by_several_workers_alike(tmp_path: Path, compiled: dict[str, Path]) -> None:
    path = tmp_path / "many-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for i in range(600):  # more members than one pool task takes
            archive.writestr(f"pkg/m{i}.py", f"x = {i}\n")
        for name in ("mix_so", "sm_121f", "ptx_90", "embedded"):
            archive.write(compiled[name], f"pkg/lib_{name}.so")
    serial, parallel = audit_target(path, workers=1), audit_target(path, workers=3)
    assert parallel.extra["libraries"] == serial.extra["libraries"]
    assert len(parallel.extra["libraries"]) == 4 and parallel.extra["summary"]["files_scanned"] == 604

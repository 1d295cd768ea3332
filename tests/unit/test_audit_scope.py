"""The audit limited to the libraries a verdict needs: same checks, fewer files opened, in every target kind."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from test_audit_hostile import container, entry, fatbin_elf

from sparkforge.audit.coverage import format_audit_table
from sparkforge.audit.scan import audit_tar_stream, audit_target
from sparkforge.verify.kernel_origin import report_scope, selection_libraries

REQUIRED = ["pkg/_good*.so"]
FILES = {
    "pkg/_good.so": fatbin_elf(container(entry(arch=121))),
    "pkg/_other.so": fatbin_elf(container(entry(arch=90))),
    "pkg/_broken.so": fatbin_elf(container(entry(), size=1 << 40)),  # unreadable if ever opened
    "pkg/__init__.py": b"",
}


def _targets(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "site"
    for rel, data in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for rel, data in FILES.items():
            archive.writestr(rel, data)
    tar = tmp_path / "rootfs.tar"
    with tarfile.open(tar, "w") as archive:
        for rel, data in FILES.items():
            info = tarfile.TarInfo("./usr/lib/" + rel)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return {"directory": root, "wheel": wheel, "tar": tar}


@pytest.mark.parametrize("kind", ["directory", "wheel", "tar"])
def test_scope_opens_only_the_required_libraries(tmp_path: Path, kind: str) -> None:
    target = _targets(tmp_path)[kind]
    full = audit_target(target, require=REQUIRED)
    scoped = audit_target(target, require=REQUIRED, only=REQUIRED)
    full_paths = [lib["path"].removeprefix("usr/lib/") for lib in full.extra["libraries"]]
    assert full_paths == ["pkg/_good.so", "pkg/_other.so"] and full.extra["summary"]["unreadable"] == 1
    assert [lib["path"].removeprefix("usr/lib/") for lib in scoped.extra["libraries"]] == ["pkg/_good.so"]
    assert scoped.extra["summary"]["unreadable"] == 0  # the broken library was never opened
    assert [(c.name, c.status, c.reason) for c in scoped.checks] == [
        (c.name, c.status, c.reason) for c in full.checks
    ]
    assert scoped.extra["summary"]["scope"] == REQUIRED
    assert scoped.extra["summary"]["not_opened"] == len(FILES) - 1
    assert (
        "only the libraries the verdict needs were opened (pkg/_good*.so); 3 other files"
        in format_audit_table(scoped)
    )
    assert "scope" not in full.extra["summary"]


def test_a_required_library_outside_the_target_still_fails(tmp_path: Path) -> None:
    root = _targets(tmp_path)["directory"]
    report = audit_target(root, require=["pkg/_missing*.so"], only=["pkg/_missing*.so"])
    (check,) = report.checks
    assert check.status == "failed" and check.reason.startswith(
        "no library with device code matches 'pkg/_missing*.so' (every file it matches was opened);"
    )


def test_scope_of_a_tar_stream_skips_members_unread(tmp_path: Path) -> None:
    data = _targets(tmp_path)["tar"].read_bytes()
    report = audit_tar_stream(
        io.BytesIO(data), "image:x", require=["pkg/_broken*.so"], only=["pkg/_broken*.so"]
    )
    (check,) = report.checks  # the one library in scope is read, and its damage reported
    assert check.status == "failed" and "unreadable: usr/lib/pkg/_broken.so" in check.reason
    assert report.extra["summary"]["not_opened"] == len(FILES) - 1


def test_empty_scope_opens_nothing_and_never_passes(tmp_path: Path) -> None:
    report = audit_target(_targets(tmp_path)["directory"], only=[])
    assert report.extra["libraries"] == [] and report.status == "failed"
    assert report.extra["summary"]["not_opened"] == report.extra["summary"]["files_scanned"] == len(FILES)


SELECTION = {
    "layers": [
        {
            "layer": "attention",
            "selected": "FLASH_ATTN",
            "detail": "FA2",
            "candidates": [{"name": "FLASH_ATTN"}, {"name": "TRITON_ATTN"}, {"name": "TORCH_SDPA"}],
        },
        {"layer": "moe", "selected": "TRITON", "candidates": [{"name": "TRITON"}, {"name": "MARLIN"}]},
        {"layer": "linear", "selected": "CutlassFp8BlockScaledMMKernel", "candidates": []},
    ]
}


def test_report_scope_is_the_required_and_the_selected_kernels_libraries() -> None:
    assert selection_libraries(SELECTION) == (
        "torch/lib/libtorch_cuda.so",
        "vllm/_C*.so",
        "vllm/_moe_C*.so",
        "vllm/vllm_flash_attn/_vllm_fa2_C*.so",
    )  # FA3 is not named: vLLM chose FA2
    assert report_scope(["extra/lib*.so"], SELECTION) == ("extra/lib*.so", *selection_libraries(SELECTION))
    assert report_scope(["vllm/_C*.so"], None) == ("vllm/_C*.so",)
    assert report_scope([], None) is None  # nothing to limit to: every library


def test_a_wheels_kernel_report_opens_what_its_verdicts_need_unless_asked_for_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkforge.verify.kernels_markdown import render
    from sparkforge.verify.kernels_run import KernelsQuery, for_target

    monkeypatch.setenv("SPARKFORGE_CACHE", str(tmp_path / "cache"))
    wheel = str(_targets(tmp_path)["wheel"])
    scoped = for_target(wheel, "sm_121", REQUIRED).to_dict()
    full = for_target(wheel, "sm_121", REQUIRED, KernelsQuery(all_libraries=True)).to_dict()
    assert [lib["path"] for lib in scoped["libraries"]] == ["pkg/_good.so"]
    assert [lib["path"] for lib in full["libraries"]] == ["pkg/_good.so", "pkg/_other.so"]
    assert [(c["name"], c["status"]) for c in scoped["checks"]] == [
        (c["name"], c["status"]) for c in full["checks"]
    ]
    assert "Only the libraries the verdicts depend on were opened (`pkg/_good*.so`)" in render(scoped)
    assert "Only the libraries" not in render(full)
    assert len(list((tmp_path / "cache" / "kernels" / "audit").glob("*.json"))) == 2  # kept apart
    again = for_target(wheel, "sm_121", REQUIRED).to_dict()  # from the cache, scope and all
    assert again["libraries"] == scoped["libraries"] and again["summary"]["scope"] == REQUIRED


@pytest.mark.parametrize(
    "globs",
    [
        ["vllm/_C*.so", "vllm/_moe_C*.so", "torch/lib/libtorch_cuda.so"],
        ["/usr/lib/[a-c]?.so"],
        ["a/**/b*.so"],
        [],
    ],
)
def test_the_name_filter_passes_every_path_in_scope(globs: list[str]) -> None:
    from sparkforge.audit.coverage import name_filter, scope_filter

    paths = ["vllm/_C.abi3.so", "x/vllm/_moe_C.so", "vllm/_D.so", "torch/lib/libtorch_cuda.so", "usr/lib/ab.so",
             "lib/ab.so", "a/x/y/bz.so", "a/b.so", "libtorch_cuda.so", "vllm/_C.so/inner"]  # fmt: skip
    keep, names = scope_filter(globs), name_filter(globs)
    assert names is not None
    assert all(names(p.rsplit("/", 1)[-1]) for p in paths if keep(p))
    assert not names("__init__.py") and name_filter(["**"]) is None and name_filter(["a/**"]) is None

"""What a tag promises: the one GPU-verified rule, the suite's report checks, verify records and their revocation."""

from __future__ import annotations

import copy
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sparkforge.errors import VerifyError
from sparkforge.verify import evidence
from sparkforge.verify import verified as records
from sparkforge.verify.imagechecks import IMAGE_CHECKS, INIMAGE_DIR
from sparkforge.verify.suite import MARKER, parse_suite_output

RUN_CHECKS = INIMAGE_DIR / "run_checks.py"
GB10 = {"name": "NVIDIA GB10", "capability": "12.1", "driver": "580.95.05"}
H200 = {"name": "NVIDIA H200", "capability": "9.0", "driver": "580.159.04"}


def _case(m: int, n: int, k: int, per_token: bool = False, per_channel: bool = False) -> dict[str, Any]:
    return {"m": m, "n": n, "k": k, "per_token": per_token, "per_channel": per_channel}


def passing_checks() -> list[dict[str, Any]]:
    """Every expected check, as a full GB10 run reports them (what a GB10 verify would produce)."""
    out = [
        {"name": n, "status": "passed", "reason": "", "details": {}} for n in evidence.EXPECTED_IMAGE_CHECKS
    ]
    by = {c["name"]: c for c in out}
    shapes = [(16, 256, 512), (64, 1024, 2048), (1, 16384, 5120)]
    by["fp8.cutlass_scaled_mm"]["details"] = {
        "cases": [_case(*s, pt, pc) for s in shapes for pt, pc in ((False, False), (True, True))]
    }
    by["fp8.cutlass_block"]["details"] = {"cases": [_case(*s) for s in shapes]}
    by["serve"]["status"] = "skipped"
    return out


def _with(checks: list[dict[str, Any]], name: str, **change: Any) -> list[dict[str, Any]]:
    out = copy.deepcopy(checks)
    next(c for c in out if c["name"] == name).update(change)
    return out


def test_a_full_gb10_run_is_gpu_verified() -> None:
    verdict = evidence.gpu_verdict(passing_checks(), GB10, "sm_121")
    assert verdict.verified and verdict.ran_on == "sm_121", verdict.reason


def test_torch_only_checks_never_make_an_image_gpu_verified() -> None:
    # Today's H200 result: the torch reference and fp8.linear's torch fallback passed, every vLLM check skipped.
    checks = passing_checks()
    for name in evidence.GPU_VERIFIED_CHECKS:
        checks = _with(checks, name, status="skipped", reason="vLLM is not importable here")
    verdict = evidence.gpu_verdict(checks, GB10, "sm_121")
    assert not verdict.verified and "fp8.scaled_fp8_quant is skipped" in verdict.reason


def test_another_gpu_is_not_the_recipes_gpu() -> None:
    verdict = evidence.gpu_verdict(passing_checks(), H200, "sm_121")
    assert not verdict.verified
    assert verdict.reason == "ran on sm_90; recipe targets sm_121: not GPU-verified for this recipe"
    assert evidence.gpu_verdict(passing_checks(), GB10, "sm_121a").verified  # a/f suffixes: same capability


def test_no_gpu_and_failed_runs_are_not_gpu_verified() -> None:
    assert not evidence.gpu_verdict(passing_checks(), None, "sm_121").verified
    failed = _with(passing_checks(), "versions", status="failed")
    assert "did not pass" in evidence.gpu_verdict(failed, GB10, "sm_121").reason


def test_the_gb10_failure_shape_must_have_run() -> None:
    checks = passing_checks()
    block = next(c for c in checks if c["name"] == "fp8.cutlass_block")
    block["details"]["cases"] = [c for c in block["details"]["cases"] if c["m"] != 1]
    verdict = evidence.gpu_verdict(checks, GB10, "sm_121")
    assert not verdict.verified and "'n': 16384" in verdict.reason


def test_gpus_all_turns_a_skipped_vllm_check_into_a_failure() -> None:
    checks = _with(
        passing_checks(), "fp8.cutlass_scaled_mm", status="skipped", reason="vLLM reports no CUTLASS FP8"
    )
    required = {c["name"]: c for c in evidence.require_gpu_checks(checks)}
    assert required["fp8.cutlass_scaled_mm"]["status"] == "failed"
    assert "vLLM reports no CUTLASS FP8" in required["fp8.cutlass_scaled_mm"]["reason"]
    assert required["serve"]["status"] == "skipped"  # only the GPU-verified checks are required


def test_suite_report_problems_fail_verify() -> None:
    checks, _ = parse_suite_output(json.dumps({"checks": [], "gpu": None}))
    assert [c.name for c in checks if c.status == "failed"] == ["image-suite"]
    odd = _with(passing_checks(), "registry", status="maybe")
    checks, _ = parse_suite_output(json.dumps({"checks": odd}))
    failed = [c for c in checks if c.status == "failed"]
    assert failed and "unknown status 'maybe'" in failed[0].reason
    fewer = [c for c in passing_checks() if c["name"] != "fp8.cutlass_block"]
    checks, _ = parse_suite_output(json.dumps({"checks": fewer}))
    assert any("missing from the report: fp8.cutlass_block" in c.reason for c in checks)
    checks, document = parse_suite_output(json.dumps({"checks": passing_checks(), "gpu": GB10}))
    assert all(c.status != "failed" for c in checks) and document["gpu"] == GB10


def test_expected_checks_are_the_suites_checks() -> None:
    spec = importlib.util.spec_from_file_location("run_checks", RUN_CHECKS)
    assert spec and spec.loader
    sys.path.insert(0, str(RUN_CHECKS.parent))
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        suite = module.suite()
    finally:
        sys.path.remove(str(RUN_CHECKS.parent))
    assert tuple(name for name, _ in suite) == evidence.EXPECTED_IMAGE_CHECKS == IMAGE_CHECKS.names()
    assert all(callable(fn) for _, fn in suite) and len(suite) == len(IMAGE_CHECKS) > 0


def test_every_registry_row_names_a_function_of_the_in_image_suite() -> None:
    for entry in IMAGE_CHECKS:
        fn = entry.run.load()
        assert fn.__name__ == entry.run.function and entry.help, entry.name
    # a row runs here as in the image: a lock without runtime.rdma has nothing for fabric.verbs to prove
    status, reason, _ = IMAGE_CHECKS.get("fabric.verbs").run({"runtime": {}})
    assert status == "skipped" and reason
    from sparkforge.verify import kernel_origin

    origins = [v for v in vars(kernel_origin).values() if isinstance(v, kernel_origin.Origin)]
    origins += [
        v for table in vars(kernel_origin).values() if isinstance(table, dict) for v in table.values()
    ]
    named = {c for o in origins if isinstance(o, kernel_origin.Origin) for c in o.compilers}
    assert named and named <= set(IMAGE_CHECKS.names())  # the kernel report's JIT proofs are suite rows
    with pytest.raises(VerifyError, match=r"--only: unknown verify row 'fp8\.fast'"):
        IMAGE_CHECKS.parse("fp8.fast")


def test_suite_digest_changes_with_any_file(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    first = evidence.suite_digest(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"\0")
    assert evidence.suite_digest(tmp_path) == first  # caches do not count
    (tmp_path / "a.py").write_text("x = 2\n")
    assert evidence.suite_digest(tmp_path) != first


def _gpu_record(status: str, gpu: dict[str, Any] | None, used: bool = True) -> dict[str, Any]:
    return {"status": status, "checks": passing_checks(), "gpu": gpu, "gpus": {"used": used}}


def test_a_failed_verify_revokes_the_pass(tmp_path: Path) -> None:
    image = "sha256:" + "a" * 64
    records.write_record(image, _gpu_record("passed", GB10), tmp_path)
    assert records.is_gpu_verified(records.passed_record(image, tmp_path), "sm_121")
    records.write_record(image, _gpu_record("failed", GB10), tmp_path)
    assert records.passed_record(image, tmp_path) is None
    assert not records.is_gpu_verified(records.read_record(image, tmp_path), "sm_121")


def test_a_cpu_only_verify_never_satisfies_a_gpu_requirement(tmp_path: Path) -> None:
    image = "sha256:" + "b" * 64
    records.write_record(image, _gpu_record("passed", None, used=False), tmp_path)
    assert records.passed_record(image, tmp_path) is not None
    assert not records.is_gpu_verified(records.read_record(image, tmp_path), "sm_121")
    records.link_digest("sha256:" + "d" * 64, image, "localhost:5000/x", tmp_path)
    assert records.record_for_digest("sha256:" + "d" * 64, tmp_path)["image_id"] == image
    assert records.record_for_digest("sha256:" + "e" * 64, tmp_path) is None


def test_a_record_is_judged_again_never_by_its_stored_verdict(tmp_path: Path) -> None:
    # A record whose suite claimed a GB10 while the host passed no GPU, and a stored "verified: true".
    image = "sha256:" + "c" * 64
    forged = {**_gpu_record("passed", GB10, used=False), "gpu_verified": {"verified": True}}
    records.write_record(image, forged, tmp_path)
    verdict = records.record_verdict(records.read_record(image, tmp_path), "sm_121")
    assert not verdict.verified and "no GPU was used" in verdict.reason
    records.write_record(image, _gpu_record("passed", H200), tmp_path)
    assert "ran on sm_90" in records.record_verdict(records.read_record(image, tmp_path), "sm_121").reason


def test_build_rule_is_the_one_rule() -> None:
    # build.py's old rule called any passing fp8.* check GPU-verified; there is no second rule any more.
    import sparkforge.imagebuild as imagebuild

    assert not hasattr(imagebuild, "gpu_verified")


# ---- fetch-source: real containment when tarfile has no data filter (Python < 3.11.4) ------------------


def _fetch_module() -> Any:
    path = Path(__file__).resolve().parents[2] / "dockerfiles" / "files" / "fetch-source.py"
    spec = importlib.util.spec_from_file_location("fetch_source", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _archive(tmp_path: Path, *members: tarfile.TarInfo) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as out:
        out.addfile(_file("top/ok"), io.BytesIO(b"1"))
        for member in members:
            out.addfile(member, io.BytesIO(b"x") if member.isfile() else None)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer)


def _file(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 1
    return info


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    "member",
    [
        _link(
            "top/a/b/c/hard", "../x", tarfile.LNKTYPE
        ),  # inside when read from the member's folder: it is not
        _link("top/sym", "../../unpacked-evil/x", tarfile.SYMTYPE),  # a sibling with the same prefix
        _file("../unpacked-evil/x"),
    ],
)
def test_fetch_source_contains_links_without_the_data_filter(
    member: tarfile.TarInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _fetch_module()
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    dest = tmp_path / "unpacked"
    with pytest.raises(SystemExit), _archive(tmp_path, member) as archive:
        module.safe_extract(archive, dest)
    assert not (tmp_path / "unpacked-evil").exists() and not (tmp_path / "x").exists()


def test_fetch_source_extracts_a_clean_tree_without_the_data_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _fetch_module()
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    with _archive(tmp_path, _link("top/hard", "top/ok", tarfile.LNKTYPE)) as archive:
        module.safe_extract(archive, tmp_path / "unpacked")
    assert (tmp_path / "unpacked" / "top" / "hard").read_text() == "1"


def test_push_by_digest_rebuild_must_be_the_verified_image(tmp_path: Path) -> None:
    from sparkforge.errors import VerifyError
    from sparkforge.imagebuild.execute import link_pushed_digest

    verified = "sha256:" + "1" * 64
    metadata = tmp_path / "metadata.json"
    pushed = "sha256:" + "2" * 64
    metadata.write_text(
        json.dumps({"containerimage.digest": pushed, "containerimage.config.digest": "sha256:" + "3" * 64})
    )
    with pytest.raises(VerifyError, match="not the verified image"):
        link_pushed_digest(metadata, verified, "ghcr.io/o/r", tmp_path)
    assert not (tmp_path / "digests").exists()
    metadata.write_text(
        json.dumps({"containerimage.digest": pushed, "containerimage.config.digest": verified})
    )
    assert link_pushed_digest(metadata, verified, "ghcr.io/o/r", tmp_path) == pushed
    assert records.record_for_digest(pushed, tmp_path) is None  # linked; the record itself comes from verify
    assert (tmp_path / "digests" / f"{'2' * 64}.json").is_file()


def test_the_suite_refuses_an_unknown_only_and_runs_a_known_one(tmp_path: Path) -> None:
    """run_checks.py as the image runs it (a process, the suite's folder only): a typo in --only is an error
    naming every check, not a report with nothing in it."""
    import subprocess

    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"runtime": {}}))
    run = [sys.executable, str(RUN_CHECKS), "--lock", str(lock), "--nonce", "n1", "--only"]
    typo = subprocess.run([*run, "fabric.verb"], capture_output=True, text=True, timeout=60, check=False)
    assert typo.returncode == 2 and "unknown check fabric.verb; choose from registry, versions" in typo.stderr
    known = subprocess.run([*run, "fabric.verbs"], capture_output=True, text=True, timeout=60, check=False)
    checks, document = parse_suite_output(known.stdout.split(MARKER, 1)[1])
    assert [c.name for c in checks[:1]] == ["fabric.verbs"] and checks[0].status == "skipped"
    assert document["nonce"] == "n1"

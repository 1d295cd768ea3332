"""The trust chain's rules without a registry: what pull makes of signed verify claims, what the host accepts
from the in-image suite, which records move tags, which --tag needs the gate (issue 'Trust, round 2').

Each test names the hole it closes; the engine side (real cosign, registry and containers) is in
tests/engine/test_trust_*.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import PublishError, VerifyError
from sparkforge.imagebuild.stage import BuildOptions, check_options, moving_requests, survey
from sparkforge.recipe.loader import load_recipe
from sparkforge.registry.cosign import Statement
from sparkforge.registry.publish import require_gpu_verified
from sparkforge.registry.trust import judge_claims
from sparkforge.verify import verified
from sparkforge.verify.evidence import suite_digest
from sparkforge.verify.gpuhost import compare_gpu, parse_gpu_query
from sparkforge.verify.suite import MARKER, SUITE_DIR, read_suite_output
from tests.recipe_files import SMOKE
from tests.unit.test_evidence import GB10, H200, passing_checks

RECIPE = load_recipe(SMOKE)  # targets sm_121; moving tag: latest
DIGEST = "sha256:" + "d" * 64
CONFIG = "sha256:" + "c" * 64
PLATFORM = "linux/arm64"


def report(gpu: dict[str, Any] | None = GB10, *, used: bool = True, **change: Any) -> dict[str, Any]:
    """A verify report as 'invoke verify --gpus all' writes it (the one thing a GB10 would produce)."""
    out = {
        "command": "verify",
        "recipe": RECIPE.name,
        "recipe_hash": RECIPE.hash,
        "image_id": CONFIG,
        "status": "passed",
        "platform": PLATFORM,
        "checks": passing_checks(),
        "gpus": {"mode": "all", "used": used},
        "gpu": gpu,
        "suite": {"sha256": suite_digest(SUITE_DIR)},
    }
    out.update(change)
    return out


def claim(rep: dict[str, Any], when: str = "2026-12-01T00:00:00.000000Z", **change: Any) -> Statement:
    """A signed verify claim as cosign's verify-attestation hands it back (the signature was checked)."""
    predicate = {
        "recipeHash": rep.get("recipe_hash"),
        "platform": rep.get("platform"),
        "status": rep.get("status"),
        "imageId": rep.get("image_id"),
        "attestedAt": when,
        "report": rep,
        **change,
    }
    return Statement("https://sparkforge.dev/attestations/verify/v1", (DIGEST,), predicate)


@pytest.fixture
def engine_or_skip() -> None:
    from sparkforge import engine

    try:
        runtime = engine.gpu_runtime_available()
    except Exception as exc:  # no engine reachable: nothing to ask (the engine tests need one)
        pytest.skip(f"no engine: {exc}")
    if runtime:
        pytest.skip("this engine has the NVIDIA runtime")


def judge(*statements: Statement):
    return judge_claims(RECIPE, PLATFORM, DIGEST, CONFIG, statements)


# ---- hole 1: pull applies the one GPU-verified rule to the signed report ------------------------------


def test_a_gpu_run_whose_vllm_checks_all_skipped_is_not_gpu_verified() -> None:
    rep = report()
    for check in rep["checks"]:
        if check["name"].startswith("fp8.") and check["name"] != "fp8.reference":
            check["status"] = "skipped"  # --gpus auto: the GPU runtime was there, no vLLM check ran
    judged = judge(claim(rep))
    assert not judged.verdict.verified and "fp8.scaled_fp8_quant is skipped" in judged.reason


def test_a_run_on_another_gpu_is_not_gpu_verified_and_the_claim_names_the_gpu() -> None:
    judged = judge(claim(report(H200)))
    assert not judged.verdict.verified and "ran on sm_90; recipe targets sm_121" in judged.reason
    judged = judge(claim(report(GB10)))
    assert judged.verdict.verified, judged.reason
    assert judged.claim["imageId"] == CONFIG and judged.claim["attestedAt"].startswith("2026-12-01")


def test_a_suite_claiming_a_gpu_the_host_did_not_pass_is_not_gpu_verified() -> None:
    judged = judge(claim(report(GB10, used=False)))  # the suite said GB10; the host passed no GPU
    assert not judged.verdict.verified and "no GPU was used" in judged.reason


# ---- hole 4: the newest claim wins; any failed claim revokes -------------------------------------------


def test_the_newest_claim_by_signed_time_wins() -> None:
    passed, cpu = report(GB10), report(None, used=False)
    assert not judge(
        claim(passed, "2026-12-01T10:00:00Z"), claim(cpu, "2026-12-02T10:00:00Z")
    ).verdict.verified
    assert judge(claim(cpu, "2026-12-01T10:00:00Z"), claim(passed, "2026-12-02T10:00:00Z")).verdict.verified


def test_any_failed_claim_for_the_digest_revokes_every_pass() -> None:
    failed = report(GB10, status="failed")
    judged = judge(claim(failed, "2026-11-01T00:00:00Z"), claim(report(GB10), "2026-12-01T00:00:00Z"))
    assert judged.revoked and not judged.verdict.verified and "FAILED" in judged.reason
    other = Statement(claim(failed).predicate_type, ("sha256:" + "e" * 64,), claim(failed).predicate)
    assert judge(other, claim(report(GB10))).verdict.verified  # a failure of another digest is not this one's


# ---- hole 7: the claim is about this image and recipe, as the report says ------------------------------


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"imageId": "sha256:" + "0" * 64}, "image ID"),
        ({"recipeHash": "0" * 64}, "recipe hash"),
        ({"platform": "linux/amd64"}, "platform"),
    ],
)
def test_a_claim_about_another_image_or_recipe_is_not_this_ones(change: dict[str, str], why: str) -> None:
    judged = judge(claim(report(GB10), **change))
    assert not judged.verdict.verified and f"{why} " in judged.reason


def test_the_reports_own_image_id_must_be_the_attested_config() -> None:
    judged = judge(claim(report(GB10, image_id="sha256:" + "0" * 64), imageId=CONFIG))
    assert not judged.verdict.verified and "report image ID" in judged.reason


# ---- hole 2: the host establishes what it can -----------------------------------------------------------


def _output(*documents: dict[str, Any]) -> str:
    return "".join(f"noise\n{MARKER}{json.dumps(d)}\n" for d in documents)


def test_exactly_one_report_marker_is_accepted() -> None:
    real = {"nonce": "n1", "checks": passing_checks(), "gpu": None}
    forged = {"nonce": "n1", "checks": passing_checks(), "gpu": GB10}
    checks, document = read_suite_output(_output(real, forged), "", 0, "n1")
    assert [c.name for c in checks] == ["image-suite"] and checks[0].status == "failed"
    assert "2 report markers" in checks[0].reason and document == {}
    checks, _ = read_suite_output(_output(real), f"{MARKER}{json.dumps(forged)}\n", 0, "n1")  # stderr counts
    assert checks[0].name == "image-suite" and checks[0].status == "failed"
    checks, document = read_suite_output(_output(real), "", 0, "n1")
    assert document["nonce"] == "n1" and all(c.status != "failed" for c in checks)


def test_the_report_must_echo_this_runs_nonce() -> None:
    canned = {"nonce": "from-an-earlier-run", "checks": passing_checks(), "gpu": GB10}
    checks, document = read_suite_output(_output(canned), "", 0, "n2")
    assert checks[0].status == "failed" and "nonce" in checks[0].reason and document == {}
    checks, _ = read_suite_output(_output({"checks": passing_checks()}), "", 0, "n2")
    assert checks[0].status == "failed"  # no nonce at all


def test_the_host_reads_the_gpu_and_the_suite_must_agree() -> None:
    host = parse_gpu_query("NVIDIA GB10, 12.1, 580.95.05\n")
    assert host == {**GB10, "count": 1}
    assert parse_gpu_query("") is None and parse_gpu_query("NVIDIA-SMI has failed\n") is None
    assert compare_gpu(host, dict(GB10)).status == "passed"
    wrong = compare_gpu(host, dict(H200))
    assert wrong.status == "failed" and "capability: host 12.1, suite 9.0" in wrong.reason
    assert compare_gpu(None, dict(GB10)).status == "skipped"  # no GPU passed: the suite's claim is ignored


# ---- hole 5: records used to move tags must be of this recipe ------------------------------------------


def _record(tmp_path: Path, repository: str = "", **change: Any) -> None:
    verified.write_record(CONFIG, report(GB10, **change), tmp_path)
    verified.link_digest(DIGEST, CONFIG, repository or RECIPE.model.publish.repository, tmp_path)


def test_a_gpu_verified_record_of_this_recipe_moves_tags(tmp_path: Path) -> None:
    _record(tmp_path)
    require_gpu_verified(RECIPE, {PLATFORM: DIGEST}, tmp_path)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"recipe_hash": "0" * 64}, "recipe hash"),
        ({"suite": {"sha256": "sha256:" + "0" * 64}}, "suite"),
        ({"platform": "linux/amd64"}, "platform"),
        ({"recipe": "another-recipe"}, "recipe"),
        ({"repository": "localhost:5000/someone/else"}, "repository"),
    ],
)
def test_a_record_of_another_recipe_suite_or_repository_moves_nothing(
    tmp_path: Path, change: dict[str, Any], why: str
) -> None:
    _record(tmp_path, **change)
    with pytest.raises(PublishError, match=rf"record is of something else \(.*{why} "):
        require_gpu_verified(RECIPE, {PLATFORM: DIGEST}, tmp_path)


def test_a_record_whose_suite_claimed_a_gpu_the_host_never_passed_moves_nothing(tmp_path: Path) -> None:
    _record(tmp_path, gpus={"mode": "none", "used": False})
    with pytest.raises(PublishError, match="no GPU was used"):
        require_gpu_verified(RECIPE, {PLATFORM: DIGEST}, tmp_path)


# ---- hole 6: a --tag that names a moving tag goes through the gate --------------------------------------


def test_a_tag_naming_a_moving_tag_is_recognised() -> None:
    repo = RECIPE.model.publish.repository
    refs = [f"{repo}:latest", "my/mirror", "my/mirror:latest", f"{repo}:0.33.0-abc", "localhost:5000/x:keep"]
    assert moving_requests(RECIPE, refs) == [f"{repo}:latest", "my/mirror", "my/mirror:latest"]


@pytest.mark.parametrize("change", [{"verify": False}, {"gpus": "none"}, {"target": "base"}])
def test_a_moving_tag_is_refused_before_building_when_the_build_cannot_gpu_verify(change: dict) -> None:
    options = BuildOptions(tags=(f"{RECIPE.model.publish.repository}:latest",), **change)
    gpu = options.gpus != "none"  # what survey says of the host under --dry
    with pytest.raises(VerifyError, match=r"--tag .*:latest: a moving tag names only a GPU-verified image"):
        check_options(RECIPE, options, gpu)
    check_options(RECIPE, BuildOptions(tags=("localhost:5000/x:keep",), **change), gpu)


def test_a_moving_tag_is_refused_before_building_on_an_engine_without_a_gpu(engine_or_skip: None) -> None:
    # --gpus auto on an engine without the NVIDIA runtime (this machine): the verify cannot GPU-verify.
    options = BuildOptions(tags=(f"{RECIPE.model.publish.repository}:latest",), gpus="auto")
    with pytest.raises(VerifyError, match="no NVIDIA runtime in the engine"):
        survey(Session(echo=print, runner=Runner(stream=False)), RECIPE, options)


def test_claims_are_not_changed_by_judging() -> None:
    rep = report(GB10)
    before = copy.deepcopy(rep)
    judge(claim(rep))
    assert rep == before

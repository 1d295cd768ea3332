"""Signing without a registry: the recipe's policy, moving tags, predicates, cosign argv, the workflow's shape."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
import yaml

from sparkforge.commands import Runner
from sparkforge.errors import RecipeError
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.registry.cosign import (
    PROVENANCE,
    Cosign,
    Policy,
    Signer,
    SigningError,
    Source,
    provenance,
    verify_claim,
)
from sparkforge.registry.trust import is_moving
from tests.recipe_files import SMOKE, write_recipe_file

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "images.yml"
GPU_ATTEST = REPO_ROOT / ".github" / "workflows" / "gpu-attest.yml"


def _recipe(tmp_path: Path, signing: str) -> Path:
    return write_recipe_file(tmp_path / "signed.yaml", f"publish:\n  signing:\n{signing}", extends=SMOKE)


def test_key_policy_resolves_a_repository_path(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path, "    key: keys/cosign.pub\n"))
    policy = Policy.of(recipe)
    assert policy == Policy(key=REPO_ROOT / "keys" / "cosign.pub")
    with pytest.raises(
        SigningError, match=r"keys/cosign.pub does not exist; fix: commit the cosign public key"
    ):
        policy.verify_argsets()


PINNED = r"^https://github.com/sparkforge/sparkforge/\.github/workflows/{}\.yml@refs/(heads/main|tags/v[0-9]+\.[0-9]+\.[0-9]+)$"
VERIFY = r"^https://github.com/sparkforge/sparkforge/\.github/workflows/gpu-attest\.yml@refs/heads/main$"


def _keyless(identity: str, verify_identity: str) -> str:
    return f"    keyless:\n      identity: '{identity}'\n      verify_identity: '{verify_identity}'\n"


def test_keyless_policy_defaults_to_github_actions(tmp_path: Path) -> None:
    identity, verifier = PINNED.format("images"), VERIFY
    recipe = load_recipe(_recipe(tmp_path, _keyless(identity, verifier)))
    policy = Policy.of(recipe)
    assert policy is not None and policy.verify_argsets()[0][:4] == (
        "--certificate-identity-regexp",
        r"^https://github\.com/sparkforge/sparkforge/\.github/workflows/images\.yml@refs/heads/main$",
        "--certificate-oidc-issuer",
        "https://token.actions.githubusercontent.com",
    )
    verify = Policy.for_verify(recipe)  # the GPU verify attestation: its own workflow's identity
    assert verify is not None and "gpu-attest" in verify.verify_argsets()[0][1]


@pytest.mark.parametrize(
    ("identity", "why"),
    [
        (
            "^https://github.com/sparkforge/sparkforge/.github/workflows/images.yml@refs/(heads|tags)/.*$",
            "the refs",
        ),
        ("^https://github.com/sparkforge/sparkforge/.github/workflows/images.yml@refs/.*$", "the refs"),
        ("^https://github.com/sparkforge/sparkforge/.github/workflows/images.yml@refs/tags/v.*$", "the refs"),
        (
            "^https://github.com/sparkforge/sparkforge/.github/workflows/images.yml@refs/heads/main.*$",
            "the refs",
        ),
        ("^https://github.com/.*/.github/workflows/images.yml@refs/heads/main$", "must be literal"),
        ("https://github.com/sparkforge/sparkforge/.github/workflows/images.yml@refs/heads/main", "anchored"),
    ],
)
def test_an_over_broad_signer_identity_is_refused_at_load(tmp_path: Path, identity: str, why: str) -> None:
    # Hole 3: refs/(heads|tags)/.* let any collaborator sign from a branch or tag of their own.
    with pytest.raises(RecipeError, match=rf"too broad: .*{re.escape(why)}.*fix: pin the default branch"):
        load_recipe(_recipe(tmp_path, _keyless(identity, VERIFY)))
    with pytest.raises(RecipeError, match="too broad"):  # the verify identity is held to the same rule
        load_recipe(_recipe(tmp_path, _keyless(PINNED.format("images"), identity)))


def test_the_verify_identity_is_not_the_publishing_identity(tmp_path: Path) -> None:
    same = VERIFY.replace("gpu-attest", "images")
    with pytest.raises(RecipeError, match="verify_identity names the same workflow as identity"):
        load_recipe(_recipe(tmp_path, _keyless(same, same)))


def test_the_repositorys_recipes_pin_their_signers() -> None:
    for path in sorted((REPO_ROOT / "recipes").glob("[!_]*.yaml")):  # _*.yaml: partial bases
        signing = load_recipe(path).model.publish.signing
        if signing is not None and signing.keyless is not None:
            assert r"images\.yml@refs/(heads/main|tags/v" in signing.keyless.identity, path
            assert r"gpu-attest\.yml@" in signing.keyless.verify_identity, path


@pytest.mark.parametrize(
    "signing",
    [
        "    key: keys/cosign.pub\n    keyless:\n      identity: x\n",  # both
        "    {}\n",  # neither
        "    key: 'keys/cosign.pub; rm -rf /'\n",  # not a path
    ],
)
def test_signing_policy_is_strict(tmp_path: Path, signing: str) -> None:
    with pytest.raises(RecipeError, match="signing"):
        load_recipe(_recipe(tmp_path, signing))


def test_signing_policy_is_not_an_input_of_the_image(tmp_path: Path) -> None:
    plain = write_recipe_file(tmp_path / "plain" / "plain.yaml", extends=SMOKE)
    signed = load_recipe(_recipe(tmp_path, "    key: keys/cosign.pub\n"))
    assert signed.hash == load_recipe(plain).hash  # a new key needs no rebuild


def test_moving_tags_match_their_templates() -> None:
    recipe = load_recipe(REPO_ROOT / "recipes" / "vllm-qwen35-wheels.yaml")  # moving: {vllm}, latest
    assert is_moving(recipe, "latest") and is_moving(recipe, "0.33.0")
    assert not is_moving(recipe, f"0.33.0-{recipe.hash[:12]}")
    assert not is_moving(recipe, "0.33.0-cu130-20261130") and not is_moving(recipe, "0.33.1")


def test_provenance_names_recipe_platform_and_commit() -> None:
    recipe = load_recipe(SMOKE)
    source = Source("https://github.com/sparkforge/sparkforge", "a" * 40, "sparkforge-local", "")
    predicate = provenance(recipe, "linux/arm64", source)
    params = predicate["buildDefinition"]["externalParameters"]
    assert params["recipeHash"] == recipe.hash and params["platform"] == "linux/arm64"
    assert params["source"] == {"repository": source.repository, "revision": "a" * 40}
    assert predicate["buildDefinition"]["resolvedDependencies"][0]["digest"] == {"gitCommit": "a" * 40}


def test_source_in_github_actions_is_the_workflow_run(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_SHA": "b" * 40,
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "sparkforge/sparkforge",
        "GITHUB_WORKFLOW_REF": "sparkforge/sparkforge/.github/workflows/images.yml@refs/tags/v1",
        "GITHUB_RUN_ID": "42",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    source = Source.detect(Runner(dry=True))
    assert source.revision == "b" * 40 and source.repository == "https://github.com/sparkforge/sparkforge"
    assert source.builder == "https://github.com/sparkforge/sparkforge/.github/workflows/images.yml"
    assert source.invocation.endswith("/actions/runs/42")


def test_verify_claim_takes_what_it_says_from_the_report() -> None:
    # Hole 7: the recipe and suite hash came from the attesting checkout, not from the report.
    recipe = load_recipe(SMOKE)
    gpu = {"name": "NVIDIA GB10", "capability": "12.1", "driver": "580.95.05"}
    report = {
        "command": "verify",
        "recipe": recipe.name,
        "recipe_hash": recipe.hash,
        "image_id": "sha256:" + "c" * 64,
        "status": "passed",
        "platform": "linux/arm64",
        "gpus": {"used": True, "why": "GPU runtime present"},
        "gpu": gpu,
        "suite": {"sha256": "sha256:" + "5" * 64},
        "checks": [{"name": "fp8.cutlass_block", "status": "passed", "details": {}}],
    }
    claim = verify_claim(recipe, report)
    assert claim["gpu"] == {**gpu, "used": True, "why": "GPU runtime present", "devices": ["NVIDIA GB10"]}
    assert claim["recipeHash"] == recipe.hash and claim["suiteHash"] == "sha256:" + "5" * 64
    assert claim["imageId"] == "sha256:" + "c" * 64 and claim["attestedAt"].endswith("Z")
    assert claim["checks"] == [{"name": "fp8.cutlass_block", "status": "passed"}]
    with pytest.raises(SigningError, match="not a verify report of smoke-multiarch"):
        verify_claim(recipe, {**report, "command": "audit"})
    with pytest.raises(SigningError, match="the report verified recipe hash 000000000000"):
        verify_claim(recipe, {**report, "recipe_hash": "0" * 64})


def test_key_signatures_stay_off_the_transparency_log(tmp_path: Path) -> None:
    runner = Runner(dry=True, log_dir=tmp_path, echo=lambda _: None)
    Cosign(runner).sign("localhost:5000/x@sha256:" + "0" * 64, Signer("cosign.key"))
    Cosign(runner).attest("localhost:5000/x@sha256:" + "0" * 64, PROVENANCE, {}, Signer(None))
    key, keyless = (p.read_text() for p in sorted(tmp_path.glob("*.sh")))  # 01-sign, 02-attest
    assert "--key cosign.key --tlog-upload=false" in key
    assert "--key" not in keyless and "--tlog-upload" not in keyless  # keyless: Fulcio + Rekor


def test_moving_tag_dates_are_any_day() -> None:
    recipe = load_recipe(SMOKE)
    assert not is_moving(recipe, dt.date.today().strftime("%Y%m%d"))


def test_only_the_jobs_that_sign_get_an_oidc_token() -> None:
    images = yaml.safe_load(WORKFLOW.read_text())
    attest = yaml.safe_load(GPU_ATTEST.read_text())
    assert images["permissions"] == {} and attest["permissions"] == {}
    jobs = {**images["jobs"], **{f"gpu-attest/{n}": j for n, j in attest["jobs"].items()}}
    runs = {n: " ".join(s.get("run", "") for s in job.get("steps", [])) for n, job in jobs.items()}
    signing = {n for n, text in runs.items() if "invoke sign" in text}
    # the index and images; the GPU evidence, by a job without the GPU; the TUF timestamp
    assert signing == {"merge", "gpu-attest/sign", "gpu-attest/timestamp"}
    callers = {
        "gpu-verify",
        "tuf-timestamp",
    }  # images.yml's jobs that run gpu-attest.yml: the token is granted there
    gpu = attest["jobs"]["verify"]  # the job that runs the candidate holds no identity and moves no tag
    assert "id-token" not in gpu["permissions"] and gpu["permissions"]["packages"] == "read"
    assert not set(
        attest["jobs"]["sign"]["runs-on"]
        if isinstance(attest["jobs"]["sign"]["runs-on"], list)
        else [attest["jobs"]["sign"]["runs-on"]]
    ) & {"self-hosted", "dgx-spark"}
    sign_runs = " ".join(s.get("run", "") for s in attest["jobs"]["sign"]["steps"])
    assert "invoke pull" not in sign_runs and "invoke verify" not in sign_runs  # never runs the candidate
    for name, job in jobs.items():
        wants = name in signing or name in callers
        assert (job.get("permissions", {}).get("id-token") == "write") == wants, name
        if name in signing and name != "gpu-attest/timestamp":  # cosign before it is used (TUF needs none)
            steps = [s.get("uses", "") + s.get("run", "") for s in job["steps"]]
            first = next(i for i, s in enumerate(steps) if "invoke sign" in s or "invoke pull" in s)
            assert any("sigstore/cosign-installer@" in s for s in steps[:first]), name
        for step in job.get("steps", []):
            if "invoke sign" in step.get("run", ""):  # run as written by tests/engine/signing_fixtures.py
                assert "${{" not in step["run"] and "--key" not in step["run"]  # the key: env, only in tests


def test_signing_jobs_run_only_from_the_default_branch_or_release_tags() -> None:
    # Hole 3: workflow_dispatch ran from any branch, and the verify attestation shared the merge job's identity.
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    condition = jobs["merge"]["if"]
    assert (
        "github.ref == 'refs/heads/main'" in condition
        and "startsWith(github.ref, 'refs/tags/v')" in condition
    )
    # The GPU runner: main only (tags as identity: a tag's own workflow copy runs free of every guard).
    assert (
        "github.ref == 'refs/heads/main'" in jobs["gpu-verify"]["if"]
        and "tags" not in jobs["gpu-verify"]["if"]
    )
    assert jobs["gpu-verify"]["uses"] == "./.github/workflows/gpu-attest.yml"
    attest = yaml.safe_load(GPU_ATTEST.read_text())
    assert list(attest[True]) == ["workflow_call"]  # `on` reads as true; only images.yml runs it
    assert attest["jobs"]["verify"]["environment"] == "gpu-verify"  # protected: reviewers, branch rules


@pytest.mark.parametrize(
    ("suite", "accepted"),
    [
        (None, True),
        ("written", True),  # the digest exactly as verify writes it (evidence.suite_digest)
        ({"sha256": "5" * 64}, False),  # no algorithm prefix
        ({"sha256": "sha256:" + "G" * 64}, False),
        ({"sha256": "sha256:" + "5" * 63}, False),
        ("not an object", False),
    ],
)
def test_sign_attest_takes_the_suite_digest_verify_writes(suite: object, accepted: bool) -> None:
    from sparkforge.registry.signinputs import SigningError, parse_verify_report
    from sparkforge.verify.evidence import suite_digest
    from sparkforge.verify.suite import SUITE_DIR

    data = {"command": "verify", "recipe": "smoke", "status": "passed", "checks": [], "subject": "r@sha256:" + "1" * 64}
    if suite == "written":
        data["suite"] = {"source": str(SUITE_DIR), "sha256": suite_digest(SUITE_DIR)}
    elif suite is not None:
        data["suite"] = suite
    if accepted:
        assert parse_verify_report(data, "report.json")["command"] == "verify"
    else:
        with pytest.raises(SigningError, match=r"report.json: 'suite' must be an object"):
            parse_verify_report(data, "report.json")

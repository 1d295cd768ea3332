"""`invoke lint`'s own workflow check: no pull request, other ref or other repository reaches the GPU runner."""

from __future__ import annotations

import copy

import pytest
import yaml

from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.registry.workflowcheck import check_files, conjuncts, workflow_problems

FOLDER = REPO_ROOT / ".github" / "workflows"
REPO = "sparkforge/sparkforge"


def _workflows() -> dict:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(FOLDER.glob("*.yml"))}


def test_the_repositorys_workflows_pass() -> None:
    assert check_files(FOLDER, REPO) == []


def _broken(change) -> list[str]:
    flows = copy.deepcopy(_workflows())
    change(flows)
    return workflow_problems(flows, REPO)


def test_a_pull_request_trigger_on_the_gpu_workflow_fails() -> None:
    def pr(flows: dict) -> None:
        flows["images.yml"][True]["pull_request"] = None

    assert any("sends pull_request runs to the GPU runner" in p for p in _broken(pr))


def test_a_gpu_job_reachable_from_another_ref_fails() -> None:
    def tags_too(flows: dict) -> None:  # the condition images.yml had before: release tags reached the runner
        job = flows["images.yml"]["jobs"]["gpu-verify"]
        job["if"] = job["if"].replace(
            "github.ref == 'refs/heads/main'",
            "(github.ref == 'refs/heads/main' || startsWith(github.ref, 'refs/tags/v'))",
        )

    def ored(flows: dict) -> None:  # main only under an ||: no top-level condition at all
        flows["gpu-attest.yml"]["jobs"]["verify"]["if"] = "${{ github.ref == 'refs/heads/main' || true }}"

    def new_job(flows: dict) -> None:
        flows["ci.yml"]["jobs"]["bench"] = {"runs-on": ["self-hosted", "dgx-spark"], "steps": []}

    for change in (tags_too, ored, new_job):
        assert any("from refs other than main" in p for p in _broken(change)), change


def test_a_reusable_verify_workflow_callable_from_elsewhere_fails() -> None:
    def open_to_all(flows: dict) -> None:
        job = flows["gpu-attest.yml"]["jobs"]["verify"]
        job["if"] = "${{ github.ref == 'refs/heads/main' }}"

    assert any("can be called from another repository" in p for p in _broken(open_to_all))


def _gpu_job(flows: dict) -> dict:
    return flows["gpu-attest.yml"]["jobs"]["verify"]


def test_the_five_shapes_that_reach_the_gpu_runner_from_other_refs_fail() -> None:
    def and_or(flows: dict) -> None:  # `main && x || y` runs whenever y holds
        job = _gpu_job(flows)
        job["if"] = job["if"].replace("}}", "|| github.event_name == 'workflow_dispatch' }}")

    def label_without_self_hosted(flows: dict) -> None:
        flows["ci.yml"]["jobs"]["bench"] = {"runs-on": "dgx-spark", "steps": []}

    def runner_group(flows: dict) -> None:
        flows["ci.yml"]["jobs"]["bench"] = {"runs-on": {"group": "gpu", "labels": ["linux"]}, "steps": []}

    def from_expression(flows: dict) -> None:
        flows["ci.yml"]["jobs"]["bench"] = {"runs-on": "${{ inputs.runner }}", "steps": []}

    def full_name_from_pull_request(flows: dict) -> None:
        flows["ci.yml"]["jobs"]["gpu"] = {
            "uses": f"{REPO}/.github/workflows/gpu-attest.yml@main",
            "with": {"recipe": "r", "name": "n"},
        }

    shapes = {
        and_or: "from refs other than main",
        label_without_self_hosted: "from refs other than main",
        runner_group: "from refs other than main",
        from_expression: "from refs other than main",
        full_name_from_pull_request: "sends pull_request runs to the GPU runner",
    }
    for change, message in shapes.items():
        assert any(message in p for p in _broken(change)), change.__name__


def test_a_hosted_runner_and_the_plan_matrix_runner_are_proven_safe() -> None:
    def hosted(flows: dict) -> None:
        flows["ci.yml"]["jobs"]["extra"] = {"runs-on": ["ubuntu-24.04-arm"], "steps": []}

    assert _broken(hosted) == []

    def other_matrix(flows: dict) -> None:  # the platform chooses between literals: the matrix cannot add one
        flows["images.yml"]["jobs"]["build"]["strategy"]["matrix"] = {"platform": ["dgx-spark"]}

    assert _broken(other_matrix) == []


def test_round5_a_runner_the_matrix_names_and_a_checkout_of_an_input_ref_fail() -> None:
    """Review item 6: the plan job's matrix is computed by the dispatched branch's (or a pull request's) own
    code, so `${{ matrix.runner }}` may name the GPU runner; a main-only GPU job checking out `inputs.ref` runs
    another ref's code. Both passed `invoke lint` before."""

    def matrix_runner(flows: dict) -> None:
        flows["images.yml"]["jobs"]["build"]["runs-on"] = "${{ matrix.runner }}"

    def data_in_the_choice(flows: dict) -> None:
        flows["images.yml"]["jobs"]["build"]["runs-on"] = (
            "${{ matrix.arm && matrix.runner || 'ubuntu-24.04' }}"
        )

    def checkout_input_ref(flows: dict) -> None:
        job = _gpu_job(flows)
        job["steps"][0] = {
            **job["steps"][0],
            "with": {"ref": "${{ inputs.ref }}", "persist-credentials": False},
        }

    assert any("images.yml job build may reach the GPU runner" in p for p in _broken(matrix_runner))
    assert any("images.yml job build may reach the GPU runner" in p for p in _broken(data_in_the_choice))
    assert any("checks out a ref chosen by an expression" in p for p in _broken(checkout_input_ref))


def test_a_build_cache_in_a_workflow_or_for_main_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def own_cache(flows: dict) -> None:
        step = {"run": "docker buildx build --cache-from type=registry,ref=ghcr.io/x:cache ."}
        flows["images.yml"]["jobs"]["build"]["steps"].append(step)

    assert any("names a build cache itself" in p for p in _broken(own_cache))
    from sparkforge.registry import matrix

    monkeypatch.setattr(matrix, "cache_refs", lambda *a: ("type=registry,ref=x", "type=registry,ref=x"))
    assert any("gives refs/heads/main a registry build cache" in p for p in _broken(lambda flows: None))


@pytest.mark.parametrize(
    ("expression", "terms"),
    [
        ("${{ a && b }}", ["a", "b"]),
        ("${{ (a && b) || c }}", []),
        ("${{ x == 'a && b' && y }}", ["x == 'a && b'", "y"]),
        ("${{ a && b || c }}", []),  # not a conjunction: nothing is proven
    ],
)
def test_conditions_split_only_at_top_level(expression: str, terms: list[str]) -> None:
    assert conjuncts(expression) == terms

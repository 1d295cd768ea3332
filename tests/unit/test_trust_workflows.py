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
        assert any("reaches the GPU runner from refs other than main" in p for p in _broken(change)), change


def test_a_reusable_verify_workflow_callable_from_elsewhere_fails() -> None:
    def open_to_all(flows: dict) -> None:
        job = flows["gpu-attest.yml"]["jobs"]["verify"]
        job["if"] = "${{ github.ref == 'refs/heads/main' }}"

    assert any("can be called from another repository" in p for p in _broken(open_to_all))


@pytest.mark.parametrize(
    ("expression", "terms"),
    [
        ("${{ a && b }}", ["a", "b"]),
        ("${{ (a && b) || c }}", ["(a && b) || c"]),
        ("${{ x == 'a && b' && y }}", ["x == 'a && b'", "y"]),
    ],
)
def test_conditions_split_only_at_top_level(expression: str, terms: list[str]) -> None:
    assert conjuncts(expression) == terms

"""The invoke command lines of .github/workflows/images.yml, read from the workflow itself.

The buildx engine tests run these lines (with the workflow's variables filled in), so a change to the
workflow changes what is tested; tests/unit/test_buildx_workflow.py fails when they lose a needed option.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGES_YML = REPO_ROOT / ".github" / "workflows" / "images.yml"
GPU_ATTEST_YML = REPO_ROOT / ".github" / "workflows" / "gpu-attest.yml"  # images.yml's gpu-verify job runs it
WORKFLOWS = (IMAGES_YML, GPU_ATTEST_YML)


@dataclass(frozen=True)
class WorkflowLine:
    """One `python -m invoke TASK ...` line of a workflow step."""

    job: str
    step: str
    argv: tuple[str, ...]  # as the shell would split it, variables still unexpanded

    @property
    def task(self) -> str:
        return self.argv[3]

    def filled(self, values: Mapping[str, str]) -> list[str]:
        """argv with ${VAR} filled from `values` (an unknown variable is an error, not an empty string)."""
        return [string.Template(arg).substitute(values) for arg in self.argv]


def invoke_lines(path: Path | None = None) -> list[WorkflowLine]:
    """Every `python -m invoke` line in the workflow's run steps (default: images.yml and what it calls)."""
    if path is None:
        return [w for p in WORKFLOWS for w in invoke_lines(p)]
    workflow = yaml.safe_load(path.read_text())
    found = []
    for job_name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            for line in str(step.get("run", "")).splitlines():
                argv = tuple(shlex.split(line.strip()))
                if argv[:3] == ("python", "-m", "invoke") and len(argv) > 3:
                    found.append(WorkflowLine(job_name, step.get("name", ""), argv))
    return found


def line(job: str, task: str, path: Path | None = None) -> WorkflowLine:
    """The one line of `job` that runs `task` (the merge job's publish, not the verify job's --promote)."""
    matches = [w for w in invoke_lines(path) if w.job == job and w.task == task]
    if len(matches) != 1:
        raise LookupError(
            f"{path or 'the workflows'}: expected one 'invoke {task}' in job {job}, found {len(matches)}"
        )
    return matches[0]

"""`invoke serve` / `serve.down` on this machine's engine with the real vLLM 0.33.0 image.

`vllm serve` cannot start without a GPU, so this exercises everything up to vLLM's own failure: preflight of
the profile, the exact container (GPU request off here, host IPC and network, caches, the HF token as a
mounted file only), the failure surfaced with its cause and last lines within seconds, and nothing left.
The health wait and the chat completion need a GPU (docs/run.md says where they were exercised).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import DOCKER

from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run.serve.serve import ChatReply

pytestmark = pytest.mark.engine
CI_RECIPE = str(REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml")
PROFILE = "qwen35-35b-a3b-fp8"


def _serve_containers() -> list[str]:
    return subprocess.run(
        [DOCKER, "ps", "-aq", "--filter", f"label=dev.sparkforge.run.profile={PROFILE}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def test_serve_surfaces_vllms_own_failure_and_leaves_nothing(vllm_image: str, tmp_path: Path) -> None:
    token = tmp_path / "hf_token"
    token.write_text("hf_serve_canary_5d2e\n")
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "serve",
            "--recipe",
            CI_RECIPE,
            "--profile",
            PROFILE,
            "--image",
            vllm_image,
            "--gpus",
            "none",
            "--hf-token-file",
            str(token),
            "--allow-unpinned-model",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--port",
            "18431",
            "--ulimit",
            "nofile=16384",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.monotonic() - start
    out = proc.stdout + proc.stderr
    print(out, f"\nserve until vLLM's failure was reported: {seconds:.1f} s")
    assert proc.returncode == 1
    plan = next(line for line in out.splitlines() if line.startswith("docker run"))
    for part in (
        "--network host", "--ipc host", "--cap-add IPC_LOCK", f"--volume {token}:/run/secrets/hf_token:ro",
        "--env HF_TOKEN_PATH=/run/secrets/hf_token", "--env VLLM_MARLIN_USE_ATOMIC_ADD=1", "--entrypoint vllm",
        "serve Qwen/Qwen3.5-35B-A3B-FP8", "--reasoning-parser qwen3", "--host 0.0.0.0 --port 18431",
    ):  # fmt: skip
        assert part in plan, part
    assert "--nnodes" not in plan and "--gpus" not in plan  # one node; --gpus none
    assert "hf_serve_canary_5d2e" not in out
    assert "exited with code 1: vLLM found no GPU in the container (Failed to infer device type)" in out
    assert "fix: run on a node with the NVIDIA Container Toolkit" in out and "last lines on" in out
    assert _serve_containers() == []
    down = subprocess.run(
        [sys.executable, "-m", "invoke", "serve.down", "--profile", PROFILE],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert down.returncode == 0 and "removed 0 container(s)" in down.stdout


def test_chat_reply_keeps_reasoning_and_answer_apart() -> None:
    """The reply shape of vLLM 0.33.0's chat_completion/protocol.py (`reasoning`; `reasoning_content` before)."""
    body = '{"choices": [{"message": {"role": "assistant", "reasoning": "17*23 = 391", "content": "391"}}]}'
    reply = ChatReply.parse(body)
    assert (reply.reasoning, reply.answer) == ("17*23 = 391", "391")
    assert ChatReply.parse(body.replace('"reasoning"', '"reasoning_content"')).reasoning == "17*23 = 391"

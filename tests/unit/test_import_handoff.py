"""Import hands off: the next command that fits (cluster.up with as many nodes for a multi-node recipe), the
memory plan when a checkpoint config is reachable here, and a chat-template file the container would not have
refused with the fix; a template beside the profile is mounted read-only with its sha256 (serve --dry).

Real: the `invoke` CLI in a subprocess on the community fixtures and the shipped profiles' checkpoint configs."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import sys
from pathlib import Path

from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.profile import PROFILES_DIR

FIXTURES = Path(__file__).parent / "fixtures" / "community"
SHIPPED = PROFILES_DIR / "qwen35-35b-a3b-fp8.yaml"


def invoke(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )


def test_a_two_node_recipe_hands_off_to_cluster_up_with_its_memory_plan(tmp_path: Path) -> None:
    out = tmp_path / "tp2.yaml"
    done = invoke("import", str(FIXTURES / "eugr-qwen35-122b-tp2.yaml"), "--out", str(out), "--no-preflight")
    assert done.returncode == 0, done.stderr
    nxt = next(line for line in done.stdout.splitlines() if line.startswith("next: "))
    assert nxt.startswith(
        f"next: invoke cluster.up --recipe R --profile {out} --nodes NODE0,NODE1 --interface IFACE"
    )
    assert "invoke serve " not in done.stdout  # serve refuses a 2-node profile: never suggested
    assert "--backend ray" in nxt and "--port 8888" in nxt and "--allow-unpinned-model" in nxt
    assert "# Next: invoke cluster.up" in out.read_text()
    # The plan, counted from the config shipped for the model (profiles/checkpoints/<org>/<model>/unpinned.json,
    # keyed by the model, never a profile's name), per node.
    assert "memory plan from the checkpoint config shipped for Qwen/Qwen3.5-122B-A10B-FP8" in done.stdout
    assert "node 0 (stage 0)" in done.stdout and "node 1 (stage 0)" in done.stdout
    # The recipe's 0.85 leaves a GB10's host less than its reserve: the band single-Spark owners run, warned.
    assert "verdict: tight" in done.stdout and "less than its 24 GiB reserve" in done.stdout
    assert "lower gpu-memory-utilization to 0.8" in done.stdout


def test_one_node_hands_off_to_serve_and_says_when_no_config_is_reachable(tmp_path: Path) -> None:
    src = tmp_path / "other.yaml"
    text = (FIXTURES / "eugr-qwen35-35b-solo.yaml").read_text()
    src.write_text(text.replace("Qwen/Qwen3.5-35B-A3B-FP8", "Qwen/Qwen3.5-9B"))
    out = tmp_path / "solo.yaml"
    done = invoke("import", str(src), "--out", str(out), "--no-preflight", "--offline")
    assert done.returncode == 0, done.stderr
    assert f"next: invoke serve --recipe R --profile {out} --allow-unpinned-model" in done.stdout
    assert "memory plan: no checkpoint config of Qwen/Qwen3.5-9B here" in done.stdout
    assert "profiles/checkpoints/solo.json" in done.stdout


def test_a_chat_template_on_the_sources_disk_is_refused_with_the_fix(tmp_path: Path) -> None:
    out = tmp_path / "mods.yaml"
    done = invoke("import", str(FIXTURES / "eugr-nemotron-mods.yaml"), "--out", str(out), "--no-preflight")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "left out:" in done.stderr and "names a file outside the profile's folder" in done.stderr
    assert "fix: put each file beside the profile" in done.stderr and "read-only" in done.stderr
    assert out.is_file() and "chat-template" not in out.read_text().split("\ndescription:", 1)[1]


def test_serve_mounts_a_template_beside_the_profile_read_only_with_its_sha256(tmp_path: Path) -> None:
    template = tmp_path / "qwen.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}\n")
    digest = hashlib.sha256(template.read_bytes()).hexdigest()
    beside = tmp_path / "beside.yaml"
    beside.write_text(SHIPPED.read_text().replace("\nargs:\n", "\nargs:\n  chat-template: qwen.jinja\n"))
    dry = invoke(
        "serve", "--recipe", "vllm-qwen35-wheels", "--profile", str(beside), "--dry", "--allow-unpinned-model"
    )
    assert dry.returncode == 0, dry.stderr
    argv = shlex.split(next(line for line in dry.stdout.splitlines() if line.startswith("docker run")))
    assert f"{template}:/etc/sparkforge/profile/qwen.jinja:ro" in argv
    assert argv[argv.index("--chat-template") + 1] == "/etc/sparkforge/profile/qwen.jinja"
    assert f"dev.sparkforge.run.files=qwen.jinja@sha256:{digest}" in argv
    assert f"(sha256 {digest}) mounted read-only" in dry.stdout

    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(
        SHIPPED.read_text().replace("\nargs:\n", "\nargs:\n  chat-template: /opt/t/qwen.jinja\n")
    )
    refused = invoke(
        "serve",
        "--recipe",
        "vllm-qwen35-wheels",
        "--profile",
        str(elsewhere),
        "--dry",
        "--allow-unpinned-model",
    )
    assert refused.returncode != 0
    assert f"{elsewhere}:" in refused.stderr and "args.chat-template" in refused.stderr
    assert f"fix: put the file beside the profile ({tmp_path}/qwen.jinja)" in refused.stderr
    assert "docker run" not in refused.stdout

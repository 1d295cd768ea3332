"""Importing a stranger's recipe runs none of the stranger's code and hands the token to no one: the hostile
recipes of the community-safety issue (v2 as published, and a v1 equivalent) through the real `invoke import`,
`invoke serve --dry` (with --force: imported community models have no shipped checkpoint config, so the memory
plan refuses them otherwise) and `recipes --catalog`; the interpreter-start chain on real CPython; the download phase's
own hub client (huggingface_hub) against two local hubs, the owner's and the recipe's."""

from __future__ import annotations

import http.server
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sparkforge.preflight.catalog import import_with, read_source
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.recipe.allowlist import env_verdict, flag_verdict, reviewed, value_digest
from sparkforge.recipe.community.toprofile import write_profile
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.profile import load_profile
from sparkforge.run.launch import TOKEN_MOUNT, LaunchOptions, plan_launch
from sparkforge.run.weights.weights import plan_downloads

HOSTILE = Path(__file__).parent / "fixtures" / "hostile"
CI_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"
# Every code-loading or trust-changing entry of each fixture: (the name as refused, its line in the file).
BAD = {
    "sparkarena-v2-hostile.yaml": {
        "--tool-parser-plugin": 6, "HF_ENDPOINT": 10, "PYTHONWARNINGS": 11, "BROWSER": 12,
        "NCCL_NET_PLUGIN": 13, "VLLM_SERVER_DEV_MODE": 14,
    },
    "eugr-v1-hostile.yaml": {
        "--logits-processors": 8, "--middleware": 8, "--worker-extension-cls": 8,
        "--model-loader-extra-config": 8, "--allowed-local-media-path": 8, "CUDA_INJECTION64_PATH": 18,
        "OPENSSL_CONF": 19, "https_proxy": 20, "LD_PRELOAD": 21, "VLLM_PLUGINS": 22, "NCCL_TUNER_PLUGIN": 23,
    },
}  # fmt: skip
# What each entry carries, which must reach no `docker run`.
PAYLOADS = ("qwen35_tools", "hf-mirror", "antigravity", "c2.example.net", "libnccl-net", "DEV_MODE", "qwen_tools",
            "tensorizer", "/run/secrets", "libinject", "openssl.cnf", "proxy.example", "libfast", "libtuner")  # fmt: skip


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    """A task of this checkout, as a user runs it (stdout, stderr and the exit code; no engine is reachable)."""
    run = [sys.executable, "-m", "invoke", *args]
    return subprocess.run(run, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False)


@pytest.mark.parametrize("name", sorted(BAD))
def test_hostile_recipes_import_with_every_entry_refused_and_none_reaches_docker_run(
    name: str, tmp_path: Path
) -> None:
    out = tmp_path / "p.yaml"
    done = _invoke("import", str(HOSTILE / name), "--out", str(out), "--recipe", str(CI_RECIPE), "--offline")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "imports cleanly" not in done.stdout
    refused = [line for line in done.stderr.splitlines() if line.startswith("refused: ")]
    assert len(refused) == len(BAD[name]), done.stderr
    for entry, line in BAD[name].items():
        assert any(
            f"{name}:{line}: " in r and f" {entry}: refused: " in r and "fix: " in r for r in refused
        ), entry
    text = out.read_text()  # written without them; the header names what was left out
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert not any(p in body for p in PAYLOADS) and "allow:" not in body
    assert sum(line.startswith("# refused, left out: ") for line in text.splitlines()) == len(BAD[name])
    dry = _invoke("serve", "--recipe", str(CI_RECIPE), "--profile", str(out), "--dry", "--no-preflight",
                  "--image", "sparkforge-test/none:1", "--allow-unpinned-model", "--force")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    docker = [shlex.split(line) for line in dry.stdout.splitlines() if line.startswith("docker run")]
    assert docker and not any(p in word for p in PAYLOADS for argv in docker for word in argv)
    assert any(word == "HF_HUB_OFFLINE=1" for word in docker[0])  # the serving container stays off the hub
    assert "# listens: OpenAI API: 0.0.0.0:8000" in dry.stdout and "without an API key" in dry.stdout


def test_an_opt_in_is_per_entry_written_with_its_reason_and_printed_by_every_launch(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    src = str(HOSTILE / "sparkarena-v2-hostile.yaml")
    owner = _invoke("import", src, "--out", str(out), "--no-preflight", "--allow", "HF_ENDPOINT=our mirror")
    assert owner.returncode != 0 and "no opt-in" in owner.stderr and not out.exists()
    done = _invoke("import", src, "--out", str(out), "--no-preflight",
                   "--allow", "tool-parser-plugin=reviewed qwen35_tools.py at 3f1c0ff",
                   "--allow", "VLLM_SERVER_DEV_MODE=debugging on an isolated box")  # fmt: skip
    assert done.returncode == 1  # the other four are still refused and named
    assert sum(line.startswith("refused: ") for line in done.stderr.splitlines()) == 4
    profile = load_profile(out)
    assert {k: reviewed(v)[0] for k, v in profile.model.allow.items()} == {
        "tool-parser-plugin": "reviewed qwen35_tools.py at 3f1c0ff",
        "VLLM_SERVER_DEV_MODE": "debugging on an isolated box",
    }
    # Each opt-in records the value it reviewed (its digest): a changed value voids it (test_community_values).
    assert reviewed(profile.model.allow["VLLM_SERVER_DEV_MODE"])[1] == value_digest("1")
    dry = _invoke("serve", "--recipe", str(CI_RECIPE), "--profile", str(out), "--dry", "--no-preflight",
                  "--image", "sparkforge-test/none:1", "--force")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    warnings = [line for line in dry.stdout.splitlines() if "opts in to" in line]
    assert len(warnings) == 2
    assert any("--tool-parser-plugin" in w and "reviewed qwen35_tools.py at 3f1c0ff" in w for w in warnings)
    assert any("VLLM_SERVER_DEV_MODE" in w and "debugging on an isolated box" in w for w in warnings)
    # Without a download phase vLLM would fetch with the token in the container that runs the opted-in plugin.
    token = tmp_path / "token"
    token.write_text("hf_opt_in_canary\n")
    for extra in (["--weights", "skip"], ["--gpus", "none"]):
        leak = _invoke("serve", "--recipe", str(CI_RECIPE), "--profile", str(out), "--dry", "--no-preflight",
                       "--image", "sparkforge-test/none:1", "--hf-token-file", str(token), "--force", *extra)  # fmt: skip
        assert (
            leak.returncode == 1 and "would download with your token in the serving container" in leak.stderr
        )
        assert "tool-parser-plugin" in leak.stderr and "drop --weights skip" in leak.stderr
        assert "docker run" not in leak.stdout and "hf_opt_in_canary" not in leak.stdout + leak.stderr
    docker = next(shlex.split(line) for line in dry.stdout.splitlines() if line.startswith("docker run"))
    assert "--tool-parser-plugin" in docker and "VLLM_SERVER_DEV_MODE=1" in docker
    # The pinned revision reaches the tokenizer and any code too (GHSA-3ww4-5jv9-j5gm).
    rev = "3f1c0ffee0000000000000000000000000000000"
    for flag in ("--revision", "--tokenizer-revision", "--code-revision"):
        assert docker[docker.index(flag) + 1] == rev
    # Export carries the opted-in entry (validated by importing it back with the same opt-ins) ...
    exported = tmp_path / "out.yaml"
    done = _invoke("export", "--profile", str(out), "--recipe", str(CI_RECIPE), "--out", str(exported))
    assert done.returncode == 0, done.stderr
    assert "--tool-parser-plugin" in exported.read_text()
    # ... and whoever imports that recipe meets the same refusal until they opt in themselves.
    again = _invoke("import", str(exported), "--out", str(tmp_path / "again.yaml"), "--no-preflight")
    assert again.returncode == 1 and " --tool-parser-plugin: refused: " in again.stderr


def test_a_hand_written_hostile_profile_is_refused_at_load_before_any_docker_run(tmp_path: Path) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(
        "description: d\nmodel: m\nargs:\n  tool-parser-plugin: /root/x.py\n  middleware: a.b\nenv:\n"
        "  PYTHONWARNINGS: all:0:antigravity.x:0:0\n  BROWSER: sh -c x\n  HF_ENDPOINT: http://127.0.0.1:1\n"
        "allow:\n  HF_ENDPOINT: but I want to\n"
    )
    done = _invoke("serve", "--recipe", "vllm-qwen35", "--profile", str(path), "--dry", "--no-preflight",
                   "--image", "sparkforge-test/none:1")  # fmt: skip
    assert done.returncode != 0 and "docker run" not in done.stdout
    assert "HF_ENDPOINT" in done.stderr and "no opt-in" in done.stderr
    path.write_text(path.read_text().split("allow:")[0])
    done = _invoke("serve", "--recipe", "vllm-qwen35", "--profile", str(path), "--dry", "--no-preflight",
                   "--image", "sparkforge-test/none:1")  # fmt: skip
    assert done.returncode != 0 and "docker run" not in done.stdout
    for line, entry in ((4, "tool-parser-plugin"), (5, "middleware"), (7, "PYTHONWARNINGS"), (8, "BROWSER"),
                        (9, "HF_ENDPOINT")):  # fmt: skip
        assert f"{path}:{line}: " in done.stderr and entry in done.stderr, entry


def test_the_catalog_names_every_entry_of_a_hostile_recipe() -> None:
    done = _invoke("recipes", "--catalog", str(HOSTILE), "--recipe", str(CI_RECIPE), "--offline")
    assert done.returncode == 0, done.stderr
    rows: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("    - ") and rows:
            rows[next(reversed(rows))].append(line)
        elif line.startswith(str(HOSTILE)):
            rows[line] = []
    for name, bad in BAD.items():
        head = next(r for r in rows if r.startswith(f"{HOSTILE}/{name}: "))
        assert head.startswith(f"{HOSTILE}/{name}: refused |"), head
        for entry in bad:
            assert any(f" {entry}: refused: " in note for note in rows[head]), entry
    assert (
        f"{len(list(HOSTILE.glob('*.yaml')))} refused" in done.stdout
    )  # round 2's (test_community_values) too


def test_the_interpreter_start_chain_runs_nothing_from_the_launch_plan(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    chain = {"PYTHONWARNINGS": "all:0:antigravity.x:0:0", "BROWSER": f"sh -c 'touch {marker}' %s"}
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    # The attack is real on this CPython: the chain runs a command at interpreter start.
    subprocess.run([sys.executable, "-c", "pass"], env={**base, **chain}, capture_output=True, timeout=60)
    assert marker.exists()
    marker.unlink()
    doc, where = read_source(str(HOSTILE / "sparkarena-v2-hostile.yaml"), make_fetcher(offline=True))
    profile = load_profile(write_profile(import_with(None, (doc, where)), tmp_path / "v2.yaml"))
    plan = plan_launch(profile, ["127.0.0.1"], [{}], LaunchOptions(image="img"))
    env = dict(plan.head.container.env)
    assert "PYTHONWARNINGS" not in env and "BROWSER" not in env
    subprocess.run([sys.executable, "-c", "pass"], env={**base, **env}, capture_output=True, timeout=60)
    assert not marker.exists()
    # Every variable the launch plan sets is on the allow-list (or sparkforge's own: the hub switch).
    assert all(env_verdict(k).status == "allowed" for k in env), env
    assert all(flag_verdict(k).status == "allowed" for k in profile.model.args)


class _Hub(http.server.BaseHTTPRequestHandler):
    requests: list[tuple[str, str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        type(self).requests.append((self.path, self.headers.get("Authorization", "")))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _answer


def _hub() -> tuple[type[_Hub], http.server.ThreadingHTTPServer]:
    handler = type("Hub", (_Hub,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return handler, server


def test_the_token_goes_only_to_the_owners_hub(tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub")
    recipe_hub, recipe_server = _hub()
    owner_hub, owner_server = _hub()
    try:
        source = (HOSTILE / "sparkarena-v2-hostile.yaml").read_text()
        recipe_url = f"http://127.0.0.1:{recipe_server.server_address[1]}"
        hostile = tmp_path / "hostile.yaml"
        hostile.write_text(source.replace("https://hf-mirror.example.net", recipe_url))
        doc, where = read_source(str(hostile), make_fetcher(offline=True))
        profile = load_profile(write_profile(import_with(None, (doc, where)), tmp_path / "v2.yaml"))
        token = tmp_path / "token"
        token.write_text("hf_" + "t" * 34)
        owner_url = f"http://127.0.0.1:{owner_server.server_address[1]}"
        options = LaunchOptions(image="img", hf_token_file=token, hf_endpoint=owner_url)
        (download,) = plan_downloads(profile, [0], options)
        spec = download.container
        env = {**spec.env, "HF_TOKEN_PATH": str(token), "HF_HOME": str(tmp_path / "hf"),
               "SPARKFORGE_PROGRESS_S": "0.2", "PATH": os.environ["PATH"]}  # fmt: skip
        assert spec.env["HF_TOKEN_PATH"] == TOKEN_MOUNT and recipe_url not in str(spec)
        done = subprocess.run(
            [sys.executable, *spec.args], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 1 and '"event": "failed"' in done.stdout  # our hub answers 404: no model
        assert recipe_hub.requests == []  # the recipe's endpoint heard nothing
        assert owner_hub.requests, done.stdout + done.stderr
        assert {auth for _, auth in owner_hub.requests} <= {"", "Bearer hf_" + "t" * 34}
        assert any(
            auth for _, auth in owner_hub.requests
        )  # the token went to the owner's hub, and only there
        # The pinned revision is what is asked for, never main.
        assert any("3f1c0ffee0000000000000000000000000000000" in path for path, _ in owner_hub.requests)
        assert not any("/main" in path for path, _ in owner_hub.requests)
    finally:
        recipe_server.shutdown()
        owner_server.shutdown()


def test_the_hub_is_the_owners_in_every_container_that_talks_to_it(tmp_path: Path, monkeypatch) -> None:
    token = tmp_path / "token"
    doc, where = read_source(str(HOSTILE / "sparkarena-v2-hostile.yaml"), make_fetcher(offline=True))
    profile = load_profile(write_profile(import_with(None, (doc, where)), tmp_path / "v2.yaml"))
    owner = "https://hub.owner.example"
    skip = LaunchOptions(image="img", hf_token_file=token, hf_endpoint=owner, weights="skip")
    env = plan_launch(profile, ["127.0.0.1"], [{}], skip).head.container.env
    assert env["HF_ENDPOINT"] == owner and env["HF_TOKEN_PATH"] == TOKEN_MOUNT  # vLLM downloads itself
    each = LaunchOptions(image="img", hf_token_file=token, hf_endpoint=owner)
    head = plan_launch(profile, ["127.0.0.1"], [{}], each).head.container
    assert (
        "HF_ENDPOINT" not in head.env
        and "HF_TOKEN_PATH" not in head.env
        and head.env["HF_HUB_OFFLINE"] == "1"
    )
    assert not any("token" in m for m in head.mounts)  # the serving container never sees the token
    (download,) = plan_downloads(profile, [0], each)
    assert download.container.env["HF_ENDPOINT"] == owner
    # The command line: --hf-endpoint, else the user's own HF_ENDPOINT; a non-URL is refused before anything runs.
    dry = ["serve", "--recipe", str(CI_RECIPE), "--profile", str(tmp_path / "v2.yaml"), "--dry", "--no-preflight",
           "--image", "sparkforge-test/none:1", "--force"]  # fmt: skip
    done = _invoke(*dry, "--hf-endpoint", "http://127.0.0.1:9/")
    assert done.returncode == 0 and "from http://127.0.0.1:9 into" in done.stdout, done.stderr
    bad = _invoke(*dry, "--hf-endpoint", "file:///etc/passwd")
    assert bad.returncode != 0 and "--hf-endpoint" in bad.stderr and "fix:" in bad.stderr  # refused as parsed
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.owner.example/")  # the user's own environment
    done = _invoke(*dry)
    assert done.returncode == 0 and "from https://mirror.owner.example into" in done.stdout, done.stderr


@pytest.mark.parametrize(
    ("written", "refused_as"),
    [("tool-parser-plug", "--tool-parser-plugin"), ("--worker-ext", "--worker-extension-cls"),
     ("logits_processors", "--logits-processors"), ("no-trust-remote-code", "--trust-remote-code")],
)  # fmt: skip
def test_a_code_loading_flag_is_refused_under_any_spelling_vllm_accepts(
    written: str, refused_as: str
) -> None:
    verdict = flag_verdict(written)
    assert verdict.status == "refused" and refused_as in f"--{verdict.name} {verdict.reason}", verdict


def test_the_token_never_reaches_a_serving_container_that_runs_the_model_repositorys_code(
    tmp_path: Path,
) -> None:
    from sparkforge.errors import RunError
    from sparkforge.run.launch import check_token_reach, serve_sees_token

    profile = load_profile("qwen35-122b-a10b-fp8-tp2")
    token = tmp_path / "token"
    skip = LaunchOptions(image="img", hf_token_file=token, weights="skip")
    assert serve_sees_token(skip) and not profile.model.allow
    check_token_reach(
        profile, skip
    )  # vLLM's own download, image code only: the owner's token to the owner's hub
    with pytest.raises(RunError, match=r"--weights skip vLLM would download.*--trust-remote-code"):
        check_token_reach(
            profile, LaunchOptions(image="img", hf_token_file=token, weights="skip", trust_remote_code=True)
        )
    check_token_reach(
        profile, LaunchOptions(image="img", hf_token_file=token, trust_remote_code=True)
    )  # downloads first
    check_token_reach(
        profile, LaunchOptions(image="img", weights="skip", trust_remote_code=True)
    )  # no token at all

"""Community recipes of both formats (our own fixtures, written from the formats' documented schemas) become
serve profiles whose launch plan runs the same vLLM argv as the source, compared token by token; the pinned
vLLM 0.33.0 (the CI recipe's wheel from PyPI, members only, cached) gives the short aliases and checks flags."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge.preflight.catalog import (
    ImportOptions,
    PinnedVllm,
    image_facts,
    import_with,
    preflight_notes,
    read_source,
    with_architecture,
)
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.recipe.community.toprofile import write_profile
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.recipe.profile import load_profile
from sparkforge.run.launch import LaunchOptions, plan_launch
from tests.recipe_files import write_recipe_file

FIXTURES = Path(__file__).parent / "fixtures" / "community"
CI_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"
ALL = sorted(p.name for p in FIXTURES.glob("*.yaml"))


@pytest.fixture(scope="module")
def pinned() -> PinnedVllm:
    return PinnedVllm(load_recipe(str(CI_RECIPE)), make_fetcher())


def imported_profile(pinned: PinnedVllm, name: str, tmp_path: Path):
    doc, where = read_source(str(FIXTURES / name), pinned.fetcher)
    imported = import_with(pinned, (doc, where))
    path = write_profile(imported, tmp_path / f"{imported.name}.yaml")
    return imported, load_profile(path)  # the same validation as a hand-written profile


def head_serve_argv(imported, profile) -> list[str]:
    """The head's `vllm serve` argv from the launch plan that `serve --dry` / `cluster.up --dry` print."""
    addresses = [f"10.0.0.{i + 1}" for i in range(profile.model.nodes)]
    options = LaunchOptions(
        image="img",
        port=imported.port,
        backend=imported.backend,
        trust_remote_code=imported.trust_remote_code,
    )
    head = plan_launch(profile, addresses, [{}] * len(addresses), options).head
    if head.exec_argv:  # Ray: the serve command is exec'd in the head container once Ray is up
        return list(head.exec_argv[1:])
    argv = list(head.container.args)
    if profile.model.nodes > 1:  # vLLM's own multi-node flags, which a single-host recipe cannot spell
        at = argv.index("--nnodes")
        assert argv[at : at + 8] == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29501"]  # fmt: skip
        del argv[at : at + 8]
    return argv


@pytest.mark.parametrize("name", ALL)
def test_imported_profile_runs_the_source_argv_token_by_token(pinned, name: str, tmp_path: Path) -> None:
    imported, profile = imported_profile(pinned, name, tmp_path)
    source = list(imported.source_argv)
    if imported.unmountable:  # a chat template on the source's disk is left out (and the import exits 1)
        at = source.index("--chat-template")
        del source[at : at + 2]
    assert head_serve_argv(imported, profile) == source
    assert profile.model.nodes == (2 if "122b" in name else 1)
    # Flags and parsers are known to the pinned vLLM (nothing from a mod or a typo).
    assert not [n for n in preflight_notes(imported, pinned) if "is not a `vllm serve` flag" in n.message]


# The argv each source runs, written out by hand from the fixture (an oracle independent of the parser).
HAND = {
    "eugr-qwen35-122b-tp2.yaml": "serve Qwen/Qwen3.5-122B-A10B-FP8 --tensor-parallel-size 2 "
    "--gpu-memory-utilization 0.85 --max-model-len 262144 --kv-cache-dtype fp8 "
    "--compilation-config.cudagraph_mode PIECEWISE --max-num-seqs 4 --reasoning-parser qwen3 "
    "--distributed-executor-backend ray --host 0.0.0.0 --port 8888",
    "eugr-qwen35-mtp.yaml": "serve Qwen/Qwen3.5-35B-A3B-FP8 --speculative-config "
    """'{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}' --compilation-config """
    """'{"cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 64}' --max-model-len 65536 """
    "--no-enable-prefix-caching --optimization-level 3 --trust-remote-code --host 0.0.0.0 --port 8000",
    "sparkarena-qwen35-solo.yaml": "serve Qwen/Qwen3.5-35B-A3B-FP8 --tensor-parallel-size 1 "
    "--gpu-memory-utilization 0.8 --max-model-len 131072 --enable-chunked-prefill --async-scheduling "
    "--revision 0123456789abcdef0123456789abcdef01234567 --tokenizer-revision 0123456789abcdef0123456789abcdef01234567 "
    "--code-revision 0123456789abcdef0123456789abcdef01234567 --served-model-name qwen35-a3b --host 0.0.0.0 --port 8000",
    "sparkarena-qwen35-mtp.yaml": "serve Qwen/Qwen3.5-35B-A3B-FP8 --speculative-config.method qwen3_next_mtp "
    '--speculative-config.num_speculative_tokens 3 --limit-mm-per-prompt \'{"image": 0, "video": 0}\' '
    "--max-model-len 32768 --host 0.0.0.0 --port 8010",
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_the_argv_matches_what_was_written_by_hand(pinned, name: str, tmp_path: Path) -> None:
    imported, profile = imported_profile(pinned, name, tmp_path)
    assert head_serve_argv(imported, profile) == shlex.split(HAND[name])


def test_what_cannot_be_carried_is_named(pinned, tmp_path: Path) -> None:
    imported, _ = imported_profile(pinned, "eugr-nemotron-mods.yaml", tmp_path)
    notes = "\n".join(str(n) for n in preflight_notes(imported, pinned))
    for mod in ("fix-nemotron-tool-parser", "install-extra-kernels"):
        assert f"patches/vllm/NNNN-{mod}.patch" in notes and "components.vllm.patches" in notes
    assert "eugr-nemotron-mods.yaml:8: build_args.0: build option '--tf5'" in notes
    # vLLM 0.33.0 requires fastsafetensors (its wheel's METADATA): the CI recipe's image has it, nothing to attend.
    assert "fastsafetensors" not in notes
    assert (
        "vLLM 0.33.0 (recipe ci-wheels-amd64) requires fastsafetensors>=0.3.3"
        in image_facts(imported, pinned)[0]
    )
    assert "chat_template.jinja" not in notes  # not a note: left out, and the import exits 1 (below)
    left_out = "\n".join(str(n) for n in imported.unmountable)
    assert "chat_template.jinja: names a file outside the profile's folder" in left_out, left_out
    assert "fix: put the file beside the profile" in left_out and "mounts it read-only" in left_out
    assert "chat-template" not in imported.document["args"]  # type: ignore[operator]
    tp2, _ = imported_profile(pinned, "eugr-qwen35-122b-tp2.yaml", tmp_path)
    assert tp2.backend == "ray" and "cluster.up --backend ray" in str(tp2.attention)
    env, env_profile = imported_profile(pinned, "sparkarena-qwen35-122b-env.yaml", tmp_path)
    assert len(env_profile.model.env) == 10 and "HF_TOKEN" not in env_profile.model.env
    assert "env.HF_TOKEN: dropped" in " ".join(map(str, env.attention))
    # Not a variable of the pinned vLLM 0.33.0 (vllm/envs.py) nor a reviewed one: named, never passed silently.
    assert "VLLM_SLEEP_WHEN_IDLE" not in env_profile.model.env
    assert "env.VLLM_SLEEP_WHEN_IDLE: dropped: VLLM_SLEEP_WHEN_IDLE: needs attention" in " ".join(
        map(str, env.attention)
    )
    mtp, mtp_profile = imported_profile(pinned, "eugr-qwen35-mtp.yaml", tmp_path)
    assert mtp.trust_remote_code and not any("trust" in k for k in mtp_profile.model.args)
    assert "--trust-remote-code" in mtp.text().splitlines()[1]  # the serve line says how to opt in


def test_import_task_writes_a_profile_that_serve_dry_runs(tmp_path: Path) -> None:
    out = tmp_path / "solo.yaml"
    run = [sys.executable, "-m", "invoke"]
    src = FIXTURES / "eugr-qwen35-35b-solo.yaml"
    done = subprocess.run([*run, "import", str(src), "--out", str(out), "--recipe", str(CI_RECIPE)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "imports cleanly" in done.stdout
    source = done.stdout.split("vllm argv the source runs: ", 1)[1].splitlines()[0]
    dry = subprocess.run([*run, "serve", "--recipe", str(CI_RECIPE), "--profile", str(out), "--dry", "--allow-unpinned-model"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    docker_line = next(line for line in dry.stdout.splitlines() if line.startswith("docker run"))
    assert shlex.split(docker_line)[-len(shlex.split(source)) :] == shlex.split(source)


def test_runner_extras_and_the_model_class(pinned, tmp_path: Path, monkeypatch) -> None:
    # The runner appends the words after `--` to the command; vLLM's parser lets the last one win.
    doc, where = read_source(str(FIXTURES / "eugr-qwen35-35b-solo.yaml"), pinned.fetcher)
    imported = import_with(
        pinned, (doc, where), ImportOptions(extra=("--max-model-len", "32768", "--seed", "7"))
    )
    assert imported.document["args"]["max-model-len"] == 32768 and imported.document["args"]["seed"] == 7  # type: ignore[index]
    assert imported.source_argv[-10:] == (
        "--tool-call-parser", "qwen3_coder", "--max-model-len", "32768", "--seed", "7", "--host", "0.0.0.0", "--port", "8000",
    )  # fmt: skip
    assert "131072" not in imported.source_argv  # the recipe's own value lost to the extra, as in vLLM
    # The model class from the HF cache's config.json, registered in the pinned vLLM: serve checks it in the image.
    snapshot = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3.5-35B-A3B-FP8" / "snapshots" / ("f" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"architectures": ["Qwen3_5MoeForConditionalGeneration"]}')
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with_class, line = with_architecture(imported, pinned, None)
    assert "registered in vLLM 0.33.0" in line
    profile = load_profile(write_profile(with_class, tmp_path / "solo.yaml"))
    assert profile.model.architecture == "Qwen3_5MoeForConditionalGeneration"


def test_fastsafetensors_named_when_the_image_lacks_it(tmp_path: Path) -> None:
    # vLLM 0.19.1 lists fastsafetensors only under its optional extra: an image of it lacks the package.
    older = write_recipe_file(
        tmp_path / "older.yaml",
        {"components": {"vllm": {"version": "0.19.1", "commit": "b1388b1fbf5aaef47937fabe98931211684666a6"}}},
        extends=CI_RECIPE,
    )
    pinned = PinnedVllm(load_recipe(str(older)), make_fetcher())
    imported, _ = imported_profile(pinned, "eugr-nemotron-mods.yaml", tmp_path)
    notes = [str(n) for n in preflight_notes(imported, pinned)]
    lacking = [n for n in notes if "fastsafetensors" in n]
    assert len(lacking) == 1 and "image does not install fastsafetensors" in lacking[0]
    assert "fix: use a recipe that installs it, or --load-format safetensors" in lacking[0]
    assert image_facts(imported, pinned) == []

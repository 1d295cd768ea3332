"""Round 2 of the hostile community recipes: flags harmless by name whose values load code, reach other
repositories or read files the recipe picks, and variables whose values load code, in both formats, through
the real `invoke import` and `invoke serve --dry`; the value kinds read from the pinned vLLM's own sources."""

from __future__ import annotations

import logging.config
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge.errors import ProfileError
from sparkforge.preflight.configvalues import check_value_kinds, stale_values, wheel_values
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.preflight.pypi import WheelTarget
from sparkforge.recipe import vllmvalues
from sparkforge.recipe.allowlist import value_digest
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.recipe.profile import load_profile
from sparkforge.report import Check

HOSTILE = Path(__file__).parent / "fixtures" / "hostile"
CI_RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"
# Every entry of each fixture that must not reach a container: (as named at import, refused or attention).
NAMED = {
    "eugr-v1-values.yaml": {
        "--compilation-config.backend": "refused", "--compilation-config.inductor_passes": "attention",
        "--structured-outputs-config.reasoning_parser_plugin": "refused",
        "--ec-manager-config.encoder_cache_manager_cls": "refused", "--speculative-config.model": "refused",
        "--hf-overrides.auto_map": "refused", "--tokenizer": "refused", "--code-revision": "refused",
        "--tokenizer-revision": "refused", "--chat-template": "refused", "VLLM_LOGGING_STREAM": "refused",
        "VLLM_NIC_SELECTION_VARS": "refused", "NCCL_SOCKET_IFNAME": "attention",
    },
    "sparkarena-v2-values.yaml": {
        "--compilation-config.backend": "refused", "--compilation-config.cache_dir": "refused",
        "--structured-outputs-config.reasoning_parser_plugin": "refused", "--speculative-config.model": "refused",
        "--lora-modules": "refused", "--revision": "refused", "VLLM_LOGGING_STREAM": "refused",
        "VLLM_NIC_SELECTION_VARS": "refused",
    },
}  # fmt: skip
PAYLOADS = ("qwen_tools", "rp.py", "code--cfg", "refs/pr", "main", "/run/secrets/hf_token",
            "snapshots/3f1c0ffee0000000000000000000000000000000/cc", "libnic", "ext://")  # fmt: skip
# Other repositories at no commit: written under repositories: as null, refused by every launch until pinned.
REPOS = ("qwen-community/drafter", "qwen-community/tokenizer", "qwen-community/lora")


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    run = [sys.executable, "-m", "invoke", *args]
    return subprocess.run(run, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False)


def test_the_catalog_refuses_both_round_two_recipes() -> None:
    done = _invoke("recipes", "--catalog", str(HOSTILE), "--recipe", str(CI_RECIPE), "--offline")
    assert done.returncode == 0, done.stderr
    for name, named in NAMED.items():
        head = next(line for line in done.stdout.splitlines() if line.startswith(f"{HOSTILE}/{name}: "))
        assert head.startswith(f"{HOSTILE}/{name}: refused |"), head
        for entry in named:
            assert f" {entry}: " in done.stdout, entry


def _dry(profile: Path) -> list[list[str]]:
    dry = _invoke("serve", "--recipe", str(CI_RECIPE), "--profile", str(profile), "--dry", "--no-preflight", "--force",
                  "--image", "sparkforge-test/none:1", "--allow-unpinned-model")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    return [shlex.split(line) for line in dry.stdout.splitlines() if line.startswith("docker run")]


@pytest.mark.parametrize("name", sorted(NAMED))
def test_every_value_class_is_refused_or_named_and_none_reaches_docker_run(name: str, tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    done = _invoke("import", str(HOSTILE / name), "--out", str(out), "--recipe", str(CI_RECIPE), "--offline")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.splitlines() + done.stdout.splitlines()
    refused = [line for line in lines if line.startswith("refused: ")]
    attention = [line for line in lines if line.startswith("needs attention: ")]
    for entry, how in NAMED[name].items():
        pool = refused if how == "refused" else attention
        assert any(f" {entry}: " in line and "fix: " in line for line in pool), (entry, done.stderr)
    assert len(refused) == sum(h == "refused" for h in NAMED[name].values()), refused
    text = out.read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert not any(p in body for p in PAYLOADS), body
    profile = load_profile(out)
    waiting = [r for r in REPOS if r in body]
    assert waiting and all(profile.model.repositories[r] is None for r in waiting)
    refusal = _invoke("serve", "--recipe", str(CI_RECIPE), "--profile", str(out), "--dry", "--no-preflight",
                      "--force", "--image", "sparkforge-test/none:1", "--allow-unpinned-model")  # fmt: skip
    assert refusal.returncode != 0 and "docker run" not in refusal.stdout
    assert "has no pinned commit" in refusal.stderr and "fix: write its full 40-hex commit" in refusal.stderr
    # Pinned, each reaches vLLM as the folder of its snapshot at the pin (fetched by the download container).
    commit = "c0ffee" + "1" * 34
    out.write_text(text.replace(": null", f": {commit}"))
    docker = _dry(out)
    assert docker and not any(p in word for p in PAYLOADS + REPOS for argv in docker for word in argv)
    serve = next(argv for argv in docker if "serve" in argv)
    for repo in waiting:
        folder = f"/root/.cache/huggingface/hub/models--{repo.replace('/', '--')}/snapshots/{commit}"
        assert any(folder in word for word in serve), (folder, serve)
    # The download container fetches each at its pin (the dry run prints it).
    dry = _invoke("serve", "--recipe", str(CI_RECIPE), "--profile", str(out), "--dry", "--no-preflight", "--force",
                  "--image", "sparkforge-test/none:1", "--allow-unpinned-model")  # fmt: skip
    line = next(x for x in dry.stdout.splitlines() if x.startswith("# container: the download"))
    download = shlex.split(line.split(": docker ", 1)[1])
    for repo in waiting:
        assert download[download.index(repo) + 1] == commit
    # What was clean in the same recipe is carried: the reviewed fields and values.
    profile = load_profile(out)
    if name.startswith("eugr"):
        assert profile.model.env["VLLM_MARLIN_USE_ATOMIC_ADD"] == "1"
    else:
        assert profile.model.env["VLLM_LOGGING_LEVEL"] == "DEBUG"
        rev = "3f1c0ffee0000000000000000000000000000000"
        assert all(profile.model.args[f] == rev for f in ("revision", "code-revision", "tokenizer-revision"))


def _recipe(tmp_path: Path, command: str, revision: str = "3f1c0ffee0000000000000000000000000000000") -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(
        f"recipe_version: 2\nmodel: q/m\nmodel_revision: {revision}\ncontainer: c:1\ncommand: >-\n  {command}\n"
    )
    return path


def test_a_revision_beside_the_pin_and_a_non_hub_model_are_refused(tmp_path: Path) -> None:
    other = "0" * 40
    done = _invoke("import", str(_recipe(tmp_path, f"vllm serve q/m --revision {other} --code-revision {other}")),
                   "--out", str(tmp_path / "a.yaml"), "--no-preflight")  # fmt: skip
    assert done.returncode == 1
    assert f"--revision {other}: refused: not the pinned model_revision" in done.stderr
    assert f"--code-revision {other}: refused" in done.stderr
    args = load_profile(tmp_path / "a.yaml").model.args
    assert args["revision"] == args["code-revision"] == "3f1c0ffee0000000000000000000000000000000"
    # A URI the loader fetches from elsewhere: its 40-hex "revision" pins nothing. Nothing is written.
    done = _invoke("import", str(_recipe(tmp_path, "vllm serve s3://bucket/model")), "--out",
                   str(tmp_path / "b.yaml"), "--no-preflight")  # fmt: skip
    assert done.returncode != 0 and "not a Hugging Face repository id" in done.stdout + done.stderr
    assert not (tmp_path / "b.yaml").exists()
    # A hand-written profile: the same judgement at load, before any docker run.
    hand = tmp_path / "hand.yaml"
    hand.write_text("description: d\nmodel: q/m\nargs:\n  revision: " + other + "\n  code-revision: main\n"
                    "  compilation-config: '{\"backend\": \"x.y:Z\"}'\n")  # fmt: skip
    done = _invoke("serve", "--recipe", str(CI_RECIPE), "--profile", str(hand), "--dry", "--no-preflight", "--force",
                   "--image", "sparkforge-test/none:1")  # fmt: skip
    assert done.returncode != 0 and "docker run" not in done.stdout
    assert (
        "--code-revision: refused" in done.stderr and "--compilation-config.backend: refused" in done.stderr
    )


def test_an_opt_in_covers_one_field_and_a_flag_opt_in_covers_none(tmp_path: Path) -> None:
    src = _recipe(tmp_path, "vllm serve q/m --kv-transfer-config "
                  "'{\"kv_connector\": \"NixlConnector\", \"kv_role\": \"kv_both\", \"kv_connector_module_path\": \"evil.mod\"}'")  # fmt: skip
    out = tmp_path / "p.yaml"
    done = _invoke("import", str(src), "--out", str(out), "--no-preflight",
                   "--allow", "kv-transfer-config=reviewed the NIXL connector",
                   "--allow", "kv-transfer-config.kv_connector=NIXL is vLLM's own")  # fmt: skip
    assert done.returncode == 1
    assert " --kv-transfer-config.kv_connector_module_path: refused: " in done.stderr
    assert "evil.mod" not in "\n".join(
        line for line in out.read_text().splitlines() if not line.startswith("#")
    )
    done = _invoke("import", str(src), "--out", str(out), "--no-preflight", "--force",
                   "--allow", "kv-transfer-config=reviewed the NIXL connector",
                   "--allow", "kv-transfer-config.kv_connector=NIXL is vLLM's own",
                   "--allow", "kv-transfer-config.kv_connector_module_path=our own module, reviewed")  # fmt: skip
    assert done.returncode == 0, done.stderr
    allow = load_profile(out).model.allow
    assert set(allow) == {"kv-transfer-config", "kv-transfer-config.kv_connector",
                          "kv-transfer-config.kv_connector_module_path"}  # fmt: skip
    dry = _invoke("serve", "--recipe", str(CI_RECIPE), "--profile", str(out), "--dry", "--no-preflight", "--force",
                  "--image", "sparkforge-test/none:1")  # fmt: skip
    warnings = [line for line in dry.stdout.splitlines() if "opts in to" in line]
    assert any(
        '--kv-transfer-config.kv_connector_module_path = "evil.mod" (sha256:' in w and "our own module" in w
        for w in warnings
    )
    # The opt-in recorded the value reviewed: the same entry with another value is refused at load.
    changed = out.read_text().replace("evil.mod", "other.mod")
    out.write_text(changed)
    done = _invoke("serve", "--recipe", str(CI_RECIPE), "--profile", str(out), "--dry", "--no-preflight", "--force",
                   "--image", "sparkforge-test/none:1")  # fmt: skip
    assert done.returncode != 0 and "docker run" not in done.stdout
    assert "a changed value voids the opt-in" in done.stderr and "kv_connector_module_path" in done.stderr
    # Export carries every opt-in, visibly: the entry, its value's digest and the reviewer's words.
    out.write_text(changed.replace("other.mod", "evil.mod"))
    exported = tmp_path / "out.yaml"
    done = _invoke("export", "--profile", str(out), "--recipe", str(CI_RECIPE), "--out", str(exported))
    assert done.returncode == 0, done.stderr
    head = [line for line in exported.read_text().splitlines() if line.startswith("# opt-in: ")]
    assert len(head) == 3 and any("kv_connector_module_path" in h and "our own module" in h for h in head)


def test_an_ext_value_of_the_logging_stream_imports_what_it_names(tmp_path: Path) -> None:
    """Why VLLM_LOGGING_STREAM is judged by value: Python's logging config, as vLLM hands it the variable,
    imports the module an ext:// value names (here a file planted on the path writes a marker)."""
    marker = tmp_path / "imported"
    (tmp_path / "planted_stream.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nimport sys\nout = sys.stderr\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        logging.config.dictConfig({"version": 1, "handlers": {"h": {"class": "logging.StreamHandler",
                                   "stream": "ext://planted_stream.out"}}, "loggers": {"x": {"handlers": ["h"]}}})  # fmt: skip
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("planted_stream", None)
    assert marker.exists()


def test_the_value_kinds_follow_the_pinned_vllm() -> None:
    """The snapshot (sparkforge/recipe/vllmvalues.py) is what preflight's reader finds in the pinned wheel:
    vllm/config's classes, arg_utils, the serve entrypoint's arguments and envs.py."""
    recipe = load_recipe(str(CI_RECIPE))
    vllm = recipe.model.components.vllm
    assert vllm.version == vllmvalues.VERSION
    target = WheelTarget.of(recipe.model.platforms[0], recipe.model.python)
    surface = wheel_values(make_fetcher(), vllm.package or "vllm", vllm.version, target)
    assert stale_values(surface) == []
    check = Check("serve-values", "passed")
    check_value_kinds(check, lambda: surface, f"vLLM {vllm.version}")  # what preflight reports per recipe
    assert check.status == "passed" and "match vLLM 0.33.0" in check.reason, check.reason
    assert surface.flags["compilation-config"] == "CompilationConfig"
    assert surface.classes["StructuredOutputsConfig"]["reasoning_parser_plugin"] == "str"
    assert (
        surface.env["VLLM_LOGGING_STREAM"] == "str"
        and surface.env["VLLM_MARLIN_USE_ATOMIC_ADD"] == "truthy:1"
    )


def test_the_dry_run_prints_every_container_the_task_starts(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text(
        "description: d\nmodel: q/m\narchitecture: Qwen3_5MoeForConditionalGeneration\nargs:\n"
        "  revision: 3f1c0ffee0000000000000000000000000000000\nenv:\n  VLLM_LOGGING_LEVEL: DEBUG\n"
        "  NCCL_DEBUG: WARN\n"
    )
    token = tmp_path / "token"
    token.write_text("hf_dry_run_canary_0123456789\n")
    dry = _invoke("serve", "--recipe", str(CI_RECIPE), "--profile", str(profile), "--dry", "--no-preflight", "--force",
                  "--image", "sparkforge-test/none:1", "--hf-token-file", str(token))  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    arch = next(line for line in lines if line.startswith("# container: the architecture check"))
    download = next(line for line in lines if line.startswith("# container: the download"))
    serving = [line for line in lines if line.startswith("docker run")]
    assert len(serving) == 1
    # The architecture check runs the image with the profile's environment: shown, with its program by digest.
    argv = shlex.split(arch.split(": docker ", 1)[1])
    assert argv[:4] == ["run", "--rm", "--network", "none"] and "VLLM_LOGGING_LEVEL=DEBUG" in argv
    assert any(w.startswith("<program: ") for w in argv) and argv[-1] == "Qwen3_5MoeForConditionalGeneration"
    # The download holds the token file (mounted read-only), never its content; only hub switches in its env.
    argv = shlex.split(download.split(": docker ", 1)[1])
    assert f"{token}:/run/secrets/hf_token:ro" in argv and "HF_TOKEN_PATH=/run/secrets/hf_token" in argv
    assert "VLLM_LOGGING_LEVEL=DEBUG" not in argv and "NCCL_DEBUG=WARN" not in argv
    assert "hf_dry_run_canary" not in dry.stdout + dry.stderr


def test_an_opt_in_named_like_both_a_variable_and_a_flag_opens_neither(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    digest = value_digest("a.b")
    path.write_text(
        "description: d\nmodel: q/m\nargs:\n  middleware: a.b\nenv:\n  middleware: a.b\n"
        f"allow:\n  middleware: reviewed [sha256:{digest}]\n"
    )
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert "names a variable and a flag alike: it opens neither" in str(info.value)
    path.write_text(path.read_text().replace("env:\n  middleware: a.b\n", ""))
    assert load_profile(path).model.allow  # the flag alone, opted in at its reviewed value, loads

"""Hostile serve profiles: every arg is checked as the argv item it becomes, env shares the recipe deny list,
secrets are refused, numbers are finite and in range; `trust-remote-code` comes only from the command line."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sparkforge.errors import ProfileError
from sparkforge.recipe import vllmnames
from sparkforge.recipe.allowlist import (
    CODE_FLAGS,
    REFUSED_ENV,
    RESOURCE_ENV,
    TRUST_FLAGS,
    env_verdict,
    flag_verdict,
)
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.profile import ProfileModel, load_profile
from sparkforge.recipe.serveargs import RESERVED_FLAGS
from sparkforge.run.launch import LaunchOptions, plan_launch

BASE = {"description": "d", "model": "Qwen/Qwen3.5-35B-A3B-FP8"}
NEGATIVE = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _profile(tmp_path: Path, **keys: object) -> Path:
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump({**BASE, **keys}, sort_keys=False))
    return path


def _refused(tmp_path: Path, needle: str, **keys: object) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile(_profile(tmp_path, **keys))
    message = str(info.value)
    assert needle in message, message
    assert str(tmp_path / "hostile.yaml") in message and "fix:" in message, message
    return message


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"middleware": ["a.b", "--trust-remote-code"]}, "would be read as another flag"),
        ({"max-model-len": ["4096", "--trust-remote-code"]}, "takes one number"),
        ({"tool-call-parser": "--port=9999"}, "would be read as another flag"),
        ({"served-model-name": "-x"}, "served_model_name"),
        ({"reasoning-parser": "-H"}, "would be read as another flag"),
        ({"trust-remote-code": True}, "command line only"),
        ({"trust_remote_code": True}, "command line only"),
        ({"no-trust-remote-code": True}, "command line only"),
        ({"trust-remote": True}, "abbreviation"),
        ({"por": 9000}, "abbreviation"),
        ({"host": "0.0.0.0"}, "is set by"),
        ({"Port": 1}, "not a vLLM flag name"),
        ({"master_port": 1}, "is set by"),
        ({"config": "/models/args.yaml"}, "--config file"),
        ({"headless.x": True}, "is set by"),
        ({"--port": 1}, "without dashes"),
        ({"max-num-seqs": 4, "max_num_seqs": 8}, "same vLLM flag"),
        ({"chat-template": []}, "empty list"),
        ({"chat-template": [["a"]]}, "is not a flag value"),
        ({"chat-template": {"a": 1}}, "is not a flag value"),
        ({"x": "line\nbreak"}, "one line"),
        ({"x": "nul\x00"}, "one line"),
        ({"chat-template": "t.jinja --trust-remote-code"}, "more flags inside one value"),
    ],
)
def test_flags_cannot_be_smuggled(tmp_path: Path, args: dict, needle: str) -> None:
    _refused(tmp_path, needle, args=args)


@pytest.mark.parametrize("text", ["two\nlines", "\x1b[2Jclear", "", "x" * 301])
def test_a_description_is_one_printable_line(tmp_path: Path, text: str) -> None:
    _refused(tmp_path, "description", description=text)


@pytest.mark.parametrize("name", ["--rm", "a b", "UPPER", "x;y", "-p"])
def test_a_profile_name_becomes_container_names_so_it_is_checked(tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(BASE))
    with pytest.raises(ProfileError, match="is the profile's name"):
        load_profile(path)


def test_tensor_parallel_under_another_spelling_is_still_counted(tmp_path: Path) -> None:
    _refused(tmp_path, "tensor-parallel-size 4", args={"tensor_parallel_size": 4})


@pytest.mark.parametrize("model", ["--trust-remote-code", "-m", "a model", "x\ny", "", "Qwen/Q;rm -rf /"])
def test_a_model_is_an_id_or_path_never_a_flag(tmp_path: Path, model: str) -> None:
    _refused(tmp_path, "model", model=model)


# Variables that change how every process finds and loads code (or where pip and TLS look).
LOADER_ENV = ("PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
              "PYTHONUSERBASE", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "BASH_ENV", "ENV", "SHELL", "IFS", "HOME",
              "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CUDA_HOME")  # fmt: skip


@pytest.mark.parametrize("name", [*LOADER_ENV, "LD_DEBUG", "DYLD_INSERT_LIBRARIES", "ld_preload"])
def test_profile_env_refuses_what_recipes_refuse(tmp_path: Path, name: str) -> None:
    _refused(tmp_path, "refused", env={name: "x"})


@pytest.mark.parametrize(
    ("where", "keys"),
    [
        ("env", {"env": {"OPENAI_API_KEY": "x"}}),
        ("env", {"env": {"VLLM_API_KEY": "x"}}),
        ("env", {"env": {"HF_TOKEN": "x"}}),
        ("env", {"env": {"AWS_SECRET_ACCESS_KEY": "x"}}),
        ("env", {"env": {"DB_PASSWORD": "x"}}),
        ("env", {"env": {"HARMLESS": "hf_" + "a" * 34}}),
        ("env", {"env": {"HARMLESS": "sk-" + "b" * 40}}),
        ("args", {"args": {"api-key": "hunter2"}}),
        ("args", {"args": {"hf-token": "x"}}),
        ("args", {"args": {"chat-template": "ghp_" + "c" * 36}}),
        ("args", {"args": {"middleware": ["AKIAABCDEFGHIJKLMNOP"]}}),
    ],
)
def test_secrets_are_mounted_files_only(tmp_path: Path, where: str, keys: dict) -> None:
    _refused(tmp_path, "docker inspect", **keys)


def test_secret_like_names_that_are_not_secrets_pass(tmp_path: Path) -> None:
    profile = load_profile(
        _profile(
            tmp_path,
            env={"TOKENIZERS_PARALLELISM": "false"},
            args={"max-num-batched-tokens": 8192, "tokenizer-mode": "auto"},
        )
    )
    assert profile.serve_args() == ["--max-num-batched-tokens", "8192", "--tokenizer-mode", "auto"]


@pytest.mark.parametrize(
    ("keys", "needle"),
    [
        ({"nodes": -1}, "nodes"),
        ({"nodes": 1.5}, "nodes"),
        ({"nodes": [1, 2]}, "nodes"),
        ({"nodes": "2"}, "nodes"),
        ({"nodes": True}, "nodes"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"args": {"tensor-parallel-size": -2}}, "at least 1"),
        ({"args": {"tensor-parallel-size": [1, 2]}}, "takes one number"),
        ({"args": {"gpu-memory-utilization": math.inf}}, "finite"),
        ({"args": {"gpu-memory-utilization": math.nan}}, "finite"),
        ({"args": {"gpu-memory-utilization": 1.5}}, "fraction"),
        ({"args": {"gpu-memory-utilization": "nan"}}, "finite"),
        ({"args": {"max-model-len": -5}}, "at least 1"),
        ({"args": {"max-model-len": "-5"}}, "at least 1"),
        ({"args": {"max-num-seqs": 10**30}}, "out of range"),
        ({"args": {"swap-space": -3}}, "negative"),
        ({"args": {"data-parallel-rpc-port": 70000}}, "not a port"),
        ({"args": {"data-parallel-rpc-port": 0}}, "not a port"),
    ],
)
def test_numbers_are_checked(tmp_path: Path, keys: dict, needle: str) -> None:
    _refused(tmp_path, needle, **keys)


def test_trust_remote_code_comes_only_from_the_command_line(tmp_path: Path) -> None:
    profile = load_profile(_profile(tmp_path))
    plain = plan_launch(profile, ["127.0.0.1"], [{}], LaunchOptions(image="i"))
    trusted = plan_launch(profile, ["127.0.0.1"], [{}], LaunchOptions(image="i", trust_remote_code=True))
    assert "--trust-remote-code" not in plain.head.docker_argv()
    assert "--trust-remote-code" in trusted.head.docker_argv()


# ---- property: whatever a profile's args hold, the argv it becomes has no flag the profile did not name ----

_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(
        ["--port", "-x", "--trust-remote-code", "8000 --host x", "-1", "1e400", "inf", "hf_" + "z" * 30]
    ),
)
_values = st.one_of(
    _scalars, st.lists(_scalars, max_size=4), st.lists(st.lists(_scalars, max_size=2), max_size=2)
)
_keys = st.one_of(
    st.sampled_from(
        [
            *RESERVED_FLAGS,
            "max-model-len",
            "tensor-parallel-size",
            "api-key",
            "tp",
            "x.y",
            "no-port",
            *CODE_FLAGS,
            *TRUST_FLAGS,
            *sorted(vllmnames.FLAGS),
        ]
    ),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_.0123456789A", min_size=1, max_size=20),
)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.dictionaries(_keys, _values, max_size=4), model=st.text(max_size=40))
def test_any_profile_is_refused_or_yields_only_its_own_flags(args: dict, model: str) -> None:
    try:
        loaded = ProfileModel.model_validate({**BASE, "model": model or "m", "args": args})
    except ValidationError:
        return  # refused with a message (a ValidationError, never a TypeError or OverflowError)
    from sparkforge.recipe.profile import Profile

    argv = Profile("p", Path("p.yaml"), loaded, {}).serve_args()
    named = {f"--{k}" for k in args} | {f"--no-{k}" for k in args}
    for item in argv:
        if item.startswith("-") and not NEGATIVE.fullmatch(item):  # argparse reads -1 as a value
            assert item in named, (item, args)
            flag = item.removeprefix("--").removeprefix("no-").replace("_", "-").split(".")[0]
            assert flag not in RESERVED_FLAGS, (item, args)
            assert flag_verdict(flag).status == "allowed", (
                item,
                args,
            )  # only what the allow-list lets through
        assert "\n" not in item and "\0" not in item
    assert not loaded.model.startswith("-")
    for value in args.values():
        for number in value if isinstance(value, list) else [value]:
            if isinstance(number, float):
                assert math.isfinite(number)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    env=st.dictionaries(
        st.one_of(
            st.text(max_size=20),
            st.sampled_from(
                sorted({*vllmnames.ENV, *RESOURCE_ENV, *REFUSED_ENV, "PYTHONWARNINGS", "BROWSER"})
            ),
        ),
        st.one_of(st.text(max_size=40), st.integers()),
        max_size=4,
    )
)
def test_any_profile_env_is_refused_or_clean(env: dict) -> None:
    try:
        loaded = ProfileModel.model_validate({**BASE, "env": env})
    except ValidationError:
        return
    for name, value in loaded.env.items():
        assert name.upper() not in LOADER_ENV and not name.upper().startswith(("LD_", "DYLD_"))
        assert env_verdict(name).status == "allowed", name  # the allow-list's verdict, no opt-in given
        assert isinstance(value, str) and "\n" not in value


# ---- the command line: a hostile profile ends in one paragraph and a non-zero exit, before any engine ----


def _invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_serve_with_a_hostile_profile_exits_cleanly_before_the_engine(tmp_path: Path) -> None:
    path = _profile(tmp_path, args={"middleware": ["x", "--trust-remote-code"]})
    # An engine address that cannot answer: reaching it would show as a different error (or a hang).
    result = _invoke(
        "serve", "--recipe", "vllm-qwen35", "--profile", str(path), "--no-preflight", "--dry",
        env={"DOCKER_HOST": "tcp://192.0.2.1:9"},
    )  # fmt: skip
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    assert "would be read as another flag" in result.stderr and "fix:" in result.stderr


def test_serve_trust_remote_code_is_printed_loudly(tmp_path: Path) -> None:
    path = _profile(tmp_path)
    result = _invoke(
        "serve", "--recipe", "vllm-qwen35", "--profile", str(path), "--no-preflight", "--dry",
        "--image", "sparkforge-test/none:1", "--trust-remote-code", "--allow-unpinned-model",
        "--force",  # the base profile asks vLLM's default utilization (0.92): the memory plan refuses it
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "--trust-remote-code: vLLM will run Python code from the model's repository" in result.stderr
    assert "--trust-remote-code" in result.stdout  # the plan shows it on the serve command

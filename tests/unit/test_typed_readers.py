"""The values inside the files sparkforge reads, typed before any arithmetic (sparkforge/recipe/typedfile.py): the
checkpoint config.json of `invoke memory --model-dir` (and every command that prints the plan first), the
profile's speculative config. Each refusal names the file, the key, the value and the fix; never a traceback,
never a hang, never a silent fall-back to the shipped config."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkforge.errors import RunError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run.memory.checkpoint import parse_architecture
from sparkforge.run.memory.configtypes import check_speculative

SHIPPED = REPO_ROOT / "profiles" / "checkpoints" / "Qwen" / "Qwen3.5-35B-A3B-FP8" / "unpinned.json"
OFFLINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "HTTPS_PROXY": "http://127.0.0.1:9"}


def _config(path: list[str], value: object, *, drop: tuple[str, ...] = ()) -> dict:
    config = copy.deepcopy(json.loads(SHIPPED.read_text()))
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    for key in drop:
        node.pop(key, None)
    return config


HOSTILE = [
    (["text_config", "num_attention_heads"], 0, "'text_config.num_attention_heads' is 0"),
    (["text_config", "num_key_value_heads"], 0, "'text_config.num_key_value_heads' is 0"),
    (["text_config", "num_key_value_heads"], 3, "must divide num_attention_heads"),
    (["text_config", "head_dim"], 0, "'text_config.head_dim' is 0"),
    (["text_config", "hidden_size"], "3072", "'text_config.hidden_size' is '3072'"),
    (["text_config", "hidden_size"], 3072.0, "'text_config.hidden_size' is 3072.0"),
    (["text_config", "num_hidden_layers"], 10**11, "'text_config.num_hidden_layers' is 100000000000"),
    (["text_config", "num_hidden_layers"], True, "'text_config.num_hidden_layers' is True"),
    (["text_config", "num_experts_per_tok"], 0, "num_experts_per_tok 0 must be from 1"),
    (["text_config", "vocab_size"], -5, "'text_config.vocab_size' is -5"),
    (["text_config", "dtype"], "\x1b[31mred", "'text_config.dtype' is '\\x1b[31mred'"),
    (["quantization_config", "weight_block_size"], [0, 0], "'quantization_config.weight_block_size.0' is 0"),
    (["vision_config", "depth"], 10**12, "'vision_config.depth' is 1000000000000"),
]


@pytest.mark.parametrize(
    ("path", "value", "needle"), HOSTILE, ids=[f"{'.'.join(p)}={v!r}"[:40] for p, v, _ in HOSTILE]
)
def test_hostile_checkpoint_values_are_refused_before_the_arithmetic(
    path: list[str], value: object, needle: str
) -> None:
    start = time.monotonic()
    with pytest.raises(RunError) as info:
        parse_architecture(_config(path, value), "model/config.json")
    message = str(info.value)
    assert time.monotonic() - start < 1
    assert message.startswith("model/config.json: key ") and needle in message and "fix:" in message, message


def test_ten_to_the_eleven_layers_without_layer_types_is_refused_at_once() -> None:
    config = _config(["text_config", "num_hidden_layers"], 10**11, drop=("layer_types",))
    start = time.monotonic()
    with pytest.raises(RunError, match="num_hidden_layers' is 100000000000"):
        parse_architecture(config, "c.json")
    assert time.monotonic() - start < 1  # the list of layer types is never built


def test_the_shipped_checkpoints_pass() -> None:
    for path in sorted((REPO_ROOT / "profiles" / "checkpoints").rglob("*.json")):
        assert parse_architecture(json.loads(path.read_text()), str(path)).layers > 0


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"method": "mtp", "num_speculative_tokens": 1e300}, "'num_speculative_tokens' is 1e+300"),
        ({"method": "mtp", "num_speculative_tokens": 0}, "'num_speculative_tokens' is 0"),
        ({"method": "mtp", "num_speculative_tokens": "2"}, "'num_speculative_tokens' is '2'"),
        ({"method": "m\nx", "num_speculative_tokens": 2}, "'method'"),
    ],
)
def test_speculative_config_bounds(spec: dict, needle: str) -> None:
    from sparkforge.errors import InputError

    with pytest.raises(InputError) as info:
        check_speculative(spec, "profile flag --speculative-config")
    assert needle in str(info.value) and "fix:" in str(info.value)
    assert check_speculative({"method": "mtp", "num_speculative_tokens": 2}, "x").num_speculative_tokens == 2


def _memory(model_dir: Path | str, env_home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "memory", "-r", "vllm-qwen35", "-p", "qwen35-35b-a3b-fp8", "--model-dir",
         str(model_dir)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **OFFLINE, "HOME": str(env_home)},
    )  # fmt: skip


def test_memory_refuses_a_zero_divisor_through_the_command_line(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(_config(["text_config", "head_dim"], 0)))
    result = _memory(model, tmp_path)
    text = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in text, text
    assert f"{model}/config.json: key 'text_config.head_dim' is 0" in text and "fix:" in text


@pytest.mark.parametrize("shape", ["fifo", "folder", "missing", "link-out"])
def test_a_config_json_that_is_not_a_file_is_refused_never_the_shipped_one_instead(
    tmp_path: Path, shape: str
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    config = model / "config.json"
    if shape == "fifo":
        os.mkfifo(config)
    elif shape == "folder":
        config.mkdir()
    elif shape == "link-out":
        config.symlink_to("/etc/passwd")
    start = time.monotonic()
    result = _memory(model, tmp_path)
    text = result.stdout + result.stderr
    assert time.monotonic() - start < 30
    assert result.returncode != 0 and "Traceback" not in text and "verdict" not in text, text
    assert str(model) in text and "fix:" in text


# Golden files: logprobs that are log probabilities, no token twice in one top list.
def _golden(tmp_path: Path, top: object) -> Path:
    path = tmp_path / "golden.json"
    data = {
        "format": "sparkforge-golden/1",
        "model": {"model": "m"},
        "token_ids": [[5, 6]],
        "top_logprobs": top,
    }
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("top", "needle"),
    [
        ([[[[5, 1e308]], [[6, -1.0]]]], "key 'top_logprobs.0.0.0.1' is 1e+308"),
        ([[[[5, -0.1], [5, -0.2]], [[6, -1.0]]]], "a token id appears twice in its top list"),
        ([[[[5, "-0.1"]], [[6, -1.0]]]], "key 'top_logprobs.0.0.0.1' is '-0.1'"),
        ([[[[-5, -0.1]], [[6, -1.0]]]], "key 'top_logprobs.0.0.0.0' is -5"),
        ([[[[5, -0.1]]]], "prompt 0: 1 top lists for 2 tokens"),
    ],
)
def test_golden_values_are_typed(tmp_path: Path, top: object, needle: str) -> None:
    from sparkforge.run.conform.golden import read_golden

    path = _golden(tmp_path, top)
    with pytest.raises(RunError) as info:
        read_golden(path, "m", {})
    message = str(info.value)
    assert f"golden file {path}" in message and needle in message and "fix:" in message, message


def test_a_golden_with_log_probabilities_passes(tmp_path: Path) -> None:
    from sparkforge.run.conform.golden import read_golden

    golden = read_golden(_golden(tmp_path, [[[[5, -0.1], [7, -2.5]], [[6, 0.0]]]]), "m", {})
    assert golden.decodes()[0].top[0] == {5: -0.1, 7: -2.5}


# /metrics: one reader; a series twice is refused (not summed), an infinite counter too (not 'nan of nan').
METRICS = [
    ('vllm:prefix_cache_hits_total{engine="0"} 5\n' * 3, "appears twice"),
    ('vllm:prefix_cache_hits_total{engine="0"} +Inf\n', "is inf, not a finite count"),
    ('vllm:prefix_cache_hits_total{engine="0"} NaN\n', "is nan, not a finite count"),
    ('vllm:prefix_cache_hits_total{engine="0"} -3\n', "is -3.0, not a finite count"),
    ("vllm:prefix_cache_hits_total{engine=0} five\n", "'five' is not a number"),
]


@pytest.mark.parametrize(("body", "needle"), METRICS)
def test_metrics_from_a_real_server_are_typed(body: str, needle: str) -> None:
    from http.server import BaseHTTPRequestHandler

    from conform_http import http_server

    from sparkforge.run.conform.client import OpenAIClient, counter

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            raw = body.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    with http_server(Metrics) as base:
        text = OpenAIClient(base, "m").metrics()
    with pytest.raises(RunError) as info:
        counter(text, "vllm:prefix_cache_hits")
    assert needle in str(info.value) and "/metrics" in str(info.value) and "fix:" in str(info.value)


def test_metrics_over_label_sets_are_summed() -> None:
    from sparkforge.run.conform.client import counter

    text = '# TYPE x counter\nvllm:prefix_cache_hits_total{engine="0"} 5\nvllm:prefix_cache_hits_total{engine="1"} 7\n'
    assert counter(text, "vllm:prefix_cache_hits") == 12.0


# The bench store: links planted in it are never followed, for reading or writing.
def test_the_bench_store_does_not_follow_links(tmp_path: Path) -> None:
    from sparkforge.run.bench import store

    result = json.loads(
        (REPO_ROOT / "benchmarks" / "results" / "real" / "bench-cpu-twin-default.json").read_text()
    )
    root = tmp_path / "store"
    saved = store.save(result, json.dumps(result), root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.json").write_text(json.dumps(result))
    (root / ("sha256-" + "b" * 64)).symlink_to(outside)  # a folder link: another store's results
    (saved.parent / "linked.json").symlink_to(outside / "x.json")  # a file link
    found, unreadable = store.entries(root)
    assert [s.path for s in found] == [saved.resolve()] and unreadable == []
    # writing: the image's folder planted as a link out is refused, never written through
    key = store.image_key(result["identity"]["image"])
    other = tmp_path / "store2"
    other.mkdir()
    (other / key).symlink_to(outside)
    with pytest.raises(Exception, match="a symlink or file is there"):
        store.save(result, json.dumps(result), other)
    assert sorted(p.name for p in outside.iterdir()) == ["x.json"]

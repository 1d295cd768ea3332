"""Bad community recipes: one-paragraph errors naming the file and the key, and nothing written; vLLM's own
argv rules (aliases, -O3, dotted forms, --no-, last wins) read as vLLM's parser reads them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge.errors import RecipeError
from sparkforge.preflight.catalog import ImportOptions, import_with, read_source
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.recipe.community.toprofile import write_profile
from sparkforge.recipe.community.vllmargv import FALLBACK_ALIASES, parse_serve, split_command
from sparkforge.recipe.loader import REPO_ROOT

GOOD = """recipe_version: "1"
name: t
container: vllm-node
defaults:
  port: 8000
command: |
  vllm serve org/model \\
      --max-model-len 4096 \\
      --port {port}
"""


def _import(path: Path, out: Path) -> None:
    doc, where = read_source(str(path), make_fetcher(timeout=5, retries=0))
    write_profile(import_with(None, (doc, where)), out)


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        (
            ("vllm serve org/model", "bash -c vllm serve org/model"),
            ["bad.yaml", "command", "not `vllm serve`"],
        ),
        (
            ("--max-model-len 4096", "--max-model-len {max_len}"),
            ["bad.yaml:6: command", "{max_len} has no value"],
        ),
        (
            ("name: t", "name: t\ngpu: gb10"),
            ["bad.yaml:3", "unknown top-level key 'gpu'", "nothing is ignored"],
        ),
        (
            ("--max-model-len 4096", "--served-model-name $(hostname)"),
            ["bad.yaml:6: command", "command substitution"],
        ),
        (
            ("--max-model-len 4096", "--max-model-len 4096; rm -rf /"),
            ["bad.yaml:6: command", "';' outside quotes"],
        ),
        (
            ("--max-model-len 4096", "--max-model-len 4096 | tee log"),
            ["bad.yaml:6: command", "'|' outside quotes"],
        ),
        (
            ("--max-model-len 4096", "--max-model-len 4096 > log"),
            ["bad.yaml:6: command", "'>' outside quotes"],
        ),
        (("--max-model-len 4096 \\", "--max-model-len 4096"), ["bad.yaml:6: command", "2 shell line(s)"]),
        (("container: vllm-node\n", ""), ["bad.yaml", "container is required"]),
    ],
)
def test_bad_recipes_name_file_and_key_and_write_nothing(tmp_path: Path, change, needles) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace(*change))
    assert path.read_text() != GOOD
    out = tmp_path / "profiles" / "bad.yaml"
    with pytest.raises(RecipeError) as err:
        _import(path, out)
    message = str(err.value)
    assert all(n in message for n in needles), message
    assert "fix:" in message and "\n" not in message
    assert not out.exists()


def test_urls_files_and_sizes(tmp_path: Path) -> None:
    fetcher = make_fetcher(timeout=5, retries=0)
    with pytest.raises(RecipeError, match=r"http://example\.org/r\.yaml: only https:// URLs are read.*fix:"):
        read_source("http://example.org/r.yaml", fetcher)
    with pytest.raises(
        RecipeError, match=r"https://127\.0\.0\.1:9/r\.yaml: the URL does not answer with a recipe"
    ):
        read_source("https://127.0.0.1:9/r.yaml", fetcher)  # nothing listens on the discard port
    big = tmp_path / "big.yaml"
    big.write_text(GOOD + "#" * (256 * 1024))
    with pytest.raises(RecipeError, match=r"big\.yaml: \d+ bytes, more than"):
        read_source(str(big), fetcher)


def test_the_task_fails_in_one_paragraph_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("--port {port}", "--port {port} > /tmp/log"))
    out = tmp_path / "p.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "import", str(path), "--out", str(out), "--no-preflight"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{path}:6: command: the command has '>' outside quotes" in done.stderr
    assert not out.exists()


def test_vllm_argv_is_read_as_vllms_parser_reads_it() -> None:
    words = split_command(
        "vllm serve m -tp 2 --max_model_len=8k -O3 -cc.mode=3 --compilation-config.backend eager \\\n"
        "  --enable-prefix-caching --no-enable-prefix-caching --served-model-name a b --seed -1 --seed 7",
        "x",
    )
    argv = parse_serve(words, FALLBACK_ALIASES, "x")
    assert argv.model == "m"
    assert [(o.flag, o.values) for o in argv.options] == [
        ("tensor-parallel-size", ("2",)),
        ("max-model-len", ("8k",)),
        ("optimization-level", ("3",)),
        ("compilation-config.mode", ("3",)),
        ("compilation-config.backend", ("eager",)),
        ("no-enable-prefix-caching", ()),  # the later of the two spellings wins
        ("served-model-name", ("a", "b")),
        ("seed", ("7",)),  # the last of a repeated flag wins (vLLM: argparse)
    ]
    assert parse_serve(["vllm", "serve", "--model", "m", "-O", "2"], FALLBACK_ALIASES, "x").tokens() == [
        "serve", "m", "--optimization-level", "2",
    ]  # fmt: skip
    with pytest.raises(RecipeError, match="stands where vLLM expects an option"):
        parse_serve(["vllm", "serve", "m", "--x", "1", "2", "-", "3"], FALLBACK_ALIASES, "x")
    with pytest.raises(RecipeError, match="a variable"):
        split_command('vllm serve m --served-model-name "$NAME"', "x")
    assert split_command("vllm serve m --chat-template-content-format 'a;b|c>$d'", "x")[-1] == "a;b|c>$d"
    # bash's escapes: an escaped quote opens nothing, so the `;` after it is a real command separator.
    with pytest.raises(RecipeError, match="';' outside quotes"):
        split_command("vllm serve m --x \\' ; rm -rf / \\'", "x")
    assert split_command('vllm serve m --x "a\\"b\\\\" --y a\\;b', "x")[-3:] == ['a"b\\', "--y", "a;b"]
    with pytest.raises(RecipeError, match="escapes"):
        split_command('vllm serve m --x "a\\$b"', "x")
    for word in (
        "{a,b}",
        "*.jinja",
        "~/t.jinja",
        "--x=~/t",
    ):  # bash would expand these; quoted they are words
        with pytest.raises(RecipeError, match="a shell would expand it"):
            split_command(f"vllm serve m --x {word}", "x")
        assert split_command(f"vllm serve m --x '{word}'", "x")[-1] == word


def test_secrets_are_dropped_named_and_never_printed_and_defaults_can_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "keyed.yaml"
    key = "sk-" + "a1b2c3d4" * 4
    path.write_text(
        GOOD.replace("  port: 8000\n", f"  port: 8000\n  key: {key}\n").replace(
            "--max-model-len 4096", "--max-model-len 4096 --api-key {key}"
        )
    )
    doc, where = read_source(str(path), make_fetcher())
    imported = import_with(None, (doc, where), ImportOptions(overrides={"port": "9001"}))
    assert "api-key" not in imported.document["args"]  # type: ignore[operator]
    assert any("--api-key dropped" in str(a) and "mounted files only" in str(a) for a in imported.attention)
    assert key not in " ".join(imported.source_argv) + imported.text()
    assert imported.source_argv[-4:-2] == ("--api-key", "***") or "***" in imported.source_argv
    assert (
        imported.port == 9001 and imported.source_argv[-1] == "9001"
    )  # the override, as the runner's --port

"""Recipe validation: good recipes load; every malformed one gets file, line, key path and fix."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkforge.errors import RecipeError
from sparkforge.recipe.loader import REPO_ROOT, list_recipe_names, load_recipe
from tests.recipe_files import write_recipe_file

GOOD = ["vllm-qwen35", "vllm-qwen35-wheels"]


@pytest.mark.parametrize("name", GOOD)
def test_shipped_recipes_load(name: str) -> None:
    recipe = load_recipe(name)
    m = recipe.model
    assert m.gpu == "sm_121"
    assert "Qwen3_5MoeForConditionalGeneration" in m.models.architectures
    assert re.fullmatch(r"[0-9a-f]{64}", recipe.hash)
    assert recipe.chain[-1].name == "_gb10.yaml"


def test_source_recipe_pins() -> None:
    m = load_recipe("vllm-qwen35").model
    assert m.components.vllm.commit == "db9527a46873454610df6dbedf79a36d6bf1a7f6"
    assert m.components.vllm.source == "git"
    assert m.components.torch.version == "2.13.0"
    assert m.components.torch.index == "https://download.pytorch.org/whl/cu130"
    assert m.components.transformers.version.startswith("5.")
    assert (
        m.images.builder.split("@")[1]
        == "sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6"
    )


def test_list_hides_partials() -> None:
    names = list_recipe_names()
    assert set(GOOD) <= set(names)
    assert not any(n.startswith("_") for n in names)


def test_recipe_by_path(tmp_path: Path) -> None:
    recipe = load_recipe(str(REPO_ROOT / "recipes" / "vllm-qwen35.yaml"))
    assert recipe.name == "vllm-qwen35"


# (override YAML, expected key path, expected fix fragment)
MALFORMED = [
    ("colour: red\n", "colour", "unknown key"),
    ("components:\n  vllm:\n    branch: main\n", "components.vllm.branch", "unknown key"),
    (
        "images:\n  builder: nvidia/cuda:13.0.2-devel-ubuntu24.04\n",
        "images.builder",
        "pin the image by digest",
    ),
    ("images:\n  runtime: nvidia/cuda@sha256:abc\n", "images.runtime", "pin the image by digest"),
    ("components:\n  vllm:\n    commit: db9527a4\n", "components.vllm", "full 40-character SHA"),
    ("components:\n  vllm:\n    commit: main\n", "components.vllm.commit", "commit SHA"),
    ("components:\n  torch:\n    version: '>=2.13'\n", "components.torch.version", "exact version"),
    ("components:\n  torch:\n    version: latest\n", "components.torch.version", "exact version"),
    (
        "components:\n  transformers:\n    version: '==5.17.0'\n",
        "components.transformers.version",
        "exact version",
    ),
    ("components:\n  transformers:\n    version: 5.17\n", "components.transformers.version", "quoted string"),
    ("build:\n  torch_cuda_arch_list: ['12.1x']\n", "build.torch_cuda_arch_list.0", "TORCH_CUDA_ARCH_LIST"),
    ("build:\n  torch_cuda_arch_list: []\n", "build.torch_cuda_arch_list", "at least one"),
    ("platforms: [linux/riscv64]\n", "platforms.0", "linux/arm64"),
    ("platforms: [linux/arm64, linux/arm64]\n", "platforms", "each platform once"),
    ("gpu: sm121\n", "gpu", "sm_121"),
    ("build:\n  max_jobs: '8'\n", "build.max_jobs", "whole number"),
    ("build:\n  max_jobs: 0\n", "build.max_jobs", "larger number"),
    ("build:\n  nvcc_threads: 100\n", "build.nvcc_threads", "smaller number"),
    ("models:\n  architectures: ['Qwen3 Moe']\n", "models.architectures.0", "Python class name"),
    ("env:\n  FOO: $(rm -rf /)\n", "env.FOO", "no spaces or quotes"),
    ("env:\n  1BAD: x\n", "env.1BAD", "environment variable name"),
    ('description: "two\\nlines"\n', "description", "one line"),
    (
        "components:\n  torch:\n    version: 2.13.0\n    patches: [patches/vllm/0001-cmake-keep-sm121-on-cuda13.patch]\n",
        "components.torch",
        "patches apply only to source 'git'",
    ),
    (
        "components:\n  vllm:\n    patches: [../../etc/passwd]\n",
        "components.vllm.patches.0",
        "patches/vllm/0001-fix.patch",
    ),
    ("publish:\n  tags: ['{branch}']\n", "publish.tags", "unknown placeholder"),
    ("publish:\n  repository: GHCR.io/Sparkforge/X\n", "publish.repository", "lowercase image name"),
    (
        "components:\n  torch:\n    version: 2.13.0\n    source: git\n    commit: db9527a46873454610df6dbedf79a36d6bf1a7f6\n",
        "components.torch",
        "needs 'repository'",
    ),
    ("components:\n  torch:\n    index: ftp://example.org/simple\n", "components.torch.index", "http(s) URL"),
    ("cuda: '13'\n", "cuda", "13.0"),
    ("publish:\n  qemu: 'yes'\n", "publish.qemu", "true or false"),
    ("models:\n  architectures: Qwen3_5MoeForConditionalGeneration\n", "models.architectures", "YAML list"),
    ("audit:\n  require: ['vllm/_C.so; rm -rf /']\n", "audit.require.0", "path glob"),
    ("components:\n  vllm:\n    source: tarball\n", "components.vllm.source", "use 'wheel' or 'git'"),
]


@pytest.mark.parametrize(
    ("override", "key_path", "fix"), MALFORMED, ids=[m[1] + ":" + m[2][:20] for m in MALFORMED]
)
def test_malformed_recipe_messages(write_recipe, override: str, key_path: str, fix: str) -> None:
    path = write_recipe(override)
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    message = str(info.value)
    assert f"{key_path}:" in message, message
    assert fix in message, message
    assert "Traceback" not in message


def test_error_names_file_and_line(write_recipe) -> None:
    path = write_recipe("gpu: sm_121\ncolour: red\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    assert f"{path}:3: colour: unknown key" in str(info.value)  # line 1 is extends


def test_error_in_parent_names_parent_file(write_recipe, tmp_path: Path) -> None:
    parent = write_recipe("gpu: sm121\n", name="parent.yaml")
    child = write_recipe_file(tmp_path / "child.yaml", "description: child\n", extends=parent)
    with pytest.raises(RecipeError) as info:
        load_recipe(str(child))
    assert f"{parent}:2: gpu:" in str(info.value)


def test_missing_key_in_standalone_recipe(tmp_path: Path) -> None:
    data = load_recipe("vllm-qwen35").resolved()
    del data["description"]
    path = write_recipe_file(tmp_path / "standalone.yaml", data, extends=None)
    with pytest.raises(RecipeError, match=r"description: Field required; fix: add this key"):
        load_recipe(str(path))


def test_missing_commit_for_wheel(write_recipe) -> None:
    data = load_recipe("vllm-qwen35-wheels").resolved()
    del data["components"]["vllm"]["commit"]
    path = write_recipe(data, extends=None)
    with pytest.raises(RecipeError, match=r"components: components.vllm needs 'commit'"):
        load_recipe(str(path))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("gpu: [unclosed\n", "invalid YAML"),
        ("gpu: sm_121\ngpu: sm_120\n", "appears twice"),
        ("- a\n- b\n", "must be a YAML mapping"),
        ("", "must be a YAML mapping"),
    ],
)
def test_unparseable_files(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=fragment) as info:
        load_recipe(str(path))
    assert str(path) in str(info.value)


def test_extends_merges_and_overrides(write_recipe) -> None:
    path = write_recipe("components:\n  transformers:\n    version: 5.16.1\nbuild:\n  max_jobs: 2\n")
    recipe = load_recipe(str(path))
    assert recipe.model.components.transformers.version == "5.16.1"
    assert recipe.model.build.max_jobs == 2
    assert recipe.model.build.nvcc_threads == 2  # sibling kept
    assert recipe.model.components.vllm.commit == "db9527a46873454610df6dbedf79a36d6bf1a7f6"  # untouched
    assert [p.name for p in recipe.chain] == ["test.yaml", "vllm-qwen35.yaml", "_gb10.yaml"]


def test_extends_replaces_lists(write_recipe) -> None:
    recipe = load_recipe(str(write_recipe("models:\n  architectures: [Qwen3_5ForCausalLM]\n")))
    assert recipe.model.models.architectures == ["Qwen3_5ForCausalLM"]
    assert recipe.model.models.model_types == ["qwen3_5_moe", "qwen3_5"]


def test_extends_cycle_rejected(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(RecipeError, match=r"cycle \(a.yaml -> b.yaml -> a.yaml\)"):
        load_recipe(str(tmp_path / "a.yaml"))


def test_extends_missing_parent(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(str(tmp_path / "a.yaml"))


def test_extends_must_be_string(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: [x]\n")
    with pytest.raises(RecipeError, match="extends: must be a recipe name"):
        load_recipe(str(tmp_path / "a.yaml"))


def test_missing_patch_file(write_recipe) -> None:
    path = write_recipe("components:\n  vllm:\n    patches: [patches/vllm/9999-missing.patch]\n")
    with pytest.raises(RecipeError, match=r"patches/vllm/9999-missing\.patch does not exist"):
        load_recipe(str(path))


def test_unknown_recipe_name_lists_known() -> None:
    with pytest.raises(RecipeError, match="vllm-qwen35-wheels"):
        load_recipe("no-such-recipe")


def test_recipe_hash_changes_with_patch_bytes(write_recipe, tmp_path: Path) -> None:
    base = load_recipe("vllm-qwen35")
    changed = load_recipe(str(write_recipe("build:\n  max_jobs: 3\n")))
    assert base.hash != changed.hash
    assert base.hash == load_recipe("vllm-qwen35").hash


@pytest.mark.parametrize("args", [["show", "--recipe", "no-such"], ["render", "--recipe", "no-such"]])
def test_tasks_exit_cleanly_on_user_errors(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "recipe 'no-such' not found" in proc.stderr + proc.stdout


def test_show_prints_resolved_recipe() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "show", "--recipe", "vllm-qwen35"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    shown = yaml.safe_load(proc.stdout)
    assert shown["components"]["vllm"]["commit"] == "db9527a46873454610df6dbedf79a36d6bf1a7f6"
    assert shown["gpu"] == "sm_121"  # from the extended partial

"""A build recipe's image `env:` goes through an allow-list (sparkforge/recipe/loaderenv.py), never a deny-list."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkforge.errors import RecipeError
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.recipe.loaderenv import image_env_refusals
from tests.recipe_files import write_recipe_file

RECIPE = REPO_ROOT / "recipes" / "vllm-qwen35.yaml"


def _recipe(tmp_path: Path, env: dict[str, str]) -> Path:
    return write_recipe_file(tmp_path / "r.yaml", {"env": env}, extends=RECIPE)


def test_the_shipped_recipes_image_env_is_on_the_list() -> None:
    recipe = load_recipe(RECIPE)
    assert recipe.model.env["TRITON_PTXAS_PATH"] == "/opt/venv/cuda/bin/ptxas"
    assert image_env_refusals(recipe.model.env) == []


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"LD_PRELOAD": "/x.so"}, "LD_PRELOAD: refused"),
        ({"PYTHONWARNINGS": "all:0:antigravity.x:0:0"}, "PYTHONWARNINGS: refused"),
        ({"BROWSER": "firefox"}, "BROWSER: refused"),
        ({"MY_TOOL_MODE": "fast"}, "MY_TOOL_MODE: unknown"),  # unknown is not allowed: an allow-list
        ({"NCCL_NET_PLUGIN": "/x.so"}, "NCCL_NET_PLUGIN: refused"),
        ({"TRITON_PTXAS_PATH": "/tmp/evil"}, "TRITON_PTXAS_PATH='/tmp/evil': reviewed only as"),
        ({"RAY_memory_usage_threshold": "2"}, "RAY_memory_usage_threshold='2'"),
    ],
)
def test_anything_off_the_list_is_refused_with_file_key_and_fix(
    tmp_path: Path, env: dict, named: str
) -> None:
    path = _recipe(tmp_path, env)
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    text = str(caught.value)
    assert str(path) in text and "env" in text and named in text and "fix:" in text


def test_resource_variables_and_vllms_own_pass(tmp_path: Path) -> None:
    env = {"OMP_NUM_THREADS": "8", "NCCL_SOCKET_IFNAME": "enp1s0f0np0", "RAY_memory_usage_threshold": "0.98"}
    assert load_recipe(_recipe(tmp_path, env)).model.env["OMP_NUM_THREADS"] == "8"

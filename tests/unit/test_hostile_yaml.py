"""Hostile YAML for recipes and profiles: the one reader is bounded (file kind, size, depth, aliases) and
`extends` is capped and confined; every refusal names the file and line and says how to fix it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sparkforge.errors import ProfileError, RecipeError
from sparkforge.recipe.loader import RECIPES_DIR, load_recipe
from sparkforge.recipe.profile import load_profile
from sparkforge.recipe.yamlfile import MAX_YAML_BYTES, read_yaml

# 36 aliases (under the alias cap) that expand to 4**9 values: the classic "billion laughs", scaled down.
BOMB = "\n".join(
    ["a0: &a0 [x, x, x, x]"] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 4)}]" for i in range(1, 10)]
)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (BOMB, "alias bomb"),
        ("a: &a [*a]\n", "refers to itself"),
        ("a: &a {b: *a}\n", "refers to itself"),
        ("a: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than"),
        ("".join("  " * i + f"k{i}:\n" for i in range(60)) + "  " * 60 + "v: 1\n", "nested deeper than"),
        ("x: &x 1\n" + "".join(f"k{i}: *x\n" for i in range(100)), "more than 64 YAML aliases"),
        ("a: !!python/object/apply:os.system [id]\n", "invalid YAML"),
        ("a: 1\na: 2\n", "appears twice"),
        ("- a\n- b\n", "must be a YAML mapping"),
        ("a: [\n", "invalid YAML"),
    ],
)
def test_yaml_bounds(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    start = time.monotonic()
    with pytest.raises(RecipeError) as info:
        read_yaml(path)
    assert time.monotonic() - start < 5
    assert needle in str(info.value) and str(path) in str(info.value) and "fix:" in str(info.value)


def test_large_and_binary_files(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * MAX_YAML_BYTES + "\n")
    with pytest.raises(RecipeError, match="more than this input may hold"):
        read_yaml(big)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(RecipeError, match="not UTF-8"):
        read_yaml(binary)


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "/proc/self/environ"])
def test_devices_and_proc_are_not_read(special: str) -> None:
    start = time.monotonic()
    with pytest.raises(RecipeError):
        read_yaml(Path(special))
    assert time.monotonic() - start < 5


def test_a_fifo_profile_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match=r"not found|not a regular file"):
        load_profile(fifo)


def test_profile_errors_speak_of_profiles(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    with pytest.raises(ProfileError, match="alias bomb"):
        load_profile(path)


def test_extends_chains_are_capped(tmp_path: Path) -> None:
    for i in range(12):
        parent = f"extends: r{i + 1}.yaml\n" if i < 11 else "extends: vllm-qwen35\n"
        (tmp_path / f"r{i}.yaml").write_text(parent)
    with pytest.raises(RecipeError, match="more than 8 files deep") as info:
        load_recipe(tmp_path / "r0.yaml")
    assert "fix:" in str(info.value)


def test_an_extends_loop_is_a_cycle_not_a_recursion_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(RecipeError, match="cycle"):
        load_recipe(tmp_path / "a.yaml")


@pytest.mark.parametrize(
    "target", ["/etc/passwd", "/etc/hostname", "../../../../../../etc/passwd", "/proc/self/status"]
)
def test_extends_never_reaches_system_folders(tmp_path: Path, target: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(f"extends: {target}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert "extends" in str(info.value) and "fix:" in str(info.value), str(info.value)
    assert "root:" not in str(info.value)  # nothing of the file it names is echoed


def test_extends_outside_the_named_recipes_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "base.yaml").write_text("extends: vllm-qwen35\n")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "r.yaml").write_text("extends: ../elsewhere/base.yaml\n")
    with pytest.raises(RecipeError, match="outside this project and the folder of the recipe you named"):
        load_recipe(tmp_path / "mine" / "r.yaml")


def test_a_recipe_in_recipes_is_confined_to_the_project(tmp_path: Path) -> None:
    outside = tmp_path / "base.yaml"
    outside.write_text("extends: vllm-qwen35\n")
    name = f"zz-hostile-{os.getpid()}"
    inside = RECIPES_DIR / f"{name}.yaml"
    inside.write_text(f"extends: {outside}\n")
    try:
        with pytest.raises(RecipeError, match="outside this project"):
            load_recipe(name)
    finally:
        inside.unlink()

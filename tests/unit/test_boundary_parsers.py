"""Hypothesis properties of the round-2 parsers: ASCII numbers and lists, bounded walks, the sysfs numbers."""

from __future__ import annotations

import functools
import importlib.util
import os
import string
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkforge.boundary import ascii_number, parse_int, parse_int_list, walk_tree
from sparkforge.errors import InputError

FACTS = Path(__file__).resolve().parents[1] / "image" / "cluster_facts.py"  # the in-image sysfs reader


@given(st.text(max_size=12))
def test_a_number_is_ascii_digits_or_refused(text: str) -> None:
    value = ascii_number(text, integer=True)
    if value is None:
        return
    assert text.isascii() and "_" not in text and text.lstrip("+-").isdigit()
    assert value == int(text)


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_every_ascii_integer_reads_back(number: int) -> None:
    assert ascii_number(str(number), integer=True) == number


@given(st.text(alphabet=string.digits + "_,٣²¹ +-", max_size=20))
def test_a_list_is_whole_numbers_in_range_or_one_refusal(text: str) -> None:
    try:
        values = parse_int_list("--concurrency", text, low=1, high=4096)
    except InputError as exc:
        assert "--concurrency" in str(exc) and "fix:" in str(exc)
        return
    assert values and all(1 <= v <= 4096 for v in values)
    assert all(part.strip().isascii() and "_" not in part for part in text.split(","))


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_parse_int_never_takes_a_float_text(value: float) -> None:
    with pytest.raises(InputError):
        parse_int(
            "--n", repr(value) if not float(value).is_integer() else f"{value}e0", low=-(10**9), high=10**9
        )


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=12))
def test_a_walk_lists_regular_files_only_and_never_follows_a_link(tmp_path_factory, layout) -> None:
    root = tmp_path_factory.mktemp("walk")
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret").write_text("x")
    expected = set()
    for i, (depth, link) in enumerate(layout):
        folder = root.joinpath(*[f"d{k}" for k in range(depth)])
        folder.mkdir(parents=True, exist_ok=True)
        if link:
            os.symlink(outside, folder / f"link{i}")
        else:
            (folder / f"f{i}").write_text("x")
            expected.add(folder / f"f{i}")
    assert set(walk_tree(root, "--tree")) == expected


def test_a_walk_refuses_past_its_depth_and_count(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d"] * 20)
    deep.mkdir(parents=True)
    with pytest.raises(InputError, match="deeper than 16"):
        walk_tree(tmp_path, "--tree")
    wide = tmp_path / "wide"
    wide.mkdir()
    for i in range(30):
        (wide / str(i)).write_text("")
    with pytest.raises(InputError, match="more than 10 entries"):
        walk_tree(wide, "--tree", max_entries=10)


@functools.cache
def _facts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cluster_facts_props", FACTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@given(st.text(max_size=10))
def test_the_sysfs_reader_takes_ascii_numbers_only(text: str) -> None:
    value = _facts()._small_int(text)
    assert value is None or (text.isascii() and text.isdigit() and value == int(text) and len(text) <= 7)

"""The registry primitive: names once, selection parsed in order, unknown names refused, docs tables rendered."""

from __future__ import annotations

import pytest

from sparkforge.errors import RunError
from sparkforge.extensions import Entry, Registry


def _rows() -> Registry:
    return Registry(
        "conform",
        "--checks",
        [
            Entry("determinism", "the same prompt twice gives the same tokens", len),
            Entry(
                "long-decode", "a long greedy decode does not collapse | loop", len, key="conform.long_decode"
            ),
            Entry("golden", "answers match a recorded file", len, default=False),
        ],
        RunError,
    )


def test_selection_keeps_the_registry_order_and_defaults_leave_out_opt_in_rows() -> None:
    rows = _rows()
    assert rows.parse("golden, determinism") == ("determinism", "golden")
    assert rows.defaults() == ("determinism", "long-decode")
    assert "golden" in rows and len(rows) == 3


def test_an_unknown_name_is_refused_with_every_known_one() -> None:
    with pytest.raises(
        RunError, match=r"--checks: unknown conform row 'speed'.*choose from determinism, long-decode, golden"
    ):
        _rows().parse("determinism,speed")
    with pytest.raises(RunError, match="unknown conform row 'x'"):
        _rows().get("x")


@pytest.mark.parametrize("names", [["a", "a"], ["Bad Name"]])
def test_declaring_a_row_twice_or_with_a_bad_name_fails_at_once(names: list[str]) -> None:
    with pytest.raises(ValueError):
        Registry("s", "--x", [Entry(n, "h", len) for n in names], RunError)


def test_the_docs_table_is_rendered_between_the_markers() -> None:
    rows = _rows()
    page = "intro\n<!-- registry:conform -->\nstale\n<!-- /registry:conform -->\nend\n"
    out = rows.render_into(page)
    assert out.startswith("intro\n<!-- registry:conform -->\n| row | what it checks | profile key |")
    assert (
        "| `long-decode` | a long greedy decode does not collapse \\| loop | `conform.long_decode` |" in out
    )
    assert out.endswith("<!-- /registry:conform -->\nend\n") and "stale" not in out
    assert rows.render_into(out) == out
    with pytest.raises(ValueError, match="no <!-- registry:conform -->"):
        rows.render_into("no markers")

"""`compare` on two real audits (nvcc 13 fatbinaries) and two real recipes: the rows name what changed."""

from __future__ import annotations

from pathlib import Path

import pytest
from audit_fixtures import nvcc_available
from release_fixtures import release_tree

from sparkforge.audit.scan import audit_target
from sparkforge.registry.diff import compare, format_table
from sparkforge.registry.sides import Side
from sparkforge.verify import kernels_report
from tests.recipe_files import SMOKE, write_recipe_file
from tests.registry_calls import diff

# What vLLM answered for the MoE layer, in two releases (the shape sparkforge/verify/inimage/vllm_selection.py prints).
SELECTION = {
    release: {"layers": [{"layer": "moe.fp8_block", "selected": chosen, "candidates": [
        {"name": "VLLM_CUTLASS", "priority": 0, "usable": False, "reasons": ["capability >= 11.0"]},
        {"name": "TRITON", "priority": 1, "usable": True, "reasons": []},
        {"name": "MARLIN", "priority": 2, "usable": True, "reasons": []}]}]}
    for release, chosen in (("native", "TRITON"), ("family", "MARLIN"))
}  # fmt: skip


def _side(release: str, tmp_path: Path, vllm: str, recipe: str = "r", gpu: str = "sm_121") -> Side:
    audit = audit_target(release_tree(release, tmp_path / release), gpu="sm_121", require=[])
    libraries = audit.to_dict()["libraries"]
    rows = kernels_report.layer_rows(SELECTION[release], libraries, None)
    return Side(
        subject=f"img-{release}",
        kind="image",
        recipe=recipe,
        recipe_hash="h-" + release,
        gpu=gpu,
        labels={
            "dev.sparkforge.pin.vllm": vllm,
            "dev.sparkforge.pin.torch": "2.13.0",
            "dev.sparkforge.recipe": recipe,
        },
        kernels={lib["path"].split("site-packages/")[1]: lib["verdict"] for lib in libraries},
        backends={b["name"]: b["verdict"] for b in kernels_report.backend_verdicts(rows)},
        selection=kernels_report.selected_by_layer({"layers": rows}),
    )


@pytest.mark.skipif(not nvcc_available(), reason="nvcc 13 not found")
def test_diff_names_the_changed_vllm_and_the_library_that_lost_native(tmp_path: Path) -> None:
    report = compare(_side("native", tmp_path, "0.33.0@aaa"), _side("family", tmp_path, "0.34.0@bbb"))
    data = report.to_dict()
    rows = {(r["section"], r["item"]): r for r in data["changes"]}
    assert rows[("versions", "vllm")]["a"] == "0.33.0@aaa" and rows[("versions", "vllm")]["b"] == "0.34.0@bbb"
    assert rows[("kernels", "vllm/_moe_C.abi3.so")]["change"] == "lost native sm_121"
    assert ("kernels", "vllm/_C.abi3.so") not in rows  # unchanged: native in both
    assert ("versions", "torch") not in rows
    moe = rows[("selection", "moe.fp8_block")]
    assert moe["change"] == "moe.fp8_block: TRITON (unchecked) -> MARLIN (family)"
    assert data["warnings"] == [] and data["status"] == "passed"
    table = format_table(report)
    assert (
        "lost native sm_121" in table and "not compared: " in table
    )  # size, packages: recipes' sides lack them


@pytest.mark.skipif(not nvcc_available(), reason="nvcc 13 not found")
def test_different_recipes_and_gpus_are_said_first(tmp_path: Path) -> None:
    data = compare(
        _side("native", tmp_path, "0.33.0", "one"), _side("native", tmp_path, "0.33.0", "two", "sm_120")
    ).to_dict()
    assert data["warnings"][0] == "different recipes: one vs two"
    assert data["warnings"][1].startswith("different GPUs: sm_121 vs sm_120")
    assert format_table(
        compare(_side("native", tmp_path, "1", "one"), _side("native", tmp_path, "1", "two"))
    ).startswith("WARNING: different recipes")


def test_two_recipes_diff_their_pins_and_lock(tmp_path: Path) -> None:
    newer = write_recipe_file(
        tmp_path / "newer.yaml", "components:\n  transformers:\n    version: 5.99.0\n", extends=SMOKE
    )
    data = diff(str(SMOKE), str(newer)).to_dict()
    items = {(r["section"], r["item"]) for r in data["changes"]}
    assert ("versions", "transformers") in items
    assert ("lock", "components.transformers.version") in items
    assert ("labels", "dev.sparkforge.recipe-hash") in items
    assert data["checks"][0]["name"] == "versions"


def test_an_unknown_image_is_a_one_paragraph_error() -> None:
    from sparkforge.errors import PublishError

    with pytest.raises(PublishError, match=r"no such image in the local engine.*fix:"):
        diff("no-such-image-sparkforge-test", str(SMOKE))

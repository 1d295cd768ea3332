"""A move of moving tags, as the tag history records it: one TagMove, one entry per tag with what it named before."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from pathlib import Path

from sparkforge.registry.history import Entry, TagMove, new_entry

D1, D2, INDEX = "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "a" * 64


def test_an_entry_carries_the_move_and_the_tag_before(tmp_path: Path) -> None:
    move = TagMove(
        "promote", "smoke", "h" * 64, INDEX, {"linux/amd64": D1, "linux/arm64": D2}, {"latest": D2}
    )
    when = dt.datetime(2026, 12, 3, 18, 0, 0, 123456, tzinfo=dt.UTC)
    entry = new_entry(move, move.previous["latest"], tmp_path, "sm_121", now=when)
    assert (entry.digest, entry.action, entry.recipe, entry.previous) == (INDEX, "promote", "smoke", D2)
    assert entry.date == "2026-12-03T18:00:00+00:00" and entry.platforms == {
        "linux/amd64": D1,
        "linux/arm64": D2,
    }
    # no verify record on this machine: the verdict says so per platform, never a pass
    assert entry.verified["linux/amd64"] == {
        "status": "unknown",
        "gpu_verified": False,
        "reason": "no verify record on the machine that moved the tag",
    }
    assert Entry.from_dict(asdict(entry)) == entry  # the record reads back as written

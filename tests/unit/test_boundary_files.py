"""The boundary's readers and writers for sparkforge's own files (issue 59: the allow-list reached zero): logs,
streamed outputs, binaries read in pieces, upstream trees, and the JSON programs print. Each refuses what a
hostile file would be (a FIFO, a link out, an oversized file, bad JSON) with the boundary's one-paragraph error."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import pytest

from sparkforge import boundary
from sparkforge.errors import InputError


def _fifo(tmp_path: Path, name: str = "pipe") -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def test_atomic_writer_streams_and_appears_only_whole(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "blob"
    with boundary.atomic_writer(out, "download") as handle:
        handle.write(b"part one, ")
        assert not out.exists()  # nothing at the name until the block ends
        handle.write(b"part two")
    assert out.read_bytes() == b"part one, part two"
    with pytest.raises(RuntimeError), boundary.atomic_writer(out, "download") as handle:
        handle.write(b"half")
        raise RuntimeError("the stream broke")
    assert out.read_bytes() == b"part one, part two"  # the old file stays, no temporary is left behind
    assert sorted(p.name for p in out.parent.iterdir()) == ["blob"]


def test_write_output_mode_is_exact_and_a_link_is_replaced_not_followed(tmp_path: Path) -> None:
    script = boundary.write_output(tmp_path / "build.sh", "#!/bin/sh\n", "script", mode=0o755)
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    boundary.write_output(link, "{}", "out")
    assert victim.read_text() == "keep" and not link.is_symlink() and link.read_text() == "{}"
    with pytest.raises(InputError, match="a folder, device or pipe is there; fix:"):
        boundary.write_output(_fifo(tmp_path), "x", "out")


def test_open_log_writes_appends_and_refuses_a_link_or_pipe(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "01-step.log"
    with boundary.open_log(log, "step log") as out:
        out.write(b"first\n")
    with boundary.open_log(log, "step log", append=True) as out:
        out.write(b"second\n")
    assert log.read_bytes() == b"first\nsecond\n"
    with boundary.open_log(log, "step log") as out:  # a new step's log starts empty
        out.write(b"again\n")
    assert log.read_bytes() == b"again\n"
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / "linked.log").symlink_to(target)
    with pytest.raises(InputError, match=r"linked\.log: cannot open it for writing.*fix:"):
        boundary.open_log(tmp_path / "linked.log", "step log")
    assert target.read_text() == "keep"
    with pytest.raises(InputError, match="fix:"):  # a FIFO with no reader: refused at once, never blocks
        boundary.open_log(_fifo(tmp_path), "daemon log", append=True)


def test_open_binary_reads_a_regular_file_and_refuses_pipes_folders_links_and_size(tmp_path: Path) -> None:
    lib = tmp_path / "libx.so"
    lib.write_bytes(b"\x7fELF" + bytes(60))
    with boundary.open_binary(lib, "", 1 << 20) as handle:
        assert handle.read(4) == b"\x7fELF"
    with pytest.raises(InputError, match="a device, pipe or socket, not a regular file"):
        boundary.open_binary(_fifo(tmp_path), "--target", 1 << 20)
    with pytest.raises(InputError, match="a folder, not a regular file"):
        boundary.open_binary(tmp_path, "--target", 1 << 20)
    with pytest.raises(InputError, match="more than this input may hold"):
        boundary.open_binary(lib, "--target", 10)
    (tmp_path / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(InputError, match="a system file; fix: name the file itself"):
        boundary.open_binary(tmp_path / "passwd", "--target", 1 << 20)


def test_read_tail_gives_the_end_of_a_log_leniently(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_bytes(b"early lines\n" * 1000 + b"\xff ERROR: [builder 3/9] RUN make\n")
    tail = boundary.read_tail(log, "build log", 40)
    assert tail.endswith("ERROR: [builder 3/9] RUN make\n") and len(tail.encode()) <= 42 and "\ufffd" in tail
    assert boundary.read_tail(tmp_path / "missing.log", "build log", 40) == ""
    with pytest.raises(InputError, match="not a regular file"):
        boundary.read_tail(_fifo(tmp_path), "dockerd log", 40)


def test_read_source_stays_inside_its_tree(tmp_path: Path) -> None:
    tree = tmp_path / "vllm-src"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "_version.py").write_bytes(b"__version__ = '0.1'\n# \xff stray byte\n")
    text = boundary.read_source(tree / "vllm" / "_version.py", tree)
    assert text is not None and text.startswith("__version__ = '0.1'") and "\ufffd" in text
    assert boundary.read_source(tree / "vllm" / "missing.py", tree) is None
    assert boundary.read_source(_fifo(tree, "fifo.py"), tree) is None  # no regular file there: as if absent
    outside = tmp_path / "secret.txt"
    outside.write_text("not the tree's")
    (tree / "vllm" / "envs.py").symlink_to(outside)
    with pytest.raises(InputError, match="outside this project and the folders it may read"):
        boundary.read_source(tree / "vllm" / "envs.py", tree)
    with pytest.raises(InputError, match="more than this input may hold"):
        boundary.read_source(tree / "vllm" / "_version.py", tree, max_bytes=8)


def test_parse_json_for_program_output_is_strict_unless_nan_is_expected() -> None:
    with pytest.raises(InputError, match=r"the suite's report: cannot read it as JSON .*NaN.*fix: rerun it"):
        boundary.parse_json('{"value": NaN}', "the suite's report", fix="rerun it")
    data = boundary.parse_json('{"value": NaN, "peak": Infinity}', "the suite's report", nonfinite=True)
    assert math.isnan(data["value"]) and data["peak"] == math.inf
    for bad in ('{"a": 1, "a": 2}', "[" * 100 + "]" * 100, '{"n": ' + "9" * 50 + "}"):
        with pytest.raises(InputError, match="the suite's report: cannot read it"):
            boundary.parse_json(bad, "the suite's report", nonfinite=True)  # lenient on NaN only
    # bytes, as an image's file gives them
    assert boundary.parse_json(b'{"ok": true}', "probe.json") == {"ok": True}
    with pytest.raises(InputError, match="characters of JSON, more than"):
        boundary.parse_json(" " * 1025, "docker inspect", max_bytes=1024)

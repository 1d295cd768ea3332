"""The input boundary's rules as properties (sparkforge/boundary.py, oci.py, console.py, the profile regex):
random bytes, deep nesting, huge numbers, NaN/Inf, control characters and symlinks, each refused or kept as the
rule says, in well under a second per case and without touching anything outside the test's folder."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkforge import boundary, oci
from sparkforge.boundary import check_exclusive, check_number, parse_json, read_bytes, read_json, write_output
from sparkforge.console import cell, md_cell, md_code, printable, terminal
from sparkforge.errors import InputError
from sparkforge.recipe.profile import expect_pattern

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


# ---- 1. reading a user file --------------------------------------------------------------------------------


@FAST
@given(data=st.binary(max_size=4096), cap=st.integers(min_value=0, max_value=5000))
def test_read_bytes_returns_the_file_or_refuses_past_the_cap(tmp_path: Path, data: bytes, cap: int) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    if len(data) <= cap:
        assert read_bytes(path, "--x", cap) == data
    else:
        with pytest.raises(InputError, match=r"--x .*more than this input may hold.*fix:"):
            read_bytes(path, "--x", cap)


@pytest.mark.parametrize("kind", ["fifo", "device", "folder", "missing"])
def test_special_files_are_refused_at_once(tmp_path: Path, kind: str) -> None:
    path = {"device": Path("/dev/zero"), "folder": tmp_path}.get(kind, tmp_path / kind)
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes to it: a plain open() would block forever
    start = time.monotonic()
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            read_json(path, "--bench")
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(2)
    hung = worker.is_alive()
    if kind == "fifo" and hung:  # let the hung reader go before failing (non-blocking: it is reading)
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert not hung and time.monotonic() - start < 2
    assert isinstance(outcome[0], InputError) and "fix:" in str(outcome[0])


def test_a_path_a_file_names_stays_in_the_project(tmp_path: Path) -> None:
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    link = boundary.PROJECT_ROOT / "build" / f"hostile-read-{os.getpid()}.json"
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(outside)
    try:
        with pytest.raises(InputError, match="outside this project"):
            read_json(link, "extends", named=False)
        assert read_json(link, "--bench") == {}  # named on the command line: read where it leads
        assert read_json(outside, "x", named=False, within=[tmp_path]) == {}
        with pytest.raises(InputError, match="outside this project"):
            read_bytes(Path("/etc/hostname"), "x", 100, named=False, within=[Path("/")])
    finally:
        link.unlink()


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=30,
)


@FAST
@given(value=JSON_VALUES)
def test_finite_json_round_trips(value: object) -> None:
    assert parse_json(json.dumps(value), "x") == value


@FAST
@given(
    value=JSON_VALUES,
    bad=st.sampled_from(["NaN", "Infinity", "-Infinity", "1e309", "-1e400", "9" * 41]),
)
def test_non_finite_numbers_are_refused_anywhere(value: object, bad: str) -> None:
    text = json.dumps({"ok": value, "bad": [0, "__BAD__"]}).replace('"__BAD__"', bad)
    with pytest.raises(InputError, match=r"cannot read it as JSON .*fix:"):
        parse_json(text, "x")


@FAST
@given(depth=st.integers(min_value=65, max_value=200_000), kind=st.sampled_from("[{"))
def test_deep_nesting_is_refused_not_a_recursion_error(depth: int, kind: str) -> None:
    text = ('{"a":' * depth + "1" + "}" * depth) if kind == "{" else "[" * depth + "]" * depth
    with pytest.raises(InputError, match=r"nested deeper|cannot read"):
        parse_json(text, "x")


def test_counts_and_duplicate_keys_are_bounded() -> None:
    with pytest.raises(InputError, match="more than 1000 values"):
        parse_json(json.dumps(list(range(2000))), "x", max_items=1000)
    with pytest.raises(InputError, match="appears twice"):
        parse_json('{"status": "failed", "status": "passed"}', "x")


@FAST
@given(data=st.binary(min_size=1, max_size=64))
def test_random_bytes_are_json_or_one_paragraph(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(data)
    try:
        read_json(path, "--bench", expect=None)
    except InputError as exc:
        assert "fix:" in str(exc) and "\n" not in str(exc)


# ---- 2. writing an output ----------------------------------------------------------------------------------


@FAST
@given(data=st.binary(max_size=2048))
def test_writes_replace_a_planted_symlink_never_follow_it(tmp_path: Path, data: bytes) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    out = tmp_path / "out.json"
    out.unlink(missing_ok=True)
    out.symlink_to(victim)
    write_output(out, data, "--json")
    assert victim.read_bytes() == b"keep" and not out.is_symlink() and out.read_bytes() == data
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # atomic: no temp left


def test_a_symlinked_folder_out_of_the_project_is_refused(tmp_path: Path) -> None:
    link = boundary.PROJECT_ROOT / "build" / f"hostile-write-{os.getpid()}"
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(tmp_path)
    try:
        with pytest.raises(InputError, match=r"leads out of the project.*fix:"):
            write_output(link / "sub" / "report.json", "{}", "--json")
        assert list(tmp_path.iterdir()) == []  # nothing written, no folder made there
        write_output(tmp_path / "named.json", "{}", "--json")  # a path outside named as it is: written
        assert (tmp_path / "named.json").read_text() == "{}"
    finally:
        link.unlink()
    for bad in ("/dev/stdout", "/etc/sparkforge.json", "/proc/self/x"):
        with pytest.raises(InputError, match="system folder"):
            write_output(bad, "{}", "--json")
    with pytest.raises(InputError, match="folder, device or pipe"):
        write_output(tmp_path, "{}", "--json")
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="is a file, not a folder"):
        write_output(tmp_path / "file" / "r.json", "{}", "--json")


# ---- 3. references, tags, digests, platforms; exclusive flags ----------------------------------------------


@FAST
@given(text=st.text(max_size=80))
def test_references_are_oci_grammar_or_refused(text: str) -> None:
    try:
        oci.check_reference("--image", text)
    except InputError as exc:
        assert "fix:" in str(exc)
        return
    # accepted: only the grammar's characters, never an option (argv injection) or a path climbing out
    assert re.fullmatch(r"[A-Za-z0-9._:/@-]+", text) and not text.startswith(("-", "/", "."))
    assert ".." not in text.split("@")[0].split(":")[-1].split("/")


@pytest.mark.parametrize(
    ("check", "value", "good"),
    [
        (oci.check_reference, "ghcr.io/org/vllm-qwen35:0.31.0", True),
        (oci.check_reference, "localhost:5000/x@sha256:" + "a" * 64, True),
        (oci.check_reference, "--output=/etc/x", False),
        (oci.check_reference, "x:tag\nsha256", False),
        (oci.check_reference, "../x", False),
        (oci.check_reference, "-h/x", False),
        (oci.check_reference, "[::1]:5000/x:1", True),
        (oci.check_tag, "0.31.0-cu130", True),
        (oci.check_tag, "../latest", False),
        (oci.check_tag, "a" * 129, False),
        (oci.check_digest, "sha256:" + "a" * 64, True),
        (oci.check_digest, "sha256:" + "A" * 64, False),
        (oci.check_platform, "linux/arm64", True),
        (oci.check_platform, "linux/arm64 --push", False),
    ],
)
def test_one_grammar_for_references(check, value: str, good: bool) -> None:  # type: ignore[no-untyped-def]
    if good:
        assert check("--x", value) == value
    else:
        with pytest.raises(InputError, match="fix:"):
            check("--x", value)
    assert oci.check_reference("--x", "r@sha256:" + "b" * 64, need_digest=True)
    with pytest.raises(InputError, match="NAME@sha256"):
        oci.check_reference("--image", "r:latest", need_digest=True)


def test_exclusive_flags_are_refused_never_ignored() -> None:
    check_exclusive(rollback="latest", promote="")
    with pytest.raises(InputError, match="--rollback and --promote exclude each other; fix:"):
        check_exclusive(rollback="latest", promote="sha256:" + "a" * 64)


# ---- 4. numbers --------------------------------------------------------------------------------------------


@FAST
@given(
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(10**400), 10**400),
        st.sampled_from(["nan", "inf", "-inf", "1e309", "1e-400", "0x10", "", " 5", "5.0", "True"]),
        st.text(max_size=10),
        st.booleans(),
    )
)
def test_numbers_are_finite_and_in_range_or_refused(value: object) -> None:
    try:
        got = check_number("--threshold", value, low=0, high=1000, low_open=True)
    except InputError as exc:
        assert "--threshold" in str(exc) and "fix:" in str(exc)
    else:
        assert math.isfinite(got) and 0 < got <= 1000 and not isinstance(value, bool)
    try:
        count = check_number("--top", value, low=1, high=100, integer=True)
    except InputError:
        pass
    else:
        assert isinstance(count, int) and 1 <= count <= 100


# ---- 6. printing untrusted text ----------------------------------------------------------------------------


@FAST
@given(text=st.text())
def test_escaped_text_holds_no_control_character(text: str) -> None:
    for escaped in (printable(text), cell(text), md_cell(text), md_code(text)):
        assert not CONTROLS.search(escaped)
    assert "|" not in md_cell(text).replace("\\|", "")
    assert "`" not in md_code(text)[1:-1]
    kept = terminal(text)
    assert "\x1b" not in kept and "\r" not in kept and kept.count("\n") == text.count("\n")


# ---- 7. regexes from profiles ------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(a|aa)+$", r"(\w+\s?)*$", r"^(a?){30}a{30}$"])
def test_pathological_patterns_run_in_linear_time(pattern: str) -> None:
    compiled = expect_pattern(pattern)
    start = time.monotonic()
    compiled.search("a" * 50_000 + "!")  # Python's re: 2^50,000 steps for the first one
    assert time.monotonic() - start < 0.5


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=x)y", r"(?<!x)y", "a{1001}", "((a{100}){100}){100}", "["])
def test_patterns_without_a_linear_promise_are_refused_at_load(pattern: str) -> None:
    with pytest.raises(ValueError, match="fix:"):
        expect_pattern(pattern)


@FAST
@given(pattern=st.text(max_size=30))
def test_random_patterns_compile_or_are_refused(pattern: str) -> None:
    try:
        compiled = expect_pattern(pattern)
    except ValueError as exc:
        assert "fix:" in str(exc)
        return
    start = time.monotonic()
    compiled.search("ab" * 20_000)
    assert time.monotonic() - start < 0.5


def test_the_sysfs_reader_never_blocks_on_a_planted_fifo(tmp_path: Path) -> None:
    from sparkforge.run.cluster.inventory import SYSFS_ENV, local_facts

    port = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    os.mkfifo(port / "state")  # nobody writes: a plain open() of it blocks forever
    net = tmp_path / "sys" / "class" / "net" / "enp1s0f0np0"
    net.mkdir(parents=True)
    os.mkfifo(net / "operstate")
    (net / "mtu").symlink_to("/dev/null")  # a device (not /dev/zero: a failing reader must not fill memory)
    found: list[dict] = []
    worker = threading.Thread(
        target=lambda: found.append(local_facts({SYSFS_ENV: str(tmp_path / "sys")})), daemon=True
    )
    worker.start()
    worker.join(2)
    hung = worker.is_alive()
    for _ in range(50):  # release a hung reader before failing (non-blocking: a FIFO nobody reads is skipped)
        for fifo in (port / "state", net / "operstate"):
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(0.02)
    assert not hung and found
    assert found[0]["rdma"]["mlx5_0"]["ports"]["1"]["state"] is None
    assert (
        found[0]["net"]["enp1s0f0np0"]["operstate"] is None and found[0]["net"]["enp1s0f0np0"]["mtu"] is None
    )


def test_sparkforges_own_folder_in_roots_home_is_read_and_system_folders_never(tmp_path: Path) -> None:
    """Run as root, sparkforge's cache is under /root (root's home, refused for paths a file names): a record in a
    folder sparkforge chose (`within`) is read there; /etc stays refused whatever `within` says."""
    if not os.access("/root", os.W_OK):
        pytest.skip("needs to write under /root (CI and the engine tests run as root)")
    own = Path(tempfile.mkdtemp(prefix="sparkforge-own-", dir="/root"))
    try:
        record = own / "pulled.json"
        record.write_text("{}")
        assert read_json(record, "pull record", named=False, within=[own]) == {}
        with pytest.raises(InputError, match="outside this project"):
            read_json(record, "pull record", named=False)
        with pytest.raises(InputError, match="outside this project"):
            read_bytes(Path("/etc/hostname"), "x", 100, named=False, within=[Path("/etc")])
    finally:
        shutil.rmtree(own)

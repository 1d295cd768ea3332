"""The weight server and puller run the boundary's own rules: the functions their program text ships are the
boundary's (same bytecode), and on generated manifests the shipped check and the host's agree, entry for entry."""

from __future__ import annotations

import ast
import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkforge import boundary
from sparkforge.run.weights.weightscripts import PULL_SCRIPT, SERVE_SCRIPT, program


@functools.cache
def _shipped(script: str) -> dict[str, object]:
    """The namespace the program's shipped prefix defines (the program itself is not run: it needs a server)."""
    text = program(script)
    prefix = text[: text.index(script)]
    namespace: dict[str, object] = {}
    exec(compile(prefix, "shipped", "exec"), namespace)  # our own source, as the image runs it
    return namespace


def test_the_programs_ship_the_boundarys_functions() -> None:
    for script in (PULL_SCRIPT, SERVE_SCRIPT):
        namespace = _shipped(script)
        for function in boundary.PORTABLE:
            shipped = namespace[function.__name__]
            assert shipped.__code__.co_code == function.__code__.co_code, function.__name__  # type: ignore[attr-defined]
        assert namespace["MAX_INT_DIGITS"] == boundary.MAX_INT_DIGITS


def test_the_programs_call_them_and_keep_no_rules_of_their_own() -> None:
    calls = {
        node.func.id
        for node in ast.walk(ast.parse(PULL_SCRIPT))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert {"check_manifest", "loads_strict"} <= calls
    assert (
        "json.loads" not in PULL_SCRIPT
        and "json.load(" not in SERVE_SCRIPT
        and "def clean" not in PULL_SCRIPT
    )
    assert "loads_strict(" in SERVE_SCRIPT  # the cached manifest too


_paths = st.one_of(
    st.sampled_from(
        ["blobs/w0", "blobs", "a/b/c", "../x", "/abs", ".sparkforge-part/p", "a//b", "a/./b", "."]
    ),
    st.text(st.characters(codec="utf-8"), max_size=12),
)
_entry = st.one_of(
    st.fixed_dictionaries(
        {
            "path": _paths,
            "size": st.one_of(st.integers(-2, 1 << 43), st.floats(allow_nan=False), st.booleans(), st.none()),
            "sha256": st.one_of(st.just("a" * 64), st.just("A" * 64), st.text(max_size=70)),
        }
    ),
    st.fixed_dictionaries(
        {"path": _paths, "link": st.one_of(st.sampled_from(["w0", "../w0", "/etc"]), st.integers())}
    ),
    st.none(),
    st.integers(),
)


def _outcome(check: object, entries: object) -> object:
    try:
        return check(entries)  # type: ignore[operator]
    except ValueError as exc:
        return ("refused", str(exc))


@settings(max_examples=300, deadline=2000, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.lists(_entry, max_size=6), _entry))
def test_the_shipped_check_and_the_hosts_agree(entries: object) -> None:
    shipped = _shipped(PULL_SCRIPT)
    host = _outcome(boundary.check_manifest, entries)
    assert _outcome(shipped["check_manifest"], entries) == host
    if not (isinstance(host, tuple) and host and host[0] == "refused"):
        files, _ = host  # type: ignore[misc]
        assert all(
            0 <= size <= 1 << 42 and boundary.manifest_path(rel) == rel for rel, (size, _) in files.items()
        )


@settings(max_examples=200, deadline=2000, derandomize=True)
@given(st.text(max_size=60))
def test_shipped_json_refuses_what_the_host_refuses(text: str) -> None:
    loads = _shipped(PULL_SCRIPT)["loads_strict"]
    assert _outcome(loads, text) == _outcome(boundary.loads_strict, text)
    for hostile in ('{"a": NaN}', '{"a": 1e999}', '{"a": 1, "a": 2}', "1" * 41):
        assert _outcome(loads, hostile)[0] == "refused"  # type: ignore[index]

"""Property tests (hypothesis) over the typed readers and the command line, on inputs no list foresees: generated
checkpoint config.json values for `invoke memory --model-dir`, golden files, /metrics texts, and combinations
of hostile and good option values across tasks' --dry, through the real task parser. The oracle is the
project's rule: a value is accepted, or refused by a SparkforgeError naming the key (or option) with a fix;
never a traceback, never an engine or network contact. Each test is derandomized (the same examples in CI) with
its example count and deadline stated, so that it stays under ~10 s on a loaded 2-core machine."""

from __future__ import annotations

import copy
import functools
import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from option_fuzz import ROOT, alone, baselines, classes_for, hostile_values, isolated, options_of, run_cli

import tasks
from sparkforge.errors import SparkforgeError
from sparkforge.run.conform.goldentypes import check_golden
from sparkforge.run.memory.checkpoint import parse_architecture
from sparkforge.run.memory.memoryplan import plan_memory, read_settings
from sparkforge.run.prometheus import counter_total, read_samples

SHIPPED = ROOT / "profiles" / "checkpoints" / "Qwen" / "Qwen3.5-35B-A3B-FP8" / "unpinned.json"
SERVE = ["--recipe=vllm-qwen35", "--profile=qwen35-35b-a3b-fp8"]


def checked(examples: int) -> settings:
    """`examples` examples, the same in every run (derandomized), no per-example deadline (a loaded CI machine);
    the test's whole time is what the count bounds."""
    return settings(
        max_examples=examples, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )


@functools.cache
def _shipped() -> dict:
    return json.loads(SHIPPED.read_text())


def _numeric_keys(node: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key of the shipped config whose value is a number or a list of numbers (what the plan computes on)."""
    if isinstance(node, dict):
        return [p for k, v in sorted(node.items()) for p in _numeric_keys(v, (*path, k))]
    numeric = isinstance(node, int | float) and not isinstance(node, bool)
    listed = isinstance(node, list) and node and all(isinstance(x, int | float) for x in node)
    return [path] if numeric or listed else []


JSON_VALUES = st.one_of(
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([0, -1, 1, 2, 3, 7, 10**11, 1 << 40]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.booleans(),
    st.none(),
    st.lists(st.integers(-3, 1 << 33), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _mutated(changes: list[tuple[tuple[str, ...], object]]) -> dict:
    config = copy.deepcopy(_shipped())
    for path, value in changes:
        node = config
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return config


@checked(150)
@given(st.lists(st.tuples(st.sampled_from(_numeric_keys(_shipped())), JSON_VALUES), min_size=1, max_size=3))
def test_generated_checkpoint_values_are_planned_or_refused_naming_a_key(changes) -> None:
    config = _mutated(changes)
    try:
        arch = parse_architecture(config, "model/config.json")
        plan = plan_memory("p", arch, read_settings({}, {}, arch), fixes=True)
    except SparkforgeError as exc:
        message = str(exc)
        assert message.startswith("model/config.json") and "fix:" in message, message
        assert any(path[-1] in message for path, _ in changes), message  # the key it refused is named
        event("refused")
        return
    event("planned")
    assert plan.verdict in ("fits", "tight", "does not fit") or plan.verdict
    assert all(math.isfinite(n.kv_bytes) for n in plan.nodes)  # no inf or nan reached the figures


@checked(8)
@given(st.tuples(st.sampled_from(_numeric_keys(_shipped())), JSON_VALUES))
def test_memory_through_the_command_line_never_shows_a_traceback(change) -> None:
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(_mutated([change])))
        with isolated(Path(folder)) as guard:
            outcome = run_cli(alone(tasks.ns, "memory"), ["memory", *SERVE, f"--model-dir={model}"], guard)
    assert not outcome.traceback and "Traceback" not in outcome.output and outcome.contacts == [], outcome
    assert outcome.code == 0 or (change[0][-1] in outcome.output and "fix:" in outcome.output), outcome.output


# Golden files: token ids and top log probabilities as generated, including the hostile corners.
LOGPROBS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, -9999.0, 1e308, -1e308, 1e-3])
)
TOKEN = st.one_of(st.integers(-2, (1 << 31) + 2), st.sampled_from([0, 1, 2]))
STEP = st.lists(st.tuples(TOKEN, LOGPROBS), max_size=4)


@checked(150)
@given(
    st.lists(st.lists(TOKEN, max_size=4), max_size=3),
    st.one_of(st.none(), st.lists(st.lists(STEP, max_size=4), max_size=3)),
    st.sampled_from(["sparkforge-golden/1", "sparkforge-golden/2", ""]),
)
def test_golden_files_are_typed_or_refused_naming_the_key(ids, tops, fmt) -> None:
    data = {"format": fmt, "token_ids": ids, "top_logprobs": tops}
    try:
        golden = check_golden(json.loads(json.dumps(data)), "golden.json")
    except SparkforgeError as exc:
        assert str(exc).startswith("golden.json") and "fix:" in str(exc), str(exc)
        event("refused")
        return
    event("typed")
    for top, ids_of in zip(
        golden.top_logprobs or [[] for _ in golden.token_ids], golden.token_ids, strict=True
    ):
        if golden.top_logprobs is None:
            break
        assert len(top) == len(ids_of)
        for step in top:
            assert all(-1e5 <= lp <= 1e-3 for _, lp in step)  # log probabilities, never +1e308
            assert len({t for t, _ in step}) == len(step)  # no token twice in one top list


# /metrics: lines of a Prometheus text as generated (names, label sets, values, repeats).
NAMES = st.sampled_from(["vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total", "vllm:other", "9bad", ""])
LABELS = st.sampled_from(["", '{model="m"}', '{model="n"}', "{", '{a="}"}'])
VALUES = st.one_of(
    st.sampled_from(["1", "0", "-1", "NaN", "+Inf", "-Inf", "1e400", "x", "1_0", "٣"]),
    st.floats(allow_nan=False).map(repr),
)
LINE = st.one_of(
    st.tuples(NAMES, LABELS, VALUES).map(lambda t: f"{t[0]}{t[1]} {t[2]}"),
    st.sampled_from(["# HELP x y", "", "   "]),
)


@checked(200)
@given(st.lists(LINE, max_size=8))
def test_metrics_texts_are_read_or_refused_never_summed_twice(lines) -> None:
    text = "\n".join(lines)
    try:
        samples = read_samples(text, "the server's /metrics")
        total = counter_total(text, "vllm:prefix_cache_hits")
    except SparkforgeError as exc:
        assert str(exc).startswith("the server's /metrics") and "fix:" in str(exc), str(exc)
        event("refused")
        return
    event("read")
    assert math.isfinite(total) and total >= 0
    assert len(samples) == len({(n, lb) for n, lb in samples})  # each series once: a repeat was refused
    series = [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]
    assert len(series) == len(set(series))


# Option combinations across tasks' --dry, through the real parser: a hostile value among good ones is refused
# before anything is contacted, naming one of the hostile options.
DRY_TASKS = ("build", "conform", "bench.bench")
_OPTIONS = {task: [o for o in options_of(tasks.ns) if o.task == task] for task in DRY_TASKS}


@st.composite
def _combination(draw):
    task = draw(st.sampled_from(DRY_TASKS))
    options = draw(
        st.lists(st.sampled_from(_OPTIONS[task]), min_size=1, max_size=3, unique_by=lambda o: o.name)
    )
    hostile = {
        o.name: draw(st.sampled_from(classes_for(o))) for o in options[: draw(st.integers(1, len(options)))]
    }
    return task, options, hostile


@checked(25)
@given(_combination())
def test_hostile_values_among_good_ones_are_refused_before_any_contact(combination) -> None:
    task, options, hostile = combination
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        values, good = hostile_values(tmp), baselines(tmp)
        argv, named = [task, "--dry"], []
        for option in _OPTIONS[task]:
            if option.name in hostile:
                argv += option.given(values[hostile[option.name]])
                named.append(option.flag)
            elif option.required or (option in options and option.name in good):
                argv += option.given(good[option.name])
        with isolated(tmp) as guard:
            outcome = run_cli(alone(tasks.ns, task), argv, guard)
    shown = f"{task} {hostile}: {outcome}"
    assert outcome.code != 0 and not outcome.traceback and "Traceback" not in outcome.output, shown
    assert outcome.contacts == [] and outcome.seconds < 5, shown
    assert any(flag in outcome.output for flag in named) and "fix:" in outcome.output, shown

"""Plan vs real configure: the arch plan preflight predicts with `cmake -P` must be what vLLM's CMake chose.

Two comparisons: (1) every "Building X for archs: A" / "Not building X" message of the real configure against
the plan's, and (2) per probed unit, the `-gencode` targets of its real compile command against the archs of
the plan's kernel groups whose `set_gencode_flags_for_srcs` calls name that unit in CMakeLists.txt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkforge.preflight import cmake

_VAR = re.compile(r'^"?\$\{([A-Za-z0-9_]+)\}"?$')
_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")
_CODE = re.compile(r"code=\[?([A-Za-z0-9_,]+)\]?")


def plan_codes(archs: Sequence[str]) -> set[str]:
    """CMake arch entries ('12.1a', '8.0+PTX') -> the nvcc code targets they produce ('sm_121a', 'compute_80')."""
    out: set[str] = set()
    for entry in archs:
        match = _ARCH.match(entry.strip())
        if match is None:
            continue
        code = f"{match[1]}{match[2]}{match[3]}"
        out.add(f"sm_{code}")
        if match[4]:
            out.add(f"compute_{code}")
    return out


def gencode_codes(flags: Sequence[str]) -> set[str]:
    """'arch=compute_121a,code=sm_121a' flags -> {'sm_121a'} (every code= target)."""
    out: set[str] = set()
    for flag in flags:
        for match in _CODE.finditer(flag):
            out.update(c for c in match.group(1).split(",") if c)
    return out


@dataclass(frozen=True)
class GencodeCall:
    """One `set_gencode_flags_for_srcs` call: its line, the sources it names and its CUDA_ARCHS variable."""

    line: int
    sources: tuple[str, ...]
    archs_variable: str


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value


def gencode_calls(lists_text: str) -> list[GencodeCall]:
    """Every set_gencode_flags_for_srcs call with its sources resolved through earlier set()/list(APPEND)."""
    values: dict[str, list[str]] = {}
    calls: list[GencodeCall] = []

    def expand(arg: str) -> list[str]:
        match = _VAR.match(arg)
        return list(values.get(match.group(1), [])) if match else [_unquote(arg)]

    for call in cmake.invocations(lists_text):
        args = call.arguments()
        if call.name == "set" and args:
            values[args[0]] = [s for a in args[1:] if a not in ("PARENT_SCOPE",) for s in expand(a)]
        elif call.name == "list" and len(args) >= 2 and args[0] == "APPEND":
            values.setdefault(args[1], []).extend(s for a in args[2:] for s in expand(a))
        elif call.name == "set_gencode_flags_for_srcs":
            sources: list[str] = []
            variable = ""
            key = ""
            for arg in args:
                if arg in ("SRCS", "CUDA_ARCHS"):
                    key = arg
                elif key == "SRCS":
                    sources += expand(arg)
                elif key == "CUDA_ARCHS":
                    match = _VAR.match(arg)
                    variable = match.group(1) if match else _unquote(arg)
            calls.append(GencodeCall(call.line, tuple(sources), variable))
    return calls


def planned_codes(
    unit: str, calls: Sequence[GencodeCall], plan: dict[str, Any]
) -> tuple[set[str], list[str]]:
    """The code targets the plan predicts for `unit`, and which plan groups said so."""
    codes: set[str] = set()
    groups: list[str] = []
    for call in calls:
        if unit not in call.sources:
            continue
        if call.archs_variable == "CUDA_ARCHS":
            codes |= plan_codes(plan.get("cuda_archs", []))
            groups.append(f"CUDA_ARCHS={';'.join(plan.get('cuda_archs', []))}")
            continue
        earlier = [
            g
            for g in plan.get("groups", [])
            if g["variable"] == call.archs_variable and g["line"] < call.line
        ]
        if earlier:
            group = max(earlier, key=lambda g: g["line"])
            codes |= plan_codes(group["archs"])
            groups.append(f"{group['name']} ({group['variable']}={';'.join(group['archs']) or 'nothing'})")
    return codes, groups


def _building(messages: Sequence[str]) -> dict[str, list[str]]:
    """'Building X for archs: A' / 'Not building X as ...' lines grouped by X (the kernel group)."""
    out: dict[str, list[str]] = {}
    for message in messages:
        text = message.removeprefix("-- ").strip()
        if text.startswith(("Building ", "Not building ")):
            body = text.removeprefix("Not building ").removeprefix("Building ")
            out.setdefault(re.split(r" for archs| as |:", body)[0].strip(), []).append(text)
    return {key: sorted(texts) for key, texts in out.items()}


def compare(
    plan: dict[str, Any], configure_messages: Sequence[str], units: Sequence[dict[str, Any]], lists_text: str
) -> list[str]:
    """Every disagreement between the plan and the real configure, each naming both sides; [] = they agree."""
    problems: list[str] = []
    planned, real = _building(plan.get("vllm_messages", [])), _building(configure_messages)
    for key in sorted(planned):  # the plan's kernel groups; external projects print their own messages
        if planned[key] != real.get(key):
            problems.append(
                f"{key}: cmake -P plan says {planned.get(key, '(nothing)')!r}, "
                f"the real configure says {real.get(key, '(nothing)')!r}"
            )
    calls = gencode_calls(lists_text)
    for unit in units:
        if "gencode" not in unit:
            continue
        expected, groups = planned_codes(unit["source"], calls, plan)
        actual = gencode_codes(unit["gencode"])
        if expected != actual:
            problems.append(
                f"{unit['source']}: cmake -P plan predicts {sorted(expected) or 'no kernels'} "
                f"(from {', '.join(groups) or 'no set_gencode_flags_for_srcs call'}), the real compile command "
                f"has {sorted(actual) or 'no -gencode'}"
            )
    return problems

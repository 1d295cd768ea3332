"""Just enough of CMake's syntax to run vLLM's own arch-selection logic in script mode (`cmake -P`).

`script_of` keeps a CMake file's control flow, variable commands and calls to *pure* functions (those
made only of such commands, e.g. `cuda_archs_loose_intersection`), and drops everything that needs a
configure step (targets, FetchContent, find_package, properties, processes). The kept text is vLLM's,
verbatim, so the result is what its CMakeLists.txt computes, not a re-implementation of it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Commands that only compute variables or steer control flow; all of them work under `cmake -P`.
SCRIPT_SAFE = frozenset(
    {
        "if",
        "elseif",
        "else",
        "endif",
        "foreach",
        "endforeach",
        "while",
        "endwhile",
        "break",
        "continue",
        "set",
        "unset",
        "list",
        "string",
        "math",
        "message",
        "return",
        "cmake_parse_arguments",
        "separate_arguments",
    }
)
_BLOCK_OPEN = {"function": "endfunction", "macro": "endmacro"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACKET_OPEN = re.compile(r"\[(=*)\[")


@dataclass(frozen=True)
class Invocation:
    """One command invocation: its name (lowercase), raw argument text, source span and line."""

    name: str
    args: str
    start: int
    end: int
    line: int

    def arguments(self) -> list[str]:
        return split_arguments(self.args)


def _skip_bracket(text: str, pos: int) -> int:
    """`pos` at '[' of a bracket opener; returns the index after the matching closer."""
    match = _BRACKET_OPEN.match(text, pos)
    assert match is not None
    closer = "]" + match.group(1) + "]"
    end = text.find(closer, match.end())
    return len(text) if end < 0 else end + len(closer)


def _skip_comment(text: str, pos: int) -> int:
    """`pos` at '#'; returns the index after the comment (line or bracket comment)."""
    if _BRACKET_OPEN.match(text, pos + 1):
        return _skip_bracket(text, pos + 1)
    end = text.find("\n", pos)
    return len(text) if end < 0 else end


def _skip_quoted(text: str, pos: int) -> int:
    """`pos` at '"'; returns the index after the closing quote."""
    i = pos + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i + 1
        i += 1
    return len(text)


def _close_paren(text: str, pos: int) -> int:
    """`pos` just after '('; returns the index of the matching ')'."""
    depth, i = 1, pos
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i = _skip_quoted(text, i)
            continue
        if ch == "#":
            i = _skip_comment(text, i)
            continue
        if ch == "[" and _BRACKET_OPEN.match(text, i):
            i = _skip_bracket(text, i)
            continue
        if ch == "\\":
            i += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError(f"unbalanced parenthesis from offset {pos}")


def invocations(text: str) -> list[Invocation]:
    """Every top-level command invocation of a CMake file, in order."""
    out: list[Invocation] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "#":
            i = _skip_comment(text, i)
            continue
        match = _IDENT.match(text, i)
        if match is None:
            i += 1
            continue
        j = match.end()
        while j < len(text) and text[j] in " \t":
            j += 1
        if j >= len(text) or text[j] != "(":
            i = match.end()
            continue
        close = _close_paren(text, j + 1)
        line = text.count("\n", 0, i) + 1
        out.append(Invocation(match.group().lower(), text[j + 1 : close], i, close + 1, line))
        i = close + 1
    return out


def split_arguments(args: str) -> list[str]:
    """Raw arguments (quotes kept) of an invocation's argument text."""
    out: list[str] = []
    i = 0
    while i < len(args):
        ch = args[i]
        if ch.isspace():
            i += 1
            continue
        if ch == "#":
            i = _skip_comment(args, i)
            continue
        start = i
        if ch == '"':
            i = _skip_quoted(args, i)
        elif ch == "[" and _BRACKET_OPEN.match(args, i):
            i = _skip_bracket(args, i)
        else:
            depth = 0
            while i < len(args) and not (args[i].isspace() and depth == 0):
                if args[i] == "(":
                    depth += 1
                elif args[i] == ")":
                    depth -= 1
                elif args[i] == "\\":
                    i += 1
                elif args[i] == '"':
                    i = _skip_quoted(args, i) - 1
                i += 1
        out.append(args[start:i])
    return out


@dataclass(frozen=True)
class Block:
    """A function or macro definition: its name and every invocation inside it."""

    name: str
    start: int
    end: int
    body: tuple[Invocation, ...]


def split_blocks(calls: list[Invocation]) -> tuple[list[Block], list[Invocation]]:
    """Separate function/macro definitions from the top-level invocations."""
    blocks: list[Block] = []
    top: list[Invocation] = []
    i = 0
    while i < len(calls):
        call = calls[i]
        closer = _BLOCK_OPEN.get(call.name)
        if closer is None:
            top.append(call)
            i += 1
            continue
        depth, j = 1, i + 1
        while j < len(calls) and depth:
            if calls[j].name == call.name:
                depth += 1
            elif calls[j].name == closer:
                depth -= 1
            j += 1
        name = (call.arguments() or [""])[0].lower()
        blocks.append(Block(name, call.start, calls[j - 1].end, tuple(calls[i + 1 : j - 1])))
        i = j
    return blocks, top


def pure_functions(blocks: Iterable[Block]) -> frozenset[str]:
    """Functions/macros whose bodies use only script-safe commands or other pure functions."""
    pending = {b.name: b for b in blocks}
    pure: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, block in list(pending.items()):
            if all(c.name in SCRIPT_SAFE or c.name in pure for c in block.body):
                pure.add(name)
                del pending[name]
                changed = True
    return frozenset(pure)


def script_of(
    text: str,
    known_pure: frozenset[str] = frozenset(),
    *,
    after: Mapping[str, str] | None = None,
    fatal: str | None = None,
) -> tuple[str, frozenset[str]]:
    """The runnable part of a CMake file, and the pure functions it defines.

    `after` maps a function name to a CMake template emitted after each top-level call of it, with
    {line}, {out} and {src} replaced by the call's line, first and second raw arguments. With `fatal`,
    top-level `message(FATAL_ERROR ...)` becomes `message(STATUS "<fatal>|<line>|" ...)`: a dropped
    command (e.g. a code generator run) may leave a variable that vLLM's error path would trip on.
    """
    calls = invocations(text)
    blocks, top = split_blocks(calls)
    pure = pure_functions(blocks) | known_pure
    # A block may call a pure function defined in another file: recompute with those known.
    pure = pure_functions(b for b in blocks if b.name not in pure) | pure
    pieces: list[str] = [text[b.start : b.end] for b in blocks if b.name in pure]
    for call in top:
        if call.name not in SCRIPT_SAFE and call.name not in pure:
            continue
        args = call.arguments()
        if fatal is not None and call.name == "message" and args[:1] == ["FATAL_ERROR"]:
            rest = " ".join(args[1:])
            pieces.append(f'message(STATUS "{fatal}|{call.line}|" {rest})')
            continue
        pieces.append(text[call.start : call.end])
        template = (after or {}).get(call.name)
        if template is not None:
            args = [*call.arguments(), "", ""]
            src = args[1] if args[1].startswith('"') else f'"{args[1]}"'
            pieces.append(template.format(line=call.line, out=args[0], src=src))
    return "\n".join(pieces) + "\n", frozenset(pure)


def emulated_select_cmake() -> str:
    """A minimal stand-in for torch's `cuda_select_nvcc_arch_flags` for numeric lists (X.Y[a|f][+PTX])."""
    return r"""
function(cuda_select_nvcc_arch_flags out_variable)
  set(_list "${ARGN}")
  string(REGEX REPLACE "[ \t]+" ";" _list "${_list}")
  set(_flags)
  set(_ptx)
  foreach(_name ${_list})
    set(_add_ptx FALSE)
    if(_name MATCHES "(.*)\\+PTX$")
      set(_add_ptx TRUE)
      set(_name ${CMAKE_MATCH_1})
    endif()
    if(NOT _name MATCHES "^[0-9]+\\.[0-9][af]?$")
      message(SEND_ERROR "Found Unknown CUDA Architecture Name in CUDA_SELECT_NVCC_ARCH_FLAGS: ${_name} ")
    endif()
    string(REPLACE "." "" _code "${_name}")
    list(APPEND _flags -gencode arch=compute_${_code},code=sm_${_code})
    if(_add_ptx)
      list(APPEND _ptx ${_code})
    endif()
  endforeach()
  foreach(_code ${_ptx})
    list(APPEND _flags -gencode arch=compute_${_code},code=compute_${_code})
  endforeach()
  set(${out_variable} ${_flags} PARENT_SCOPE)
endfunction()
"""

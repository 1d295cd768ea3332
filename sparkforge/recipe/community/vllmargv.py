"""A community recipe's `vllm serve ...` line -> vLLM's own argv, read the way vLLM's parser reads it.

The command is a shell line in the source formats, so it is read as one: quotes and backslash line
continuations as bash has them; anything a shell would run or expand besides `vllm serve` ($(...), backticks,
variables, `;`, `&`, pipes, redirections, several lines) is refused, never interpreted. The options are then
read as vLLM's FlexibleArgumentParser reads them (vllm/utils/argparse_utils.py): `--flag=value` and
`--flag value`, underscores as dashes in the name, short aliases (`-tp`) from the pinned vLLM's own
add_argument calls, `-O3`, dotted config forms (`--compilation-config.mode 3`, `-cc.mode=3`), `--no-flag`,
several values for one flag, and the last of a repeated flag winning.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from sparkforge.errors import RecipeError

# vLLM's short aliases (vllm/engine/arg_utils.py, 0.2x-0.33): used only when the pinned vLLM's own are unknown.
FALLBACK_ALIASES = {
    "tp": "tensor-parallel-size",
    "pp": "pipeline-parallel-size",
    "dp": "data-parallel-size",
    "ep": "enable-expert-parallel",
    "q": "quantization",
    "sc": "speculative-config",
    "cc": "compilation-config",
    "ac": "attention-config",
    "O": "optimization-level",
}
_NUMBER = re.compile(r"-?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_+-]+)*")
_CONTINUATION = re.compile(r"\\[ \t]*\r?\n")


@dataclass(frozen=True)
class Option:
    """One vLLM option: its canonical name (long, dashes, no leading dashes; dotted tail kept), its values."""

    flag: str
    values: tuple[str, ...]
    spelled: str

    def tokens(self) -> list[str]:
        return [f"--{self.flag}", *self.values]


@dataclass(frozen=True)
class ServeArgv:
    """`vllm serve MODEL OPTIONS...` as vLLM reads it (repeated flags: the last one, where it stands)."""

    model: str
    options: tuple[Option, ...]

    def get(self, flag: str) -> Option | None:
        return next((o for o in self.options if o.flag == flag), None)

    def tokens(self) -> list[str]:
        return ["serve", self.model, *(t for o in self.options for t in o.tokens())]


def _shell_problem(line: str) -> str:
    """What in `line` a shell would do besides passing words to vllm, or '' (bash's quoting and escapes)."""
    quote, index = "", 0
    while index < len(line):
        char = line[index]
        index += 1
        if quote == "'":
            quote = "" if char == "'" else quote
            continue
        if char == "\\":
            # Outside quotes a backslash makes the next character literal; inside "..." only $ ` " \ are escaped
            # (and Python's shlex keeps the backslash before $ and `: refused rather than read differently).
            if quote and line[index : index + 1] in ("$", "`"):
                return "escapes $ or ` inside double quotes (write the value in single quotes)"
            index += 1 if not quote or line[index : index + 1] in ('"', "\\") else 0
            continue
        if char in "$`":
            start = index - 1
            what = (
                "a command substitution" if line[start : start + 2] == "$(" or char == "`" else "a variable"
            )
            return f"has {what} ({line[start : start + 12]!r}), which a shell would run or expand"
        if quote == '"':
            quote = "" if char == '"' else quote
        elif char in "'\"":
            quote = char
        elif char in ";&|<>()":
            return f"has {char!r} outside quotes (a shell would chain, pipe, background or redirect)"
        elif char == "#" and (index == 1 or line[index - 2] in " \t"):
            return "has a '#' comment inside the command"
        elif char in "*?[{}" or (char == "~" and (index == 1 or line[index - 2] in " \t=")):
            return f"has {char!r} outside quotes (a shell would expand it: glob, braces or home); quote the value"
    if quote:
        return f"has an unclosed {quote} quote"
    return ""


def split_command(text: str, where: str) -> list[str]:
    """The words of a one-line shell command (continuations joined); RecipeError on anything else."""
    joined = _CONTINUATION.sub(" ", text)
    lines = [line for line in joined.split("\n") if line.strip()]  # bash ends a command at \n only
    if len(lines) != 1:
        raise RecipeError(
            f"{where}: the command is {len(lines) or 'no'} shell line(s), not one `vllm serve ...` line (a line "
            "without a trailing backslash starts another command); fix: join the lines with ' \\' at each end"
        )
    problem = _shell_problem(lines[0])
    if problem:
        raise RecipeError(
            f"{where}: the command {problem}; sparkforge runs vLLM's argv, never a shell; fix: write plain "
            "`vllm serve MODEL --flag value ...` (JSON in single quotes, values from `defaults`)"
        )
    try:
        return shlex.split(lines[0])
    except ValueError as exc:
        raise RecipeError(
            f"{where}: the command does not split into words ({exc}); fix: check its quotes"
        ) from None


def _values(tokens: list[str], start: int) -> list[str]:
    out = []
    for token in tokens[start:]:
        if token.startswith("-") and not _NUMBER.fullmatch(token):
            break
        out.append(token)
    return out


def _name(written: str, aliases: Mapping[str, str], where: str) -> str:
    """A written option (`--max_model_len`, `-tp`, `-cc.mode`) -> vLLM's long name (dotted tail kept).

    As vLLM's parser: underscores become dashes only in a `--` name before its first dot; a single-dash name is
    a short alias of the pinned vLLM (`--tp` is not `-tp`).
    """
    raw = written.lstrip("-")
    head, dot, tail = raw.partition(".")
    if not _NAME.fullmatch(raw) or len(written) - len(raw) > 2:
        raise RecipeError(f"{where}: {written!r} is not a vLLM option; fix: e.g. --max-model-len 32768")
    if written.startswith("--"):
        return head.replace("_", "-") + dot + tail
    return aliases.get(head, head) + dot + tail


def parse_serve(tokens: list[str], aliases: Mapping[str, str], where: str) -> ServeArgv:
    """`vllm serve ...` words -> ServeArgv; RecipeError when the words are not a vLLM serve command."""
    if tokens[:2] != ["vllm", "serve"]:
        shown = " ".join(tokens[:3])[:80]
        raise RecipeError(
            f"{where}: the command starts {shown!r}, not `vllm serve` (a shell command or another entrypoint "
            "cannot become a serve profile); fix: write `vllm serve MODEL --flag value ...`"
        )
    rest = tokens[2:]
    model = rest.pop(0) if rest and not rest[0].startswith("-") else ""
    found: dict[str, Option] = {}
    index = 0
    while index < len(rest):
        token = rest[index]
        if not token.startswith("-") or token in ("-", "--"):
            raise RecipeError(
                f"{where}: {token!r} stands where vLLM expects an option (the model goes right after "
                "`vllm serve`); fix: remove it or give it a flag"
            )
        written, eq, value = token.partition("=")
        if written.startswith("-O") and not written.startswith("--") and written != "-O":
            name, values = "optimization-level", [written[2:].lstrip("=") or value]
        elif written == "-O" and not eq:
            name, values = "optimization-level", rest[index + 1 : index + 2]
            index += len(values)
        else:
            name = _name(written, aliases, where)
            if eq:
                values = [value]
            elif "." in name:  # vLLM takes the next word as a dotted option's value, whatever it is
                values = rest[index + 1 : index + 2]
                index += len(values)
            else:
                values = _values(rest, index + 1)
                index += len(values)
        index += 1
        if name == "model":
            if model or len(values) != 1:
                raise RecipeError(f"{where}: the model is given twice or without a value; fix: name it once")
            model = values[0]
            continue
        key = name.removeprefix("no-") if not values else name
        found.pop(key, None)
        found.pop(f"no-{key}", None)
        found[name] = Option(name, tuple(values), token)  # the last of a repeated flag wins
    if not model:
        raise RecipeError(f"{where}: the command names no model; fix: `vllm serve ORG/MODEL ...`")
    return ServeArgv(model, tuple(found.values()))


def typed(value: str) -> int | float | str:
    """A written value as the YAML scalar that prints back as the same word (`0.80` stays text)."""
    if re.fullmatch(r"-?\d+", value) and str(int(value)) == value:
        return int(value)
    if _NUMBER.fullmatch(value):
        try:
            number = float(value)
        except ValueError:
            return value
        if str(number) == value:
            return number
    return value


def option_value(option: Option, negatable: frozenset[str] | None = None) -> tuple[str, object]:
    """An option as a profile's `args` entry: (key, value) that Profile.serve_args() prints back as its tokens."""
    if not option.values:
        base = option.flag.removeprefix("no-")
        if base != option.flag and (negatable is None or base in negatable):
            return base, False
        return option.flag, True
    if len(option.values) == 1:
        return option.flag, typed(option.values[0])
    return option.flag, [typed(v) for v in option.values]


def shell_line(words: list[str]) -> str:
    """Already-quoted words as one `\\`-continued command line, a flag and its values per line."""
    lines: list[list[str]] = [[]]
    for word in words:
        if word.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(word)
    return " \\\n    ".join(" ".join(line) for line in lines) + "\n"


def comment_line(text: str) -> str:
    """Text safe inside one YAML `# comment` line: printable ASCII, anything else escaped (a NEL or U+2028
    would end the comment and start YAML)."""
    escaped = text.encode("ascii", "backslashreplace").decode("ascii")
    return "".join(c if 32 <= ord(c) < 127 else f"\\x{ord(c):02x}" for c in escaped)

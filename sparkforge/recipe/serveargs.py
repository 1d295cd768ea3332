"""What a serve profile may put on `vllm serve`'s command line and in its environment (pure rules, no I/O).

A profile's args become argv items after `vllm serve MODEL`; anything that reads as a flag there would be one.
So every value is checked as the argv item it becomes: no item starts with '-' (unless it is a number), no
reserved or code-loading flag under any spelling (underscores, `no-` prefix, abbreviations argparse would
expand), no secret (a secret on a command line or in env lands in `docker inspect`: mounted files only),
numbers finite and in range.
"""

from __future__ import annotations

import math
import re

# Flags sparkforge sets itself from --port, --nodes and the cluster plan; a profile setting them would conflict.
RESERVED_FLAGS = {
    "model": "the profile's 'model' key",
    "port": "--port",
    "host": "sparkforge (0.0.0.0 on the head)",
    "nnodes": "--nodes",
    "node-rank": "the cluster plan",
    "master-addr": "the cluster plan (the head's link address)",
    "master-port": "--master-port",
    "headless": "the cluster plan (every node but the head)",
    "distributed-executor-backend": "--backend",
    "data-parallel-address": "the cluster plan",
    "served-model-name": "the profile's 'served_model_name' key",
    "trust-remote-code": (
        "the command line only: it runs the model repository's own code with host network, IPC and the GPU; "
        "pass --trust-remote-code to 'invoke serve' or 'invoke cluster.up' when you mean it"
    ),
    "config": "the profile itself (a vLLM --config file would carry flags past these checks)",
}
_FLAG = re.compile(r"[a-z0-9][a-z0-9_-]*(\.[a-z0-9_-]+)*")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
# A model is a Hugging Face id or a path inside the container: never a flag, never whitespace.
MODEL = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./:@+=-]{0,255}")
# Name segments that mark a secret; `*_PATH`/`*_FILE`/`*_DIR` name where a (mounted) secret is, not the secret.
_SECRET_WORDS = re.compile(
    r"(?:^|[_-])(token|secret|secrets|password|passwd|passphrase|credential|credentials|apikey|api[_-]key|"
    r"access[_-]key|private[_-]key|secret[_-]key|auth)(?:$|[_-])",
    re.IGNORECASE,
)
_SECRET_NAME_OK = re.compile(r".*[_-](path|file|dir)$", re.IGNORECASE)
# Token formats that are secrets wherever they appear (Hugging Face, OpenAI-style, GitHub, AWS, Slack, GitLab, JWT, PEM).
_SECRET_VALUE = re.compile(
    r"hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
    r"AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|glpat-[A-Za-z0-9_-]{16,}|"
    r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.|-----BEGIN [A-Z ]*PRIVATE KEY"
)
SECRET_FIX = (
    "would land in 'docker inspect' and the logs; fix: remove it and pass secrets as mounted files only "
    "(--hf-token-file: mounted, never in env)"
)
# Flags whose values vLLM reads as counts or fractions: wrong ones fail here, not minutes into a launch.
_COUNTS = ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size", "data-parallel-size-local")
_POSITIVE = ("max-model-len", "max-num-batched-tokens", "max-num-seqs", "tp", "pp")
_HUMAN_SIZE = re.compile(r"[1-9][0-9]*[kKmMgG]?")  # vLLM takes max-model-len as 32768 or 32k
MAX_ABS = 2**53  # beyond this a YAML number is not an exact integer any more


def norm_flag(key: str) -> str:
    return key.replace("_", "-")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_WORDS.search(name)) and not _SECRET_NAME_OK.fullmatch(name)


def is_secret_value(text: str) -> bool:
    return bool(_SECRET_VALUE.search(text))


def _numeric(flag: str) -> bool:
    return flag in (*_COUNTS, *_POSITIVE, "gpu-memory-utilization") or flag.endswith("-port")


def check_flag(key: str) -> str:
    """The flag name as written in a profile's args -> '' when fine, else the reason and the fix."""
    if key.startswith("-"):
        return f"{key!r} has dashes; fix: write the flag without dashes: '{key.lstrip('-')}: ...' instead of '{key}: ...'"
    if not _FLAG.fullmatch(key):
        return f"{key!r} is not a vLLM flag name; fix: e.g. 'max-model-len: 32768'"
    flag = norm_flag(key).split(".", 1)[0]
    base = flag.removeprefix("no-")
    if base in RESERVED_FLAGS:
        return f"{key!r} is set by {RESERVED_FLAGS[base]}; fix: remove it from args"
    prefixed = sorted(r for r in RESERVED_FLAGS if r.startswith(base) and r != base)
    if prefixed:
        return (
            f"{key!r} is an abbreviation vLLM's parser would expand to --{prefixed[0]}, which is set by "
            f"{RESERVED_FLAGS[prefixed[0]]}; fix: remove it from args"
        )
    if is_secret_name(flag):
        return f"{key!r} carries a secret and {SECRET_FIX}"
    return ""


def _check_number(key: str, value: float | int) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key!r}: {value} is not a finite number; fix: write a number"
    if abs(value) > MAX_ABS:
        return f"{key!r}: {value} is out of range; fix: write a number below {MAX_ABS}"
    flag = norm_flag(key)
    if (flag == "port" or flag.endswith("-port")) and not (isinstance(value, int) and 1 <= value <= 65535):
        return f"{key!r}: {value} is not a port; fix: use a whole number from 1 to 65535"
    if flag in _COUNTS + _POSITIVE and not (isinstance(value, int) and value >= 1):
        return f"{key!r}: {value} must be a whole number of at least 1; fix: e.g. '{key}: 2'"
    if flag == "gpu-memory-utilization" and not 0 < value <= 1:
        return f"{key!r}: {value} is a fraction of the GPU's memory; fix: use a number above 0 and at most 1, e.g. 0.8"
    if value < 0 and value != -1:
        return f"{key!r}: {value} is negative; fix: use a number of at least 0 (or -1 where vLLM means 'no limit')"
    return ""


def check_value(key: str, value: object) -> str:
    """One arg's value (a scalar or a list of scalars) -> '' when fine, else the reason and the fix."""
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        return f"{key!r}: an empty list would leave a bare --{key}; fix: list values, or write true/false"
    flag = norm_flag(key)
    if _numeric(flag) and isinstance(value, bool | list):
        return f"{key!r} takes one number; fix: e.g. '{key}: 2'"
    for item in items:
        if isinstance(item, bool):
            if isinstance(value, list):
                return f"{key!r}: true/false inside a list; fix: write the values as text or numbers"
            continue
        if isinstance(item, int | float):
            problem = _check_number(key, item)
        elif isinstance(item, str):
            problem = _check_text(key, item)
        else:
            problem = (
                f"{key!r}: {type(item).__name__} is not a flag value; fix: write text, a number or true/false"
            )
        if problem:
            return problem
    return ""


def _check_text(key: str, text: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        return (
            f"{key!r}: values are one line of printable text; fix: remove the line break or control character"
        )
    if is_secret_value(text):
        return f"{key!r}: the value looks like a secret and {SECRET_FIX}"
    flag = norm_flag(key)
    if _NUMBER.fullmatch(text.strip()):
        number = float(text)
        return _check_number(key, int(number) if number.is_integer() and "." not in text else number)
    if text.strip().lower() in ("nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "-infinity"):
        return f"{key!r}: {text} is not a finite number; fix: write a number"
    if re.search(r"\s--?[A-Za-z]", text):
        return f"{key!r}: the value {text!r} reads like more flags inside one value; fix: write each flag as its own key"
    if text.startswith("-"):
        return (
            f"{key!r}: the value {text!r} would be read as another flag; fix: write each flag as its own key "
            "(values never start with '-')"
        )
    if flag in ("max-model-len", "max-num-batched-tokens") and _HUMAN_SIZE.fullmatch(text):
        return ""
    if _numeric(flag):
        return f"{key!r}: {text!r} is not a number; fix: e.g. '{key}: 2'"
    return ""


def check_env(name: str, value: object) -> str:
    """One profile environment variable's form and value -> '' when fine, else the reason and the fix (whether
    the variable may be set at all is the allow-list's: sparkforge/recipe/allowlist.py)."""
    if not _ENV.fullmatch(name):
        return f"{name!r} is not an environment variable name; fix: use letters, digits and _"
    if is_secret_name(name):
        return f"{name} {SECRET_FIX}"
    if not isinstance(value, str):
        return f'{name}: write the value as a quoted string, e.g. {name}: "1"'
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return (
            f"{name}: values are one line of printable text; fix: remove the line break or control character"
        )
    if is_secret_value(value):
        return f"{name}: the value looks like a secret and {SECRET_FIX}"
    return ""

"""Every command-line option's type, at the boundary: Invoke hands a task strings, and each string is checked
here, by the option's kind, while Invoke parses the command line (before the task runs, so before any engine,
network or file write). A task may convert a value again; it never sees one this refused.

An option's kind is found by its name (`OPTION_KINDS`: one name, one meaning in every task), or by the task and
name where one name means two things (`TASK_KINDS`). An option in neither is untyped: `kind_of` answers None and
the hostile-input fuzzer (tests/unit/test_option_fuzz.py) fails, naming it. docs/inputs.md lists the kinds.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkforge.errors import InputError, SparkforgeError

MAX_OPTION_CHARS = 4096  # a path, URL or expression never needs more
MAX_NAMED_INPUT = 1 << 40  # the parse-time check of a named input file: its reader applies its own cap later

# The hostile classes every value-taking option refuses, whatever its kind.
UNIVERSAL = frozenset({"nul", "newline", "escape", "blank", "overlong"})
NUMBER = frozenset({"unicode-digit", "superscript", "underscore", "nan", "inf", "huge", "hex", "word"})
FILE_IN = frozenset({"fifo", "device", "folder", "missing", "link-out"})
FILE_OUT = frozenset({"folder", "fifo-out", "system-out", "link-out-dir"})
DIR_IN = frozenset({"fifo", "device", "missing", "file", "link-out"})
DIR_OUT = frozenset({"file", "fifo-out", "system-out", "link-out-dir"})
WORDLIKE = frozenset({"option-like", "unicode-word", "spaces"})
PAIR = frozenset({"empty-key", "no-equals", "empty"})  # KEY=VALUE values


@dataclass(frozen=True)
class Kind:
    """One type of option value: its check (flag, text) -> None or InputError, what it means in the docs, and
    the hostile classes the fuzzer feeds it (beyond `UNIVERSAL`)."""

    name: str
    doc: str
    check: Callable[[str, str], object]
    refuses: frozenset[str] = field(default_factory=frozenset)
    low: float | None = None  # numbers: the least value ('negative' is fed when it is 0 or more)


def _fail(flag: str, value: str, what: str, fix: str) -> InputError:
    return InputError(f"{flag} {value[:80]!r} is not {what}; fix: {fix}")


def check_text(flag: str, value: str) -> str:
    """The rule every option value passes: at most 4,096 printable characters (no NUL, newline, tab or terminal
    escape), not blank."""
    if len(value) > MAX_OPTION_CHARS:
        raise _fail(flag, value, f"a value of at most {MAX_OPTION_CHARS} characters", "give a shorter value")
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise InputError(
            f"{flag} {value[:80]!r} holds the control character {bad!r} (a NUL, newline, tab or terminal "
            "escape); fix: give the value without it"
        )
    if value and not value.strip():
        raise _fail(flag, value, "a value (it is blank)", "give a value, or leave the option out")
    return value


def _number(
    low: float, high: float, *, integer: bool, low_open: bool = False
) -> Callable[[str, str], object]:
    def check(flag: str, value: str) -> object:
        from sparkforge.boundary import check_number

        return check_number(flag, value, low=low, high=high, integer=integer, low_open=low_open)

    return check


def whole(low: int, high: int) -> Kind:
    """A whole number in ASCII digits, in [low, high]."""
    return Kind(
        f"whole {low}..{high}",
        f"a whole number from {low} to {high} (ASCII digits)",
        _number(low, high, integer=True),
        NUMBER | {"empty", "fraction"},
        low,
    )


def real(low: float, high: float, *, low_open: bool = False) -> Kind:
    """A finite decimal number in ASCII, in [low, high] ((low, high] with low_open)."""
    span = f"{'above ' if low_open else ''}{low:g} to {high:g}"
    return Kind(
        f"number {span}",
        f"a finite number {span} (ASCII: digits, one point, an exponent)",
        _number(low, high, integer=False, low_open=low_open),
        NUMBER | {"empty"},
        low,
    )


def whole_list(low: int, high: int) -> Kind:
    def check(flag: str, value: str) -> object:
        from sparkforge.boundary import parse_int_list

        return parse_int_list(flag, value, low=low, high=high)

    return Kind(
        f"whole list {low}..{high}",
        f"comma-separated whole numbers from {low} to {high}",
        check,
        NUMBER | {"empty-entry"},
        low,
    )


def choice(*values: str) -> Kind:
    def check(flag: str, value: str) -> object:
        from sparkforge.run.inputs import check_choice

        return check_choice(flag, value, values)

    return Kind(f"one of {'|'.join(values)}", f"one of {', '.join(values)}", check, WORDLIKE | {"empty"})


def pattern(name: str, regex: str, doc: str, example: str) -> Kind:
    compiled = re.compile(regex)

    def check(flag: str, value: str) -> object:
        if not compiled.fullmatch(value):
            raise _fail(flag, value, doc, f"e.g. {example}")
        return value

    return Kind(name, doc, check, WORDLIKE)


def _input_file(flag: str, value: str) -> object:
    from sparkforge.boundary import check_input

    return check_input(value, flag, MAX_NAMED_INPUT)


def _input_files(flag: str, value: str) -> object:
    parts = value.split(",")
    if any(not p for p in parts):
        raise _fail(flag, value, "a comma-separated list of files", "remove the empty entry")
    return [_input_file(flag, p) for p in parts]


def _input_dir(flag: str, value: str) -> object:
    from sparkforge.boundary import is_system_path

    path = Path(value)
    if is_system_path(path) and not is_system_path(path, resolve=False):
        raise InputError(
            f"{flag} {value[:80]}: a link to {path.resolve()}, a system folder; fix: name the folder itself"
        )
    if (path.is_symlink() and not path.resolve().is_dir()) or not path.is_dir():
        raise _fail(
            flag, value, "an existing folder", "name a folder that exists (not a file, pipe or device)"
        )
    return path


def _output_file(flag: str, value: str) -> object:
    from sparkforge.boundary import check_output

    return check_output(value, flag)


def _output_dir(flag: str, value: str) -> object:
    from sparkforge.boundary import check_output_dir

    return check_output_dir(value, flag)


def _host_path(flag: str, value: str) -> object:
    from sparkforge.run.inputs import check_host_path

    return check_host_path(flag, value)


def _reference(flag: str, value: str) -> object:
    from sparkforge.oci import check_reference

    return check_reference(flag, value)


def _reference_or_path(flag: str, value: str) -> object:
    """An image reference, or a path that exists (a folder, wheel or file sparkforge reads itself)."""
    from sparkforge.oci import is_reference

    if is_reference(value):
        return value
    path = Path(value)
    if path.is_dir() and not path.is_symlink():
        return path
    return _input_file(flag, value)


def _named_or_file(registry: str, doc: str) -> Kind:
    """A recipe, overlay or profile: a name in its folder (letters, digits, . _ -), or a path to a regular file."""
    name = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

    def check(flag: str, value: str) -> object:
        if name.fullmatch(value) and not value.endswith((".yaml", ".yml")):
            return value
        if "/" in value or value.endswith((".yaml", ".yml")):
            return _input_file(flag, value)
        raise _fail(
            flag,
            value,
            f"a {registry} name or a path to a {registry} file",
            f"`invoke {registry}s` lists the names; a path needs a '/'",
        )

    return Kind(registry, doc, check, WORDLIKE | {"fifo", "device", "missing-yaml", "empty"})


def _url(flag: str, value: str) -> object:
    from sparkforge.urlfetch import check_url

    return check_url(value, flag)


def _file_or_url(flag: str, value: str) -> object:
    if value.startswith(("https://", "http://")):
        return _url(flag, value)
    path = Path(value)
    return path if path.is_dir() and not path.is_symlink() else _input_file(flag, value)


def _nodes(flag: str, value: str) -> object:
    from sparkforge.run.nodes import parse_nodes

    return parse_nodes(value)


def _node(flag: str, value: str) -> object:
    from sparkforge.run.nodes import parse_node

    if "," in value:
        raise _fail(flag, value, "one node", "name one engine; --nodes takes several")
    return parse_node(value, 0)


def _interface(flag: str, value: str) -> object:
    from sparkforge.run.inputs import check_interface

    return check_interface(value)


def _platform(flag: str, value: str) -> object:
    from sparkforge.oci import check_platform

    return check_platform(flag, value)


def _layout(flag: str, value: str) -> object:
    from sparkforge.run.cluster.topology import layout

    return layout(value)


def _tag_or_digest(flag: str, value: str) -> object:
    from sparkforge.oci import check_digest, check_tag

    return check_digest(flag, value) if value.startswith("sha256:") else check_tag(flag, value)


def _digest(flag: str, value: str) -> object:
    from sparkforge.oci import check_digest

    return check_digest(flag, value)


def _tag(flag: str, value: str) -> object:
    from sparkforge.oci import check_tag

    return check_tag(flag, value)


_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _key_value(flag: str, value: str) -> object:
    """KEY=VALUE: a key of letters, digits, _ . - (never empty), a value of printable text."""
    key, eq, rest = value.partition("=")
    if not eq or not _KEY.fullmatch(key):
        raise _fail(flag, value, "KEY=VALUE with a key of letters, digits, _ . -", "e.g. name=value")
    return key, rest


def _key_values(flag: str, value: str) -> object:
    """k=v[,k=v...] (BuildKit's cache and secret specs)."""
    return [_key_value(flag, part) for part in value.split(",")]


def _base_image(flag: str, value: str) -> object:
    """REF, or builder=REF,runtime=REF."""
    if "=" not in value:
        return _reference(flag, value)
    for key, ref in _key_values(flag, value):  # type: ignore[misc]
        if key not in ("builder", "runtime"):
            raise _fail(flag, value, "REF or builder=REF,runtime=REF", "use builder= and runtime= only")
        _reference(flag, ref)
    return value


def _source_url(flag: str, value: str) -> object:
    """component=URL (a component's source tarball)."""
    _, url = _key_value(flag, value)  # type: ignore[misc]
    return _url(flag, url)


def _platform_equals_digest(flag: str, value: str) -> object:
    """PLATFORM=sha256:... (publish --digest)."""
    platform, eq, digest = value.partition("=")
    if not eq:
        raise _fail(flag, value, "PLATFORM=sha256:<64 hex>", "e.g. linux/arm64=sha256:...")
    _platform(flag, platform)
    return _digest(flag, digest)


def _ulimit(flag: str, value: str) -> object:
    from sparkforge.run.inputs import check_ulimits

    return check_ulimits([value])


def _shell_words(flag: str, value: str) -> object:
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise _fail(
            flag, value, f"words a shell would split ({exc})", "close the quote, or escape it"
        ) from None


def _source_checkout(flag: str, value: str) -> object:
    """preflight --source: 'pypi', 'github', or a checkout folder / sdist file."""
    if value in ("pypi", "github"):
        return value
    path = Path(value)
    return path if path.is_dir() and not path.is_symlink() else _input_file(flag, value)


def _key_or_uri(flag: str, value: str) -> object:
    """A cosign key: a file, or a KMS URI (scheme://...) cosign resolves itself."""
    if re.fullmatch(r"[a-z][a-z0-9+]*://[A-Za-z0-9_./:@%+=-]+", value):
        return value
    return _input_file(flag, value)


def _text(flag: str, value: str) -> object:
    return value


TEXT = Kind("text", "printable text (the common rule only)", _text)
INPUT_FILE = Kind(
    "input file",
    "a regular file that exists (no FIFO, device, folder, link to a system file)",
    _input_file,
    FILE_IN | {"empty"},
)
INPUT_FILES = Kind(
    "input files", "comma-separated input files", _input_files, FILE_IN | {"empty", "empty-entry"}
)
INPUT_DIR = Kind("input folder", "an existing folder (not a link to a system folder)", _input_dir, DIR_IN)
OUTPUT_FILE = Kind(
    "output file",
    "a file to write: not a folder, pipe or device, not under a system folder, "
    "not reached through a link out of the project",
    _output_file,
    FILE_OUT,
)
OUTPUT_DIR = Kind(
    "output folder",
    "a folder to write into (created): never a link, file, pipe or system folder",
    _output_dir,
    DIR_OUT,
)
HOST_PATH = Kind(
    "host path",
    "an absolute path on each node, mounted into containers: letters, digits, _ . / + "
    "@ % - only (no ':' or ',' mount specs, no '..')",
    _host_path,
    frozenset({"relative", "mount-spec", "dotdot"}),
)
IMAGE_REF = Kind(
    "image reference", "NAME[:TAG] or NAME@sha256:<64 hex> (OCI grammar)", _reference, WORDLIKE | {"empty"}
)
IMAGE_OR_PATH = Kind(
    "image or path",
    "an image reference, or a folder, wheel or file that exists",
    _reference_or_path,
    FILE_IN - {"folder"} | {"empty"},
)
RECIPE = _named_or_file("recipe", "a recipe name in recipes/ or a path to a recipe file")
OVERLAY = _named_or_file("overlay", "an overlay recipe name in recipes/overlays/ or a path to one")
PROFILE = _named_or_file("profile", "a profile name in profiles/ or a path to a profile file")
URL = Kind(
    "URL",
    "an http(s) URL with a host, no credentials, a port in 1..65535",
    _url,
    WORDLIKE | {"empty", "no-scheme"},
)
FILE_OR_URL = Kind(
    "file or URL", "an https:// URL, or a file or folder that exists", _file_or_url, FILE_IN - {"folder"}
)
NODES = Kind(
    "nodes",
    "comma-separated engines (unix://, tcp://, ssh://user@host or a context name), head first",
    _nodes,
    WORDLIKE | {"empty-entry"},
)
NODE = Kind("node", "one engine (unix://, tcp://, ssh://user@host or a context name)", _node, WORDLIKE)
INTERFACE = Kind(
    "interface", "a Linux interface name (at most 15 of letters, digits, _ . : -)", _interface, WORDLIKE
)
PLATFORM = Kind("platform", "linux/arm64 or linux/amd64", _platform, WORDLIKE | {"empty"})
TAG = Kind("tag", "an OCI tag (letters, digits, _ . -, at most 128)", _tag, WORDLIKE)
DIGEST = Kind("digest", "sha256: and 64 lowercase hex digits", _digest, WORDLIKE)
TAG_OR_DIGEST = Kind("tag or digest", "an OCI tag or sha256:<64 hex>", _tag_or_digest, WORDLIKE)
KEY_VALUE = Kind(
    "key=value",
    "KEY=VALUE, the key letters, digits, _ . - and never empty",
    _key_value,
    PAIR,
)
KEY_VALUES = Kind(
    "key=value list",
    "k=v[,k=v...] (BuildKit cache/secret specs)",
    _key_values,
    PAIR,
)
BASE_IMAGE = Kind("base image", "REF, or builder=REF,runtime=REF", _base_image, WORDLIKE | {"empty-key"})
SOURCE_URL = Kind(
    "component=URL",
    "COMPONENT=URL, the URL http(s)",
    _source_url,
    PAIR,
)
PLATFORM_DIGEST = Kind(
    "platform=digest",
    "PLATFORM=sha256:<64 hex>",
    _platform_equals_digest,
    PAIR,
)
ULIMIT = Kind("ulimit", "NAME=SOFT[:HARD], whole numbers", _ulimit, PAIR)
SHELL_WORDS = Kind(
    "shell words", "words as a shell splits them (quotes balanced)", _shell_words, frozenset({"open-quote"})
)
SOURCE_CHECKOUT = Kind(
    "vLLM source",
    "pypi, github, or a checkout folder or sdist file that exists",
    _source_checkout,
    FILE_IN - {"folder"},
)
KEY_OR_URI = Kind(
    "key", "a private key file that exists, or a KMS URI (scheme://...)", _key_or_uri, FILE_IN | {"empty"}
)
NAME = pattern("name", r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", "a name of letters, digits, _ . -", "default")
NAME_LIST = pattern(
    "names",
    r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}(,[A-Za-z0-9][A-Za-z0-9_.-]{0,63}){0,63}",
    "comma-separated names of letters, digits, _ . -",
    "determinism,streaming",
)
PACKAGE = pattern(
    "package",
    r"[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?",
    "a Python package name (PEP 508: letters, digits, . _ -)",
    "vllm",
)
GPU = pattern("GPU target", r"sm_[0-9]{2,3}[af]?", "a GPU target sm_NN[a|f]", "sm_121")
DATE = pattern("date", r"20[0-9]{2}(0[1-9]|1[0-2])(0[1-9]|[12][0-9]|3[01])", "a date YYYYMMDD", "20260131")
REVISION = pattern("revision", r"[0-9a-f]{40}", "a hub commit (40 lowercase hex digits)", "0123abcd... (40)")
GLOB = pattern(
    "glob",
    r"[A-Za-z0-9_./*?\[\]-]{1,256}",
    "a library glob (letters, digits, _ . / - * ? [ ])",
    "'vllm/_C*.so'",
)
PORT = whole(1, 65535)
LAYOUT = Kind(
    "layout", "a cabling the cluster knows: pair, mesh3, ring (ring4), switch", _layout, WORDLIKE | {"empty"}
)
GPUS = choice("all", "none", "auto")

# One name, one meaning in every task (as parsing.SHORT_FLAGS): the kind of each option by its name.
OPTION_KINDS: dict[str, Kind] = {
    "json": OUTPUT_FILE,
    "junit": OUTPUT_FILE,
    "html": OUTPUT_FILE,
    "markdown": OUTPUT_FILE,
    "github_output": OUTPUT_FILE,
    "png": OUTPUT_DIR,
    "workdir": OUTPUT_DIR,
    "store": OUTPUT_DIR,
    "recipe": RECIPE,
    "profile": PROFILE,
    "image": IMAGE_REF,
    "baseline": IMAGE_REF,
    "runner_image": IMAGE_REF,
    "check": IMAGE_REF,
    "a": IMAGE_OR_PATH,
    "b": IMAGE_OR_PATH,
    "old": INPUT_FILES,
    "new": INPUT_FILE,
    "results": INPUT_FILES,
    "bench": INPUT_FILE,
    "ca_bundle": INPUT_FILE,
    "golden": OUTPUT_FILE,  # read, or written with --record: a writable place (the reader checks what it reads)
    "corpus": INPUT_FILE,
    "serve_log": INPUT_FILE,
    "verify_report": INPUT_FILE,
    "published": INPUT_FILE,
    "kernels": INPUT_FILE,
    "online_key": INPUT_FILE,
    "root_key": INPUT_FILE,
    "sign_key": INPUT_FILE,
    "model_config": INPUT_FILE,
    "key": KEY_OR_URI,
    "model_dir": HOST_PATH,
    "reference_model_dir": HOST_PATH,
    "cache_dir": HOST_PATH,
    "hf_token_file": HOST_PATH,
    "port": PORT,
    "master_port": PORT,
    "health_timeout": whole(1, 7 * 86400),
    "tail": whole(0, 10**7),
    "top": whole(1, 10**6),
    "tp": whole(0, 1024),
    "pp": whole(0, 1024),
    "dp": whole(0, 1024),
    "spark_memory": whole(0, 4096),
    "repeats": whole(1, 1000),
    "benches": whole(1, 50),
    "budget": whole(1, 7 * 86400),
    "input_len": whole(1, 10**7),
    "output_len": whole(1, 10**7),
    "num_prompts": whole(1, 10**7),
    "gid_index": whole(0, 255),
    "duration": real(0, 86400, low_open=True),
    "target_detect": real(0, 100, low_open=True),
    "threshold": real(0, 1000, low_open=True),
    "min_busbw": real(0, 10**4, low_open=True),
    "mem_available": real(0, 4096),
    "watchdog_floor": real(0, 1024, low_open=True),
    "concurrency": whole_list(1, 10**5),
    "depth": whole_list(0, 10**7),
    "attach": URL,
    "github_base": URL,
    "hf_endpoint": URL,
    "online_identity": URL,
    "catalog": FILE_OR_URL,
    "nodes": NODES,
    "node": NODE,
    "interface": INTERFACE,
    "platform": PLATFORM,
    "tag": TAG,
    "rollback": TAG,
    "promote": DIGEST,
    "digest": DIGEST,
    "date": DATE,
    "gpus": GPUS,
    "nccl": choice("image", "host"),
    "backend": choice("mp", "ray"),
    "weights": choice("each", "shared", "skip"),
    "watchdog": choice("auto", "on", "off"),
    "layout": LAYOUT,
    "network": choice("default", "host", "none"),
    "format": choice("eugr", "sparkarena", "nvidia-v3", "nvidia-v4"),
    # dockerfiles/vllm.Dockerfile.j2's stages, in order (tests/unit/test_option_fuzz.py keeps them in step)
    "target": choice("toolchain", "source", "build-env", "probe", "build", "base", "runtime"),
    "checks": NAME_LIST,
    "suite": NAME,
    "harness": choice("suite", "aiperf"),
    "builder": NAME,
    "gpu": GPU,
    "require": GLOB,
    "package": PACKAGE,
    "model_revision": REVISION,
    "secret": KEY_VALUES,
    "cache_from": KEY_VALUES,
    "cache_to": KEY_VALUES,
    "base_image": BASE_IMAGE,
    "source": SOURCE_URL,
    "ulimit": ULIMIT,
    "set": KEY_VALUE,
    "allow": KEY_VALUE,
    "extra": SHELL_WORDS,
    "crashed": TEXT,
    "k": TEXT,
    "digests": INPUT_DIR,
    "out": OUTPUT_FILE,
    "metadata_file": INPUT_FILE,
    "report": INPUT_FILE,
}

# Where one name means two things: (cli.task_key: the task module's last part and function, the option's name).
TASK_KINDS: dict[tuple[str, str], Kind] = {
    ("cluster.doctor", "gpus"): choice("all", "none"),
    ("cluster.up", "gpus"): choice("all", "none"),
    ("run.serve", "gpus"): choice("all", "none"),
    ("conform.conform", "gpus"): choice("all", "none"),
    ("trust.init", "threshold"): whole(1, 100),
    ("trust.rotate", "threshold"): whole(0, 100),
    ("diff.kernels", "image"): IMAGE_OR_PATH,
    ("build.audit", "target"): IMAGE_OR_PATH,
    ("build.verify", "model_dir"): INPUT_DIR,
    ("memory.memory", "model_dir"): INPUT_DIR,
    ("build.verify", "report"): OUTPUT_FILE,
    ("build.build", "metadata_file"): OUTPUT_FILE,
    ("publish.push", "digests"): OUTPUT_DIR,
    ("tasks.render", "out"): OUTPUT_DIR,
    ("publish.publish", "digest"): PLATFORM_DIGEST,
    ("publish.pull", "tag"): TAG_OR_DIGEST,
    ("community.import_", "source"): FILE_OR_URL,
    ("build.preflight", "source"): SOURCE_CHECKOUT,
    ("overlay.write", "patch"): INPUT_FILE,
    ("overlay.write", "pr"): whole(1, 10_000_000),
    ("overlay.write", "checkout"): INPUT_DIR,
    ("overlay.write", "package"): choice("vllm", "transformers", "flashinfer"),
    ("overlay.write", "name"): NAME,
    ("overlay.preflight", "overlay"): OVERLAY,
    ("overlay.build", "overlay"): OVERLAY,
    ("sbom.sbom", "since"): IMAGE_REF,
    ("sbom.sbom", "notes"): OUTPUT_FILE,
    ("nvperf.baseline", "result"): INPUT_FILE,
    ("nvperf.baseline", "performance"): INPUT_FILE,
    ("bench.bench", "performance"): OUTPUT_FILE,
}


def kind_of(task: str, option: str) -> Kind | None:
    """The kind of `task`'s option `option` (the task function's name, the parameter's name); None: untyped."""
    return TASK_KINDS.get((task, option)) or OPTION_KINDS.get(option)


# Repeatable options where an empty value is a value: `--cache-from ''` says "no cache" (a release tag's build).
EMPTY_IS_A_VALUE = frozenset({"cache_from", "cache_to"})


def type_option(task: str, option: str, value: str, *, empty_ok: bool) -> str:
    """`value` given to `task`'s `--option`, checked by its kind (an untyped option passes the common rule);
    an InputError names the option, the value and the fix. `empty_ok`: '' means "not given" (the option's
    default is ''). The string itself is returned: the task reads it."""
    flag = "-" + option if len(option) == 1 else "--" + option.replace("_", "-")
    check_text(flag, value)
    if not value and not empty_ok and option not in EMPTY_IS_A_VALUE:
        raise InputError(f"{flag} '' is empty; fix: give a value, or leave the option out for its default")
    kind = kind_of(task, option)
    if kind is not None and value:
        try:
            kind.check(flag, value)
        except SparkforgeError as exc:  # the run/ and oci checks' own families too: the same refusal
            message = str(exc)
            raise InputError(message if flag in message else f"{flag} {value[:80]!r}: {message}") from None
    return value


DOCS_MARKERS = (
    "<!-- options:begin (generated: python -m sparkforge.cli.options) -->",
    "<!-- options:end -->",
)


def kinds_table(rows: Sequence[tuple[str, str, Kind | None]]) -> list[str]:
    """docs/inputs.md's table of option kinds from (task, option, kind) rows: each kind, what it takes, what the
    fuzzer feeds it beyond the common rule, and the options of that kind (`task --option`)."""
    by_kind: dict[str, tuple[Kind | None, list[str]]] = {}
    for task, option, kind in rows:
        entry = by_kind.setdefault(kind.name if kind else "UNTYPED", (kind, []))
        entry[1].append(f"{task} --{option.replace('_', '-')}")
    lines = [
        "| kind | takes | hostile classes refused (beyond the common rule) | options |",
        "|---|---|---|---|",
    ]
    for name, (kind, options) in sorted(by_kind.items()):
        refuses = ", ".join(sorted(kind.refuses)) if kind else ""
        takes = kind.doc if kind else "nothing checked: the fuzzer fails"
        cells = [name, takes, refuses, ", ".join(sorted(options))]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def render_docs(text: str, rows: Sequence[tuple[str, str, Kind | None]]) -> str:
    """`text` (docs/inputs.md) with the table between DOCS_MARKERS replaced by `kinds_table(rows)`."""
    begin, end = DOCS_MARKERS
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return "\n".join([head + begin, *kinds_table(rows), end + tail])


def task_key(body: Callable[..., Any]) -> str:
    """A task's name in TASK_KINDS: its module's last part and its function (cluster.up)."""
    return f"{body.__module__.rpartition('.')[2]}.{body.__name__}"


def task_rows(ns: Any) -> list[tuple[str, str, Kind | None]]:
    """(task as typed, option, kind) of every value-taking option of an Invoke collection (read from copies:
    Invoke's get_arguments pops each option's help from its task)."""
    import copy

    rows = []
    for name in sorted(ns.task_names):
        task = ns[name]
        for arg in copy.deepcopy(task).get_arguments():
            if arg.takes_value:
                option = (arg.name or "").replace("-", "_")
                rows.append((name, option, kind_of(task_key(task.body), option)))
    return rows


if __name__ == "__main__":  # rewrite docs/inputs.md's table from tasks.py's collection
    import sys

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    import tasks
    from sparkforge.boundary import read_text, write_output

    page = root / "docs" / "inputs.md"
    write_output(page, render_docs(read_text(page, "docs", 1 << 20), task_rows(tasks.ns)), "docs")

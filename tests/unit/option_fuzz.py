"""The hostile-input fuzzer's parts: the options of every task (read from the task registry, tasks.ns, so an
option is covered the day it is added), the hostile values of each class, and a run of the command line in this
process under real isolation (the engine and proxies at closed sockets, every connect, program start and
write outside the temporary folder recorded by a CPython audit hook, and refused)."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from invoke import Collection, Program

from sparkforge.cli.options import EMPTY_IS_A_VALUE, UNIVERSAL, Kind, kind_of, task_key

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "real" / "bench-cpu-twin-default.json"
CASE_SECONDS = 5.0  # a refusal is a parse-time check (milliseconds); anything slower is a hang or real work
# Real isolation: an engine socket that does not exist and proxies at a port nothing listens on.
ISOLATED_ENV = {
    "DOCKER_HOST": "unix:///nonexistent/sparkforge-fuzz/docker.sock",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "",
    "no_proxy": "",
}


@dataclass(frozen=True)
class Option:
    """One value-taking option of one task, as the registry declares it."""

    task: str  # as typed: cluster.up
    key: str  # cli.task_key: cluster.up's function (sparkforge.cli.options.TASK_KINDS)
    name: str  # the parameter: model_dir
    default: object
    required: bool
    kind: Kind | None

    @property
    def flag(self) -> str:
        """As the user types it and the refusal names it: -a for a one-letter option, else --model-dir."""
        return "-" + self.name if len(self.name) == 1 else "--" + self.name.replace("_", "-")

    def given(self, value: str) -> list[str]:
        """The argv words giving `value` (the '=' form, so a value starting with '-' stays one word)."""
        return [self.flag, value] if len(self.name) == 1 else [f"{self.flag}={value}"]


def options_of(ns: Collection) -> list[Option]:
    """Every option that takes a value, of every task in `ns` (bool flags take none)."""
    found = []
    for name in sorted(ns.task_names):
        task = ns[name]
        for arg in copy.deepcopy(
            task
        ).get_arguments():  # a copy: Invoke pops each option's help as it reads it
            if not arg.takes_value:
                continue
            param = (arg.name or "").replace("-", "_")
            key = task_key(task.body)
            found.append(Option(name, key, param, arg.default, arg.default is None and arg.kind is not list,
                                kind_of(key, param)))  # fmt: skip
    return found


# Values for the required options of a task, so that a hostile value that got past the parse reaches the task
# body (where the isolation catches what it does); by option name, as the kinds are.
# An overlay recipe: the required --overlay's value while the task's other options are fuzzed.
OVERLAY = ROOT / "tests" / "recipes" / "overlays" / "ci-wheels-overlay.yaml"


def baselines(tmp: Path) -> dict[str, str]:
    published = tmp / "published.json"
    published.write_text('{"index": "sha256:' + "a" * 64 + '", "platforms": {}}\n')
    return {
        "recipe": "vllm-qwen35",
        "profile": "qwen35-35b-a3b-fp8",
        "nodes": "local",
        "a": "vllm-qwen35",
        "b": "vllm-qwen35",
        "old": str(RESULT),
        "new": str(RESULT),
        "results": str(RESULT),
        "published": str(published),
        "source": str(RESULT),
        "target": str(tmp),
        "result": str(RESULT),
        "performance": str(RESULT),
        "overlay": str(OVERLAY),
        "image": "sparkforge-fuzz/none:latest",
    }


def hostile_values(tmp: Path) -> dict[str, str]:
    """One value per hostile class (the classes sparkforge.cli.options names), its files made under `tmp`."""
    fifo = tmp / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    folder = tmp / "folder"
    folder.mkdir(exist_ok=True)
    plain = tmp / "plain.txt"
    plain.write_text("plain\n")
    link_out = tmp / "link-out"
    if not link_out.is_symlink():
        link_out.symlink_to("/etc/passwd")
    etc = tmp / "etc-link"
    if not etc.is_symlink():
        etc.symlink_to("/etc")
    dir_link = tmp / "dir-link"
    if not dir_link.is_symlink():
        dir_link.symlink_to(folder)
    return {
        # every option
        "nul": "a\x00b",
        "newline": "first\nsecond",
        "escape": "\x1b[31mred\x1b[0m",
        "blank": "   ",
        "overlong": "a" * 5000,
        "empty": "",
        # numbers
        "unicode-digit": "٣",
        "superscript": "²",
        "underscore": "1_0",
        "nan": "nan",
        "inf": "inf",
        "huge": "1e400",
        "hex": "0x10",
        "word": "ten",
        "fraction": "1.5",
        "negative": "-1",
        "empty-entry": "1,,2",
        # files and folders
        "fifo": str(fifo),
        "fifo-out": str(fifo),
        "device": "/dev/zero",
        "folder": str(folder),
        "file": str(plain),
        "missing": str(tmp / "missing.json"),
        "missing-yaml": str(tmp / "missing.yaml"),
        "link-out": str(link_out),
        "link-out-dir": str(etc / "sparkforge-fuzz.out"),
        "system-out": "/etc/sparkforge-fuzz.out",
        "relative": "models/qwen",
        "mount-spec": "/data:/etc:rw",
        "dotdot": "/data/../etc",
        # words
        "option-like": "-oProxyCommand=x",
        "unicode-word": "\uff52\uff55\uff4e\uff54\uff49\uff4d\uff45",  # fullwidth "runtime"
        "spaces": "two words",
        "no-scheme": "example.com/x",
        "empty-key": "=value",
        "no-equals": "novalue",
        "open-quote": "--flag 'unclosed",
    }


def classes_for(option: Option) -> list[str]:
    """The hostile classes `option` must refuse: the universal ones, its kind's, 'negative' where its least
    value is 0 or more, 'empty' only where '' is not the option's own 'not given'."""
    kind = option.kind
    classes = set(UNIVERSAL) | (set(kind.refuses) if kind else set())
    if kind is not None and kind.low is not None and kind.low >= 0:
        classes.add("negative")
    if option.default == "" or option.name in EMPTY_IS_A_VALUE:
        classes.discard("empty")
    else:
        classes.add("empty")
    return sorted(classes)


@dataclass
class Outcome:
    code: int
    output: str
    seconds: float
    traceback: str = ""
    contacts: list[str] = field(default_factory=list)


class Isolation:
    """A CPython audit hook (installed once per process; it cannot be removed) that, while armed, records and
    refuses every network connect or name lookup, program start, and write outside the allowed folder."""

    _installed = False
    armed: Isolation | None = None

    def __init__(self, allowed: Path) -> None:
        self.allowed = str(allowed.resolve())
        self.contacts: list[str] = []

    @classmethod
    def install(cls) -> None:
        if not cls._installed:
            sys.addaudithook(cls._hook)
            cls._installed = True

    @staticmethod
    def _hook(event: str, args: tuple) -> None:
        self = Isolation.armed
        if self is None:
            return
        what = self._judge(event, args)
        if what:
            self.contacts.append(what)
            raise PermissionError(f"fuzz isolation: {what}")

    def _outside(self, path: object) -> bool:
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return False
        real = os.path.realpath(path)
        return not (real == self.allowed or real.startswith(self.allowed + os.sep))

    def _judge(self, event: str, args: tuple) -> str:
        if event in ("socket.connect", "socket.getaddrinfo", "socket.sendto"):
            return f"{event} {args[1:2]!r}"
        if event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty"):
            return f"{event} {str(args[:2])[:200]}"
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            )
            return f"write {path!r}" if writes and self._outside(path) else ""
        if event in (
            "os.mkdir",
            "os.remove",
            "os.rmdir",
            "os.symlink",
            "os.link",
            "os.truncate",
            "shutil.rmtree",
        ):
            return f"{event} {args[0]!r}" if self._outside(args[0]) else ""
        if event == "os.rename":
            return f"{event} {args[1]!r}" if self._outside(args[1]) else ""
        return ""


@contextlib.contextmanager
def isolated(tmp: Path) -> Iterator[Isolation]:
    """The environment of a fuzz run: the engine and proxies closed, the cache and home under `tmp`, no
    bytecode written, the audit hook armed."""
    Isolation.install()
    saved = {k: os.environ.get(k) for k in (*ISOLATED_ENV, "HOME", "XDG_CACHE_HOME", "SPARKFORGE_CACHE",
                                            "SPARKFORGE_BENCH_STORE")}  # fmt: skip
    os.environ.update(ISOLATED_ENV)
    os.environ.update({"HOME": str(tmp / "home"), "XDG_CACHE_HOME": str(tmp / "cache"),
                       "SPARKFORGE_CACHE": str(tmp / "cache" / "sparkforge"),
                       "SPARKFORGE_BENCH_STORE": str(tmp / "store")})  # fmt: skip
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    guard = Isolation(tmp)
    try:
        yield guard
    finally:
        Isolation.armed = None
        sys.dont_write_bytecode = dont_write
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _alarm(signum: int, frame: object) -> None:
    raise TimeoutError(f"no answer within {CASE_SECONDS} s")


def run_cli(ns: Collection, argv: list[str], guard: Isolation) -> Outcome:
    """`invoke ARGV` in this process, as the command line runs it (Invoke's Program, its parser, the task),
    under `guard`: exit status, stdout+stderr, seconds, an escaped exception's text, what was contacted."""
    program = Program(namespace=ns, name="sparkforge", binary="invoke", version="fuzz")
    out = io.StringIO()
    guard.contacts = []
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    start = time.monotonic()
    code, escaped = 0, ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            Isolation.armed = guard
            try:
                program.run(["invoke", *argv], exit=True)
            finally:
                Isolation.armed = None
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # what a user would see as a traceback
        code, escaped = 1, f"{type(exc).__name__}: {exc}"[:400]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return Outcome(code, out.getvalue(), time.monotonic() - start, escaped, list(guard.contacts))


def argv_for(option: Option, value: str, base: dict[str, str], siblings: list[Option]) -> list[str]:
    """`TASK --required=BASELINE ... --option=VALUE`."""
    argv = [option.task]
    for other in siblings:
        if other.required and other.name != option.name:
            argv += other.given(base[other.name])
    return argv + option.given(value)


def alone(ns: Collection, dotted: str) -> Collection:
    """A namespace holding only `ns`'s task `dotted` under the same name: Invoke's parser deep-copies every
    task's context on each run, so the fuzz parses against one (the task's own options are the same)."""
    top = Collection()
    *path, last = dotted.split(".")
    holder, source = top, ns
    for part in path:
        source = source.collections[part]
        child = Collection(part)
        holder.add_collection(child)
        holder = child
    holder.add_task(copy.deepcopy(source.tasks[last]), last)  # Invoke pops help from the task it parses for
    if source.default == last:
        holder.default = last
    return top


def judge(option: Option, hostile: str, outcome: Outcome) -> str:
    """The project's rule for a hostile value: refused (non-zero) within the limit, the option named with a fix,
    no traceback, nothing contacted or written; '' when it holds, else what broke."""
    broken = []
    if outcome.code == 0:
        broken.append("accepted (exit 0)")
    if outcome.seconds > CASE_SECONDS:
        broken.append(f"took {outcome.seconds:.1f} s")
    if outcome.traceback or "Traceback" in outcome.output:
        broken.append(f"traceback: {outcome.traceback or outcome.output[-300:]}")
    if outcome.contacts:
        broken.append(f"contacted: {outcome.contacts[:3]}")
    if option.flag not in outcome.output or "fix:" not in outcome.output:
        broken.append(f"message does not name {option.flag} with a fix: {outcome.output.strip()[:300]!r}")
    return f"{option.task} {option.flag} <{hostile}>: {'; '.join(broken)}" if broken else ""

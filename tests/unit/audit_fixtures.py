"""Real fatbinaries for the audit tests: compiled by nvcc 13 once, cached by source+flags, plus cuobjdump."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sparkforge.audit.fatbin import Entry
from sparkforge.context import cache_path
from tests.prerequisites import fail_if_required

NVCC = Path(os.environ.get("SPARKFORGE_NVCC", "/usr/local/cuda-13.0/bin/nvcc"))
KERNEL = 'extern "C" __global__ void scale(float *x, float f) { x[threadIdx.x] *= f; }\n'
Output = Literal["o", "so", "fatbin", "embedded"]


@dataclass(frozen=True)
class Fixture:
    """One binary to compile: -gencode pairs `arch:code`, output kind, compression mode, expectations."""

    name: str
    gencode: tuple[str, ...]
    output: Output = "o"
    compress: str | None = None
    rdc: bool = False
    entries: Mapping[str, int] = field(default_factory=dict)  # exact entry counts, when pinned
    verdicts: Mapping[str, str] = field(default_factory=dict)  # target -> library verdict

    def argv(self, source: Path, out: Path) -> list[str]:
        mode = {"o": ["-c"], "so": ["-shared", "-Xcompiler", "-fPIC"], "fatbin": ["-fatbin"]}
        args = [str(NVCC), *mode["fatbin" if self.output == "embedded" else self.output], str(source)]
        args += ["-o", str(out)]
        for pair in self.gencode:
            arch, code = pair.split(":")
            args += ["-gencode", f"arch={arch},code={code}"]
        if self.compress:
            args.append(f"-compress-mode={self.compress}")
        if self.rdc:
            args.append("-rdc=true")
        return args


def _v(sm90: str, sm120: str, sm121: str) -> dict[str, str]:
    return {"sm_90": sm90, "sm_120": sm120, "sm_121": sm121}


# One variant per fixture, then mixtures: expected verdicts per target follow shared/facts/gb10.md.
FIXTURES: tuple[Fixture, ...] = (
    Fixture("sm_90", ("compute_90:sm_90",), entries={"sass_90": 1}, verdicts=_v("native", "none", "none")),
    Fixture(
        "sm_90a", ("compute_90a:sm_90a",), entries={"sass_90a": 1}, verdicts=_v("native", "none", "none")
    ),
    Fixture(
        "sm_100f", ("compute_100f:sm_100f",), entries={"sass_100f": 1}, verdicts=_v("none", "none", "none")
    ),
    Fixture(
        "sm_120", ("compute_120:sm_120",), entries={"sass_120": 1}, verdicts=_v("none", "native", "native")
    ),
    Fixture(
        "sm_120a", ("compute_120a:sm_120a",), entries={"sass_120a": 1}, verdicts=_v("none", "native", "none")
    ),
    Fixture(
        "sm_120f",
        ("compute_120f:sm_120f",),
        entries={"sass_120f": 1},
        verdicts=_v("none", "family", "family"),
    ),
    Fixture(
        "sm_121", ("compute_121:sm_121",), entries={"sass_121": 1}, verdicts=_v("none", "none", "native")
    ),
    Fixture(
        "sm_121a", ("compute_121a:sm_121a",), entries={"sass_121a": 1}, verdicts=_v("none", "none", "native")
    ),
    Fixture(
        "sm_121f", ("compute_121f:sm_121f",), entries={"sass_121f": 1}, verdicts=_v("none", "none", "family")
    ),
    Fixture("ptx_90", ("compute_90:compute_90",), entries={"ptx_90": 1}, verdicts=_v("jit", "jit", "jit")),
    Fixture(
        "ptx_90a", ("compute_90a:compute_90a",), entries={"ptx_90a": 1}, verdicts=_v("jit", "none", "none")
    ),
    Fixture(
        "ptx_120f", ("compute_120f:compute_120f",), entries={"ptx_120f": 1}, verdicts=_v("none", "jit", "jit")
    ),
    Fixture(
        "mix_so",
        ("compute_90:sm_90", "compute_120:sm_120", "compute_121a:sm_121a", "compute_90:compute_90"),
        output="so",
        compress="none",
        verdicts=_v("native", "native", "native"),
    ),
    Fixture(
        "mix_zstd",
        ("compute_90a:sm_90a", "compute_100f:sm_100f", "compute_120f:[sm_120f,compute_120f]"),
        compress="size",
        entries={"sass_90a": 1, "sass_100f": 1, "sass_120f": 1, "ptx_120f": 1},
        verdicts=_v("native", "family", "family"),
    ),
    Fixture(
        "mix_lz4",
        ("compute_80:[sm_80,compute_80]", "compute_121:sm_121"),
        compress="speed",
        entries={"sass_80": 1, "sass_121": 1, "ptx_80": 1},
        verdicts=_v("jit", "jit", "native"),
    ),
    Fixture(
        "rdc_lto",
        ("compute_120:sm_120", "compute_90:lto_90"),
        rdc=True,
        entries={"sass_120": 1, "lto_90": 1},
        verdicts=_v("none", "native", "native"),
    ),
    Fixture(
        "raw_fatbin",
        ("compute_121f:sm_121f", "compute_121:compute_121"),
        output="fatbin",
        entries={"sass_121f": 1, "ptx_121": 1},
        verdicts=_v("none", "none", "family"),
    ),
    Fixture(
        "embedded",
        ("compute_120:sm_120", "compute_90:compute_90"),
        output="embedded",
        compress="none",
        entries={"sass_120": 1, "ptx_90": 1},
        verdicts=_v("jit", "native", "native"),
    ),
)
BY_NAME = {f.name: f for f in FIXTURES}


def nvcc_available() -> bool:
    """nvcc 13 is here; under SPARKFORGE_REQUIRE_ENGINE=1 (CI) its absence fails loudly instead of skipping."""
    found = NVCC.is_file() and os.access(NVCC, os.X_OK)
    if not found:
        fail_if_required(
            f"nvcc 13 is not at {NVCC}: the audit tests would skip; install CUDA 13.0 (or pip's nvidia-cuda-nvcc) "
            "and set SPARKFORGE_NVCC"
        )
    return found


def _digest(fixture: Fixture) -> str:
    text = "\n".join([KERNEL, str(NVCC), *fixture.argv(Path("k.cu"), Path("out")), fixture.output])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _suffix(fixture: Fixture) -> str:
    return {"o": ".o", "so": ".so", "fatbin": ".fatbin", "embedded": ".so"}[fixture.output]


def _embed(fatbin: Path, out: Path) -> None:
    """A host library holding a fatbin as a byte array in .rodata, as code that calls cuModuleLoadData does."""
    data = fatbin.read_bytes()
    body = ",".join(str(b) for b in data)
    source = out.with_suffix(".c")
    source.write_text(
        f"__attribute__((aligned(8))) const unsigned char embedded_fatbin[{len(data)}] = {{{body}}};\n"
        "const unsigned char *fatbin_data(void) { return embedded_fatbin; }\n"
    )
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", str(source), "-o", str(out)], check=True, capture_output=True
    )


def _compile(fixture: Fixture, dest: Path) -> Path:
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".build-") as tmp:
        work = Path(tmp)
        source = work / "kernel.cu"
        source.write_text(KERNEL)
        out = work / ("kernel.fatbin" if fixture.output == "embedded" else f"kernel{_suffix(fixture)}")
        proc = subprocess.run(fixture.argv(source, out), capture_output=True, text=True, cwd=work)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed for fixture {fixture.name}:\n{proc.stdout}{proc.stderr}")
        if fixture.output == "embedded":
            lib = work / "embedded.so"
            _embed(out, lib)
            out = lib
        os.replace(out, dest)  # atomic: parallel test sessions never see a half-written fixture
    return dest


def build_fixtures(fixtures: Iterable[Fixture] = FIXTURES, workers: int = 2) -> dict[str, Path]:
    """Compile (or take from the cache) each fixture; returns name -> path."""
    wanted = {
        f.name: (f, cache_path("audit", "fixtures", f"{f.name}-{_digest(f)}{_suffix(f)}")) for f in fixtures
    }
    missing = [(f, p) for f, p in wanted.values() if not p.is_file()]
    if missing:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda item: _compile(*item), missing))
    return {name: path for name, (_, path) in wanted.items()}


def find_cuobjdump() -> Path | None:
    """NVIDIA's cuobjdump from the nvidia-cuda-cuobjdump wheel, else from PATH."""
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(base).glob("*/bin/cuobjdump")):
            if os.access(candidate, os.X_OK):
                return candidate
    found = shutil.which("cuobjdump")
    return Path(found) if found else None


_LISTED = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.sm_(\d+)([af]?)\.(?:cubin|ptx)$")


def cuobjdump_counts(cuobjdump: Path, binary: Path) -> Counter[str]:
    """Entry counts as cuobjdump --list-elf/--list-ptx print them (`f` cubins appear as plain sm_XX)."""
    counts: Counter[str] = Counter()
    for option in ("--list-elf", "--list-ptx"):
        proc = subprocess.run([str(cuobjdump), option, str(binary)], capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            match = _LISTED.match(line.strip())
            if match:
                kind = "sass" if match.group(1) == "ELF" else "ptx"
                counts[f"{kind}_{match.group(2)}{match.group(3)}"] += 1
    return counts


def as_cuobjdump_sees(entries: Iterable[Entry]) -> Counter[str]:
    """Our entries in cuobjdump's terms: `f` cubins printed plain, LTO IR not listed."""
    counts: Counter[str] = Counter()
    for entry in entries:
        if entry.kind == "sass":
            counts[f"sass_{entry.arch}{'a' if entry.variant == 'a' else ''}"] += 1
        elif entry.kind == "ptx":
            counts[entry.key] += 1
    return counts

#!/usr/bin/env python3
"""The compile probe's units compiled twice cold, with the probe's own compile commands; objects and libraries compared.

    python3 benchmarks/probe_repro.py --tarball SRC.tar.xz --tools SRC.tools.txt --out DIR [--threads 2] [--deadline 540]

SRC.tar.xz comes from benchmarks/probe_repro_pack.sh (a built probe image's sources, headers and Ninja files, at
their image paths). Run as root on a machine with CUDA 13.0's nvcc, g++ and binutils (the GPU machine): the tarball
is unpacked at /, the image's CUDA layout (/opt/cuda -> the wheel's nvidia/cu13) is rebuilt from this machine's
toolkit binaries (their sha256 compared with the image's), and each unit's command is read from the probe's
build.ninja exactly as Ninja runs it: `ccache nvcc ...` in /workspace/vllm/build/probe, Release (-O3 -DNDEBUG),
`-gencode arch=compute_121a,code=sm_121a`, with the recipe's --threads (vllm-qwen35: 2; the CI probe: 1).
Each run gets an empty CCACHE_DIR (cold) and the same paths: runs go side by side, each in its own mount namespace
where its own folder is bind-mounted on the build folder. Each run's objects are then linked as vLLM's CMake links
_C_stable_libtorch (its link rule and flags, plus the build stage's -Wl,--discard-all; against this machine's
torch libraries) and stripped as slim-venv --strip does. Writes DIR/repro_probe_units.json. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import time
from pathlib import Path

BUILD = Path("/workspace/vllm/build/probe")
SITE = Path("/opt/venv/lib/python3.11/site-packages")
CU13 = SITE / "nvidia" / "cu13"
# The vllm-qwen35 recipe's probe sources, plus the SM120 scaled_mm dispatcher the CI probe also compiles.
UNITS = (
    "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_sm120_fp8.cu",
    "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_blockwise_sm120_fp8.cu",
    "csrc/libtorch_stable/quantization/fp4/nvfp4_quant_kernels.cu",
    "csrc/libtorch_stable/quantization/fp4/nvfp4_scaled_mm_sm120_kernels.cu",
    "csrc/libtorch_stable/quantization/fp4/nvfp4_blockwise_moe_kernel.cu",
    "csrc/libtorch_stable/activation_kernels.cu",
    "csrc/libtorch_stable/quantization/w8a8/cutlass/scaled_mm_c3x_sm120.cu",
)
LINK_TARGET = "_C_stable_libtorch.abi3.so"
TOOLS = (
    "bin/nvcc",
    "bin/cudafe++",
    "bin/ptxas",
    "bin/fatbinary",
    "nvvm/bin/cicc",
    "nvvm/libdevice/libdevice.10.bc",
)
CARRIED = Path("/opt/probe-repro")  # ccache and libhiredis from the image (probe_repro_pack.sh)


def sh(cmd: str) -> str:
    done = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return (done.stdout + done.stderr).strip()


def ninja_builds(text: str) -> dict[str, dict[str, str]]:
    """build statements of a CMake-generated build.ninja: output -> {rule, inputs, VAR: value}."""
    builds: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if line.startswith("build "):
            head, _, rest = line[6:].partition(": ")
            rule, _, inputs = rest.partition(" ")
            current = {"rule": rule, "inputs": inputs.split(" || ")[0].split(" | ")[0]}
            builds[head] = current
        elif line.startswith("  ") and current is not None and " = " in line:
            key, _, value = line[2:].partition(
                " = "
            )  # a value keeps its trailing space (LAUNCHER = "ccache ")
            current[key] = value
        elif not line.strip():
            current = None
    return builds


def rule_commands(text: str) -> dict[str, str]:
    rules, name = {}, None
    for line in text.splitlines():
        if line.startswith("rule "):
            name = line[5:].strip()
        elif name and line.strip().startswith("command = "):
            rules[name] = line.strip()[len("command = ") :]
            name = None
    return rules


def expand(template: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_]+)\}?", lambda m: variables.get(m.group(1), ""), template)


def unpack(tarball: Path) -> None:
    """Files and links at their image paths under /; a folder already there (or a link to one) is left as it is."""
    with tarfile.open(tarball, "r:xz") as tf:
        for member in tf:
            path = Path("/") / member.name
            if ".." in Path(member.name).parts:
                raise SystemExit(f"{member.name}: refusing a path with '..'")
            if member.isdir():
                path.mkdir(parents=True, exist_ok=True)
            elif member.issym():
                if not path.exists() and not path.is_symlink():
                    path.symlink_to(member.linkname)
            elif member.isfile():
                path.parent.mkdir(parents=True, exist_ok=True)
                source = tf.extractfile(member)
                assert source is not None
                path.write_bytes(source.read())
                path.chmod(member.mode & 0o755)


def setup_toolkit(tools_txt: str) -> dict[str, object]:
    """The image's /opt/cuda layout from this machine's toolkit: binaries copied (nvcc finds nvvm and the headers
    from its own folder), nvvm and lib linked, the wheel's headers and nvcc.profile as carried."""
    nvcc = Path(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc").resolve()
    top = nvcc.parent.parent
    if top == CU13.resolve():  # inside the probe image itself: nothing to set up
        return {
            "toolkit": str(top),
            "nvcc_version": sh(f"{nvcc} --version | tail -n 2"),
            "gxx": sh("g++ --version | head -n 1"),
        }
    (CU13 / "bin").mkdir(parents=True, exist_ok=True)
    for tool in ("nvcc", "cudafe++", "ptxas", "fatbinary", "nvlink", "bin2c"):
        if (top / "bin" / tool).exists():
            shutil.copy2(top / "bin" / tool, CU13 / "bin" / tool)
    if (top / "bin" / "crt").is_dir() and not (CU13 / "bin" / "crt").exists():
        shutil.copytree(top / "bin" / "crt", CU13 / "bin" / "crt")
    for name, target in (("nvvm", top / "nvvm"), ("lib", (top / "lib64").resolve()), ("lib64", Path("lib"))):
        if not (CU13 / name).exists():
            (CU13 / name).symlink_to(target)
    if not Path("/opt/cuda").exists():
        Path("/opt/cuda").symlink_to(CU13)
    ours = {}
    for rel in TOOLS:
        path = top / rel
        ours[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
    theirs = dict(reversed(ln.split()) for ln in tools_txt.splitlines() if re.match(r"^[0-9a-f]{64}  ", ln))
    # Torch's libraries for the link: this machine's (the image's torch is not carried; sonames are the same).
    spec = importlib.util.find_spec("torch")
    torch_lib = Path(next(iter(spec.submodule_search_locations))) / "lib" if spec else None
    if torch_lib and not (SITE / "torch" / "lib").exists():
        (SITE / "torch" / "lib").symlink_to(torch_lib)
    return {
        "toolkit": str(top),
        "nvcc_version": sh(f"{nvcc} --version | tail -n 2"),
        "image_nvcc": [ln for ln in tools_txt.splitlines() if "V13" in ln or "release" in ln],
        "toolchain_sha256_equal_to_image": {k: ours[k] == theirs.get(k) for k in ours},
        "gxx": sh("g++ --version | head -n 1"),
        "image_gxx": [ln for ln in tools_txt.splitlines() if ln.startswith("g++")],
        "torch_lib_for_link": str(torch_lib),
        "binutils": sh("ld --version | head -n 1"),
    }


def namespaces_work() -> bool:
    probe = Path("/tmp/ns-probe")
    probe.mkdir(exist_ok=True)
    script = f"mount --bind {probe} {BUILD} && test ! -e {BUILD}/build.ninja"
    try:
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
        return subprocess.run(argv, capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


def compile_argv(cmd: str, rundir: Path, isolated: bool) -> tuple[list[str], Path]:
    if isolated:
        script = f'mount --bind "$0" {BUILD} && cd {BUILD} && exec "$@"'
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            str(rundir),
            "sh",
            "-c",
            cmd,
        ], BUILD
    return ["sh", "-c", cmd], rundir


def elf_sections(path: Path) -> dict[str, bytes]:
    """Section name -> bytes of a 64-bit little-endian ELF file (objects and shared libraries)."""
    data = path.read_bytes()
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx]
    out = {}
    for h in headers:
        raw = data[names[4] + h[0] :]
        name = raw[: raw.index(b"\0")].decode()
        out[name if name not in out else f"{name}#{len(out)}"] = (
            b"" if h[1] == 8 else data[h[4] : h[4] + h[5]]
        )
    return out


def compare(a: Path, b: Path) -> dict[str, object]:
    if not a.is_file() or not b.is_file():
        return {"compared": False, "missing": [str(p) for p in (a, b) if not p.is_file()]}
    x, y = a.read_bytes(), b.read_bytes()
    result: dict[str, object] = {
        "bytes": [len(x), len(y)],
        "sha256": [hashlib.sha256(x).hexdigest(), hashlib.sha256(y).hexdigest()],
        "identical": x == y,
        "differing_bytes": sum(p != q for p, q in zip(x, y, strict=False)) + abs(len(x) - len(y)),
    }
    try:
        sx, sy = elf_sections(a), elf_sections(b)
        differing = sorted(n for n in set(sx) | set(sy) if sx.get(n) != sy.get(n))
        result["differing_sections"] = differing[:12] + (
            [f"... {len(differing) - 12} more"] if len(differing) > 12 else []
        )
        result["sections"] = len(sx)
        result["nv_fatbin_identical"] = (
            sx.get(".nv_fatbin") == sy.get(".nv_fatbin") if ".nv_fatbin" in sx else None
        )
        note = sx.get(".note.gnu.build-id")
        result["build_id"] = [s.get(".note.gnu.build-id", b"")[16:].hex() for s in (sx, sy)] if note else None
    except (struct.error, ValueError, IndexError) as err:
        result["elf_error"] = str(err)
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tarball", type=Path, required=True)
    ap.add_argument("--tools", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--threads", type=int, default=2, help="nvcc --threads of the twice-compiled runs (recipe's)"
    )
    ap.add_argument("--work", type=Path, default=Path("/tmp/probe-repro-runs"), help="one folder per run")
    ap.add_argument(
        "--deadline", type=float, default=500, help="seconds for unpack and all compiles together"
    )
    ap.add_argument("--unit", action="append", help="only these of UNITS (default: all)")
    ap.add_argument(
        "--before",
        action="store_true",
        help="the build before the fix: vLLM's default RelWithDebInfo (CMake's -O2 -g -DNDEBUG in place of the "
        "probe's Release -O3 -DNDEBUG) and no -Wl,--discard-all",
    )
    ap.add_argument(
        "--no-probe-run", action="store_true", help="skip the third run with the CI probe's --threads"
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.work, ignore_errors=True)  # cold: no object, no ccache entry of an earlier run
    report: dict[str, object] = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count()}
    report["build_type"] = (
        "RelWithDebInfo, no --discard-all (before)" if args.before else "Release + --discard-all"
    )
    start = time.monotonic()
    unpack(args.tarball)
    report["unpack_s"] = round(time.monotonic() - start, 1)
    report["toolchain"] = setup_toolkit(args.tools.read_text())
    report["source"] = json.loads(Path("/opt/sparkforge/source.json").read_text())
    ninja = (BUILD / "build.ninja").read_text()
    builds, rules = ninja_builds(ninja), rule_commands((BUILD / "CMakeFiles" / "rules.ninja").read_text())
    probe = json.loads(Path("/opt/sparkforge/probe/probe.json").read_text())
    probe_cmds = {u["source"]: u["command"] for u in probe.get("units", [])}
    isolated = namespaces_work()
    report["same_paths_by_mount_namespace"] = isolated
    env = {**os.environ, "CCACHE_BASEDIR": "/workspace/vllm", "CCACHE_NOHASHDIR": "1"}
    # The image's ccache (4.7.5) and its libhiredis, carried: `ccache nvcc ...` as the build runs it.
    env["PATH"] = f"{CARRIED}/bin:{env['PATH']}"
    env["LD_LIBRARY_PATH"] = f"{CARRIED}/lib"
    runs = {"run1": args.threads, "run2": args.threads} | ({} if args.no_probe_run else {"probe-threads1": 1})
    jobs, units = [], []
    chosen = tuple(args.unit or UNITS)
    for unit in chosen:
        target = f"CMakeFiles/_C_stable_libtorch.dir/{unit}.o"
        stmt = builds[target]
        cmd = expand(rules[stmt["rule"]], {**stmt, "in": stmt["inputs"], "out": target})
        if unit in probe_cmds:
            units.append({"unit": unit, "command_equals_probe_json": cmd == probe_cmds[unit]})
        else:
            units.append({"unit": unit, "command_equals_probe_json": None})
        units[-1]["gencode"] = re.findall(r"-gencode (\S+)", cmd)
        for run, threads in runs.items():
            if run.startswith("probe") and unit not in probe_cmds:
                continue
            rundir = args.work / run
            (rundir / target).parent.mkdir(parents=True, exist_ok=True)
            ccache_dir = rundir / ".ccache"
            ccache_dir.mkdir(exist_ok=True)
            run_cmd = re.sub(r"--threads=\d+", f"--threads={threads}", cmd)
            if args.before:
                run_cmd = run_cmd.replace(" -O3 -DNDEBUG ", " -O2 -g -DNDEBUG ")
            argv, cwd = compile_argv(run_cmd, rundir, isolated)
            log = (rundir / f"{Path(unit).name}.log").open("wb")
            proc = subprocess.Popen(
                argv, cwd=cwd, env={**env, "CCACHE_DIR": str(ccache_dir)}, stdout=log, stderr=log
            )
            jobs.append({"run": run, "unit": unit, "proc": proc, "start": time.monotonic(), "log": log})
            if unit == chosen[0] and run == "run1":
                report["example_command"] = run_cmd
    results: dict[tuple[str, str], dict[str, object]] = {}
    while any(j["proc"].returncode is None for j in jobs):
        for job in jobs:
            if job["proc"].returncode is None:
                pid, status, usage = os.wait4(job["proc"].pid, os.WNOHANG)
                if pid:
                    job["proc"].returncode = os.waitstatus_to_exitcode(status)
                    results[(job["run"], job["unit"])] = {
                        "returncode": job["proc"].returncode,
                        "seconds": round(time.monotonic() - job["start"], 1),
                        "peak_mb": round(usage.ru_maxrss / 1024),
                    }
        if time.monotonic() - start > args.deadline:
            for job in jobs:
                if job["proc"].returncode is None:
                    job["proc"].kill()
            report["deadline_hit"] = True
            break
        time.sleep(0.5)
    report["compile_wall_s"] = round(time.monotonic() - start, 1)
    report["ccache"] = sh(f"LD_LIBRARY_PATH={CARRIED}/lib {CARRIED}/bin/ccache --version | head -n 1")
    root = args.work
    for u in units:
        obj = f"CMakeFiles/_C_stable_libtorch.dir/{u['unit']}.o"
        u["compiles"] = {run: results.get((run, u["unit"])) for run in runs}
        for run, result in u["compiles"].items():
            if result and result["returncode"] != 0:
                result["log_tail"] = (root / run / f"{Path(u['unit']).name}.log").read_text(errors="replace")[
                    -1500:
                ]
        u["object"] = compare(root / "run1" / obj, root / "run2" / obj)
        image_obj = Path("/opt/sparkforge/probe/objects") / (u["unit"].replace("/", "__") + ".o")
        if image_obj.is_file():
            u["probe_threads1_vs_image"] = compare(root / "probe-threads1" / obj, image_obj)
            u["run1_vs_probe_threads1"] = compare(root / "run1" / obj, root / "probe-threads1" / obj)
    report["units"] = units
    report["ccache_files_run1"] = sum(1 for p in (root / "run1" / ".ccache").rglob("*") if p.is_file())
    link = builds[LINK_TARGET]
    ours = [f"CMakeFiles/_C_stable_libtorch.dir/{u}.o" for u in chosen]
    variables = {
        **link,
        "in": " ".join(ours),
        "TARGET_FILE": "probe_units.abi3.so",
        "SONAME_FLAG": "",
        "SONAME": "",
    }
    if args.before:
        variables["LANGUAGE_COMPILE_FLAGS"] = variables["LANGUAGE_COMPILE_FLAGS"].replace(
            "-O3 -DNDEBUG", "-O2 -g -DNDEBUG"
        )
    else:
        variables["LINK_FLAGS"] += " -Wl,--discard-all"  # the build stage's CMAKE_MODULE_LINKER_FLAGS
    link_cmd = expand(rules[link["rule"]], variables)
    report["link_command"] = link_cmd
    for run in ("run1", "run2"):
        argv, cwd = compile_argv(link_cmd, root / run, isolated)
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
        report[f"link_{run}"] = {"returncode": done.returncode, "tail": (done.stdout + done.stderr)[-1500:]}
        if done.returncode != 0:  # CMake's link line needs libraries this machine lacks: the objects alone
            plain = f"/usr/bin/c++ -fPIC -O3 -DNDEBUG -shared -Wl,--discard-all -o probe_units.abi3.so {' '.join(ours)}"
            argv, cwd = compile_argv(plain, root / run, isolated)
            done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
            report[f"link_{run}"]["fallback"] = {"command": plain, "returncode": done.returncode}
        lib = root / run / "probe_units.abi3.so"
        if lib.is_file():
            shutil.copy2(lib, root / run / "probe_units.stripped.so")
            subprocess.run(["strip", "--strip-unneeded", str(root / run / "probe_units.stripped.so")])
    report["library"] = compare(root / "run1" / "probe_units.abi3.so", root / "run2" / "probe_units.abi3.so")
    report["stripped_library"] = compare(
        root / "run1" / "probe_units.stripped.so", root / "run2" / "probe_units.stripped.so"
    )
    report["needed"] = sh(f"readelf -d {root / 'run1' / 'probe_units.abi3.so'} | grep NEEDED | head -n 12")
    report["total_s"] = round(time.monotonic() - start, 1)
    (args.out / "repro_probe_units.json").write_text(json.dumps(report, indent=2) + "\n")
    for u in units:
        print(u["unit"], u["compiles"], "objects differ in:", u["object"].get("differing_sections"))
    print(
        f"libraries identical: {report['library'].get('identical')}, stripped: {report['stripped_library'].get('identical')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

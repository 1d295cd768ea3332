"""Load each fixture fatbin (and each of its uncompressed cubins/PTX) on the real GPU; compare with the audit.

The audit predicts from headers alone whether anything in a fatbin can run on the GPU's capability;
this script asks the driver (cuModuleLoadData through ctypes, no Python CUDA package needed), launches
the kernel when a whole fatbin loads, checks its result, and writes one JSON with every prediction and
outcome. Exit status 1 when any prediction disagrees with the driver.

    PYTHONPATH=. python tests/gpu/cubin_load.py --out results.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import struct
import sys
import time
from pathlib import Path
from typing import Any

from sparkforge.audit.compat import GpuTarget, best_verdict, entry_verdict, verdict_of
from sparkforge.audit.fatbin import read_fatbin_file

HERE = Path(__file__).resolve().parent
ATTR_CC_MAJOR, ATTR_CC_MINOR = 75, 76
THREADS = 32


def declare(lib: ctypes.CDLL) -> None:
    """Argument types for the calls that take pointers or size_t: ctypes would pass 32-bit ints otherwise."""
    p, u64, size, uint = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint
    lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(p), ctypes.c_int]
    lib.cuCtxSetCurrent.argtypes = [p]
    lib.cuModuleLoadData.argtypes = [ctypes.POINTER(p), p]
    lib.cuModuleUnload.argtypes = [p]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(p), p, ctypes.c_char_p]
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), size]
    lib.cuMemFree_v2.argtypes = [u64]
    lib.cuMemcpyHtoD_v2.argtypes = [u64, p, size]
    lib.cuMemcpyDtoH_v2.argtypes = [p, u64, size]
    lib.cuLaunchKernel.argtypes = [p, uint, uint, uint, uint, uint, uint, uint, p, ctypes.POINTER(p), p]


class Driver:
    """The few CUDA driver calls needed, through ctypes on libcuda.so.1."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        declare(self.lib)
        self.check(self.lib.cuInit(0), "cuInit")
        self.device = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(self.device), 0), "cuDeviceGet")
        self.context = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), self.device), "ctx")
        self.check(self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def error_name(self, code: int) -> str:
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        return (name.value or b"?").decode()

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what}: {self.error_name(code)}")

    def attribute(self, attr: int) -> int:
        value = ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(value), attr, self.device), "attribute")
        return value.value

    def describe(self) -> dict[str, Any]:
        name = ctypes.create_string_buffer(256)
        self.lib.cuDeviceGetName(name, 256, self.device)
        version = ctypes.c_int()
        self.lib.cuDriverGetVersion(ctypes.byref(version))
        return {
            "name": name.value.decode(),
            "capability": f"{self.attribute(ATTR_CC_MAJOR)}.{self.attribute(ATTR_CC_MINOR)}",
            "driver_cuda_version": f"{version.value // 1000}.{version.value % 1000 // 10}",
        }

    def load(self, image: bytes) -> tuple[ctypes.c_void_p | None, str]:
        module = ctypes.c_void_p()
        buffer = ctypes.create_string_buffer(image, len(image))
        code = self.lib.cuModuleLoadData(ctypes.byref(module), buffer)
        return (module, "") if code == 0 else (None, self.error_name(code))

    def unload(self, module: ctypes.c_void_p) -> None:
        self.lib.cuModuleUnload(module)

    def run_scale(self, module: ctypes.c_void_p) -> bool:
        """Launch scale(x, 2) on 32 floats and check the result: a loaded kernel that also runs."""
        function = ctypes.c_void_p()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(function), module, b"scale"), "getFunction")
        host = struct.pack(f"<{THREADS}f", *range(THREADS))
        pointer = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(pointer), len(host)), "cuMemAlloc")
        try:
            self.check(self.lib.cuMemcpyHtoD_v2(pointer, host, len(host)), "HtoD")
            factor = ctypes.c_float(2.0)
            params = (ctypes.c_void_p * 2)(ctypes.addressof(pointer), ctypes.addressof(factor))
            self.check(
                self.lib.cuLaunchKernel(function, 1, 1, 1, THREADS, 1, 1, 0, None, params, None), "launch"
            )
            self.check(self.lib.cuCtxSynchronize(), "synchronize")
            out = ctypes.create_string_buffer(len(host))
            self.check(self.lib.cuMemcpyDtoH_v2(out, pointer, len(host)), "DtoH")
        finally:
            self.lib.cuMemFree_v2(pointer)
        return list(struct.unpack(f"<{THREADS}f", out.raw)) == [2.0 * i for i in range(THREADS)]


def check_fixture(driver: Driver, path: Path, target: GpuTarget) -> dict[str, Any]:
    data = path.read_bytes()
    fatbin = read_fatbin_file(path)
    assert fatbin is not None, f"{path} holds no fatbin"
    entries = list(fatbin.entries)
    predicted = best_verdict(verdict_of(e, target) for e in entries)
    start = time.monotonic()
    module, error = driver.load(data)
    result: dict[str, Any] = {
        "fixture": path.name,
        "entries": [e.key for e in entries],
        "predicted": predicted,
        "loaded": module is not None,
        "error": error,
        "ran": False,
        "load_s": round(time.monotonic() - start, 4),
    }
    if module is not None:
        result["ran"] = driver.run_scale(module)
        driver.unload(module)
    result["agrees"] = (predicted != "none") == result["loaded"] and result["ran"] == result["loaded"]
    result["per_entry"] = []
    for entry in entries:
        if entry.compression != "none":
            continue  # the driver takes compressed entries only inside their container
        payload = data[entry.payload_offset : entry.payload_offset + entry.payload_size]
        if entry.kind in ("ptx", "lto"):
            payload = payload.rstrip(b"\0") + b"\0"  # the driver reads PTX as a C string
        verdict = entry_verdict(entry.kind, entry.arch, entry.variant, target)
        module, error = driver.load(payload)
        if module is not None:
            driver.unload(module)
        loaded = module is not None
        result["per_entry"].append(
            {
                "entry": entry.key,
                "predicted": verdict,
                "loaded": loaded,
                "error": error,
                "agrees": (verdict != "none") == loaded,
            }
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=HERE / "fixtures")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    driver = Driver()
    device = driver.describe()
    major, minor = (int(x) for x in device["capability"].split("."))
    target = GpuTarget(major, minor)
    results = [check_fixture(driver, p, target) for p in sorted(args.fixtures.glob("*.fatbin"))]
    checks = [r["agrees"] for r in results] + [e["agrees"] for r in results for e in r["per_entry"]]
    summary = {"fixtures": len(results), "checks": len(checks), "disagreements": checks.count(False)}
    report = {"device": device, "target": target.name, "summary": summary, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for r in results:
        entries = " ".join(f"{e['entry']}:{'ok' if e['loaded'] else e['error']}" for e in r["per_entry"])
        print(f"{r['fixture']:<26} predicted {r['predicted']:<7} loaded {r['loaded']!s:<5} ran {r['ran']!s:<5} "
              f"{'AGREES' if r['agrees'] else 'DISAGREES'} {r['error']} | {entries}")  # fmt: skip
    print(json.dumps({"device": device, **summary}))
    return 0 if summary["disagreements"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

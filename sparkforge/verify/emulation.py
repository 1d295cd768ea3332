"""Running an image's suite under user-mode emulation: an arm64 image on an x86 host through qemu-user.

Measured (benchmarks/build.md): under Debian bookworm's qemu-user-static 7.2, `import torch` of the official
aarch64 wheel starts OpenMP's worker threads (libgomp, one per host core) and then crashes (SIGSEGV, outside a
container) or never returns (inside one: main thread in sigsuspend); with one OpenMP thread it imports, and so
does everything the suite checks. qemu 10.0 (Debian trixie) imports it with the default threads as well. The
settings here apply only when the image's architecture is not the host's, so a native run (on a Spark) is left
exactly as the image is; the suite's checks are the same either way.
"""

from __future__ import annotations

import platform as host

MACHINES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
# Emulated Python ran ~11x slower than native here; the suite's imports and JIT compiles scale with it.
TIMEOUT_FACTOR = 4
# One OpenMP (and MKL/OpenBLAS) thread: what vLLM's own workers set too, and what qemu-user 7.2 survives.
EMULATED_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    # Each JIT compile's limit in the suite (sparkforge/verify/inimage/checks_jit.py: 900 s natively).
    "SPARKFORGE_JIT_TIMEOUT_S": str(900 * TIMEOUT_FACTOR),
}


def host_arch(machine: str | None = None) -> str:
    """This host's architecture as an OCI platform names it (amd64, arm64)."""
    found = machine or host.machine()
    return MACHINES.get(found.lower(), found.lower())


def is_emulated(image_platform: str | None, machine: str | None = None) -> bool:
    """Whether a container of `image_platform` (e.g. linux/arm64) runs under emulation on this host."""
    if not image_platform:
        return False
    arch = image_platform.split("/")[1] if "/" in image_platform else image_platform
    return arch != host_arch(machine)


def suite_environment(image_platform: str | None, machine: str | None = None) -> dict[str, str]:
    """Extra environment for the suite's container: the thread settings under emulation, nothing natively."""
    return dict(EMULATED_ENV) if is_emulated(image_platform, machine) else {}


def suite_timeout(image_platform: str | None, timeout_s: int, machine: str | None = None) -> int:
    """The suite's time limit: `timeout_s` natively, TIMEOUT_FACTOR times it under emulation."""
    return timeout_s * TIMEOUT_FACTOR if is_emulated(image_platform, machine) else timeout_s

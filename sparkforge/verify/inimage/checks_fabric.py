#!/usr/bin/env python3
"""In-image check of the RDMA userspace NCCL needs to run over RoCE instead of TCP sockets; no RDMA device needed.

- fabric.verbs: the recipe's pinned packages (runtime.rdma in the lock) are installed at their versions;
  libibverbs loads and lists devices (none in a container without /dev/infiniband: the list is then empty);
  the mlx5 provider (the CX-7's) is registered and loads; and the libnccl that the image's torch loads can open
  the verbs library by the names it dlopens itself (read from the library: "libibverbs.so", then
  "libibverbs.so.1") and find its versioned entry point (dlvsym ..., "IBVERBS_1.1"), as NCCL does at init.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
from pathlib import Path
from typing import Any

import checklist

Result = tuple[str, str, dict[str, Any]]
DPKG_STATUS = "/var/lib/dpkg/status"
_NAMES = re.compile(rb"(libibverbs\.so(?:\.[0-9]+)?|libmlx5\.so(?:\.[0-9]+)?)\x00")
_SYMBOL_VERSION = re.compile(rb"(IBVERBS_1\.[0-9]+)\x00")


def installed(status: str = DPKG_STATUS) -> dict[str, str]:
    """Package -> version of every package dpkg records as installed."""
    found: dict[str, str] = {}
    try:
        text = Path(status).read_text(errors="replace")
    except OSError:
        return found
    for stanza in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" ")
        )
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            found[fields["Package"]] = fields.get("Version", "")
    return found


def _mapped(fragment: str) -> list[str]:
    """Paths of the shared objects this process has mapped whose name holds `fragment`."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in lines if fragment in line.rsplit("/", 1)[-1]})


def nccl_names(path: str) -> tuple[list[str], list[str]]:
    """The verbs/mlx5 library names a libnccl dlopens and the IBVERBS symbol versions it asks for, in its order."""
    data = Path(path).read_bytes()
    names = list(dict.fromkeys(m.group(1).decode() for m in _NAMES.finditer(data)))
    versions = list(dict.fromkeys(m.group(1).decode() for m in _SYMBOL_VERSION.finditer(data)))
    return names, versions


def _torch_nccl() -> str | None:
    """The libnccl the image's torch loads (mapped once torch is imported), else the wheel's copy."""
    try:
        import torch  # loads libtorch_cuda and its libnccl where torch has CUDA
    except ImportError:
        return None
    found = _mapped("libnccl")
    if found:
        return found[0]
    wheel = glob.glob(
        os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "nccl", "lib", "libnccl.so*")
    )
    return os.path.realpath(wheel[0]) if wheel else None


def _dlvsym(handle: int, symbol: str, version: str) -> bool:
    libc = ctypes.CDLL(None)
    dlvsym = libc.dlvsym
    dlvsym.restype = ctypes.c_void_p
    dlvsym.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
    return bool(dlvsym(handle, symbol.encode(), version.encode()))


def _devices(verbs: ctypes.CDLL) -> list[str]:
    verbs.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
    verbs.ibv_get_device_list.argtypes = (ctypes.POINTER(ctypes.c_int),)
    verbs.ibv_get_device_name.restype = ctypes.c_char_p
    verbs.ibv_get_device_name.argtypes = (ctypes.c_void_p,)
    count = ctypes.c_int(0)
    listing = verbs.ibv_get_device_list(ctypes.byref(count))
    if not listing:
        return []
    names = [verbs.ibv_get_device_name(listing[i]).decode() for i in range(count.value)]
    verbs.ibv_free_device_list.argtypes = (ctypes.POINTER(ctypes.c_void_p),)
    verbs.ibv_free_device_list(listing)
    return names


def check_verbs(lock: dict[str, Any]) -> Result:
    rdma = (lock.get("runtime") or {}).get("rdma")
    if not rdma:
        return (
            "skipped",
            "the recipe declares no RDMA userspace (runtime.rdma): NCCL would use TCP sockets",
            {},
        )
    pins = dict(p.partition("=")[::2] for p in [*rdma.get("packages", []), *rdma.get("link_test", [])])
    have = installed()
    details: dict[str, Any] = {"packages": {name: have.get(name) for name in pins}}
    problems = [
        f"{name} {have.get(name) or 'not installed'} != pinned {version}"
        for name, version in pins.items()
        if have.get(name) != version
    ]
    try:
        verbs = ctypes.CDLL("libibverbs.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        problems.append(f"libibverbs.so.1 does not load ({exc})")
        return "failed", "; ".join(problems) + "; fix: pin libibverbs1 in runtime.rdma.packages", details
    details["libibverbs"] = _mapped("libibverbs.so")
    details["devices"] = _devices(verbs)
    libdir = os.path.dirname(details["libibverbs"][0]) if details["libibverbs"] else "/usr/lib"
    drivers = sorted(glob.glob("/etc/libibverbs.d/*.driver"))
    details["providers_registered"] = [os.path.basename(d).removesuffix(".driver") for d in drivers]
    provider = sorted(glob.glob(os.path.join(libdir, "libibverbs", "libmlx5-rdmav*.so")))
    details["mlx5_provider"] = provider[0] if provider else None
    if "mlx5" not in details["providers_registered"] or not provider:
        problems.append(
            f"the mlx5 provider is missing (registered: {details['providers_registered'] or 'none'}; "
            f"{libdir}/libibverbs/libmlx5-rdmav*.so: {'found' if provider else 'none'}); the CX-7 needs it"
        )
    else:
        try:
            ctypes.CDLL(provider[0])
        except OSError as exc:
            problems.append(f"the mlx5 provider {provider[0]} does not load ({exc})")
    nccl = _torch_nccl()
    details["nccl"] = nccl
    if nccl:
        names, versions = nccl_names(nccl)
        details["nccl_dlopens"], details["nccl_symbol_versions"] = names, versions
        opened: dict[str, bool] = {}
        for name in names:
            try:
                handle = ctypes.CDLL(name)._handle
                # NCCL resolves ibv_get_device_list (and the core verbs) at IBVERBS_1.1; the newer versions it
                # names (1.8, 1.10, 1.12) are optional verbs, recorded in the details
                opened[name] = (
                    _dlvsym(handle, "ibv_get_device_list", "IBVERBS_1.1") if "ibverbs" in name else True
                )
            except OSError:
                opened[name] = False
        details["nccl_opens"] = opened
        verbs_names = [n for n in names if "ibverbs" in n]
        if not verbs_names:
            problems.append(f"{nccl} names no libibverbs to dlopen (an NCCL built without IB support?)")
        elif not any(opened[n] for n in verbs_names):
            problems.append(
                f"{nccl} cannot open {' or '.join(verbs_names)} with ibv_get_device_list@IBVERBS_1.1"
            )
    if problems:
        return (
            "failed",
            "; ".join(problems) + "; fix: pin the RDMA userspace in runtime.rdma and rebuild",
            details,
        )
    found = [n for n, ok in details.get("nccl_opens", {}).items() if ok and "ibverbs" in n]
    return (
        "passed",
        f"libibverbs and the mlx5 provider load ({len(details['devices'])} RDMA devices visible); "
        + (f"{os.path.basename(nccl)} opens {found[0]}" if nccl else "torch loads no libnccl here"),
        details,
    )


def nccl_against_pin(path: str | None, version: str | None, pin: dict[str, Any]) -> Result:
    """A libnccl file (`version`: what NCCL reports) against the recipe's pin: same version, same bytes."""
    if not path:
        return "failed", "torch loads no libnccl, but the recipe pins one (runtime.nccl)", {"pin": pin}
    import hashlib

    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    details = {"path": path, "version": version, "sha256": digest, "pin": pin}
    problems = []
    if version != pin.get("version"):
        problems.append(f"{path} is NCCL {version}, the recipe pins {pin.get('version')}")
    if digest != pin.get("sha256"):
        problems.append(f"{path} has sha256 {digest[:16]}, the recipe pins {str(pin.get('sha256'))[:16]}")
    if problems:
        return (
            "failed",
            "; ".join(problems) + "; fix: build the pinned NCCL into the image or correct runtime.nccl",
            details,
        )
    return "passed", f"NCCL {version} ({pin.get('variant', 'stock')}) from {path}, sha256 as pinned", details


def _nccl_version(path: str | None) -> str | None:
    """NCCL's version as torch reports it, else from the file name (libnccl.so.2.30.7)."""
    try:
        import torch

        found = torch.cuda.nccl.version()
        return ".".join(str(p) for p in found) if isinstance(found, tuple) else str(found)
    except Exception:  # a torch without CUDA: the file name says it
        match = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)", os.path.basename(os.path.realpath(path or "")))
        return match.group(1) if match else None


def check_nccl(lock: dict[str, Any]) -> Result:
    pin = (lock.get("runtime") or {}).get("nccl")
    if not pin:
        return "skipped", "the recipe pins no NCCL (runtime.nccl)", {}
    path = _torch_nccl()
    return nccl_against_pin(path, _nccl_version(path), pin)


# This module's rows of the suite, in order (declared in checklist.py).
CHECKS = [
    (name, globals()[function]) for name, module, function, _ in checklist.CHECKS if module == "checks_fabric"
]

"""Audit compile_units.py's objects for sm_121 (and this machine's GPU), and ask the driver to load each cubin.

    PYTHONPATH=. python tests/gpu/fp4_units/audit_units.py --objects DIR --out fp4_audit.json

Per object: the audit's entries and verdict for sm_121 (what GB10 would run) and for the local GPU's capability.
With a GPU and cuobjdump present, each cubin is extracted (`cuobjdump -xelf all`) and loaded through the driver
(cuModuleLoadData): an sm_121a cubin must be refused by an sm_90 GPU, as the audit predicts ('none'). Exit 1 when
an object is missing, is not native for sm_121, or a load disagrees with the audit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sparkforge.audit.scan import audit_target

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _verdict(path: Path, gpu: str) -> dict[str, Any]:
    lib = audit_target(path, gpu=gpu, require=[]).extra["libraries"]
    return (
        {"entries": lib[0]["entries"], "verdict": lib[0]["verdict"]}
        if lib
        else {"entries": {}, "verdict": "none"}
    )


def _loads(path: Path, driver: Any) -> list[dict[str, Any]]:
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        return []
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [cuobjdump, "-xelf", "all", str(path.resolve())], cwd=tmp, capture_output=True, check=False
        )
        for cubin in sorted(Path(tmp).glob("*.cubin")):
            module, error = driver.load(cubin.read_bytes())
            if module is not None:
                driver.unload(module)
            out.append({"cubin": cubin.name, "loaded": module is not None, "error": error})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    compiled = json.loads((args.objects / "fp4_compile.json").read_text())
    driver, gpu = None, None
    try:
        from cubin_load import Driver

        driver = Driver()
        info = driver.describe()
        gpu = f"sm_{info['capability'].replace('.', '')}" if "capability" in info else None
    except Exception as exc:  # no driver or no GPU: the audit alone
        print(f"audit_units: no GPU load check ({exc})")
    rows, bad = [], []
    for unit in compiled["units"]:
        path = Path(unit["object"])
        if not unit["ok"] or not path.is_file():
            bad.append(f"{unit['source']} sm_{unit['arch']}: not compiled")
            rows.append({**unit, "audit": None})
            continue
        row = {**unit, "output": None, "sm_121": _verdict(path, "sm_121")}
        if unit["arch"] == "121a" and row["sm_121"]["verdict"] != "native":
            bad.append(f"{unit['source']}: {row['sm_121']['verdict']} for sm_121, not native")
        if driver is not None and gpu:
            row[gpu] = _verdict(path, gpu)
            row["loads"] = _loads(path, driver)
            runs = row[gpu]["verdict"] in ("native", "family", "jit")
            if any(load["loaded"] != runs for load in row["loads"]):
                bad.append(
                    f"{unit['source']} sm_{unit['arch']}: the driver disagrees with the audit on {gpu}"
                )
        rows.append(row)
    report = {"gpu": gpu, "compile": {k: v for k, v in compiled.items() if k != "units"}, "units": rows,
              "problems": bad}  # fmt: skip
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for row in rows:
        audit = row.get("sm_121") or {}
        print(f"{row['source'].rsplit('/', 1)[-1]:48} sm_{row['arch']:5} {audit.get('verdict', '-'):7} "
              f"{audit.get('entries')} {row.get('seconds')} s")  # fmt: skip
    for problem in bad:
        print(f"PROBLEM: {problem}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

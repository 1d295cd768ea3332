"""The trained tiny Qwen3.5-MoE as a committed fixture (tests/fixtures/tiny-qwen35moe/): its key, its sha256 sums,
and how to make it again.

Training it (tests/engine/tiny_trained_qwen35moe.py in the CPU twin: 2,000 steps and the drafter's 1,000) takes
about 13 minutes on a 2-core CI machine, so the served tests use the committed model instead: verified file by
file against SHA256SUMS, and used only while MADE.json's key is the key of what makes it today (the trainer, the
probes it learns, the twin recipe, the step counts). A change to any of them fails tests/unit/test_tiny_fixture.py
with the command that makes the model again; tests/engine/test_tiny_model_real.py retrains and checks that the
retrained model gives the committed one's answers. Standard library only (the unit test and .ci/run use it).

  python3 tests/engine/tiny_fixture.py --write DIR     # commit DIR (a trained model) as the fixture
  python3 tests/engine/tiny_fixture.py --check         # verify the committed fixture; exit 1 naming the problem
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "tests" / "engine" / "tiny_trained_qwen35moe.py"
PROBES = ROOT / "sparkforge" / "run" / "conform" / "probes.py"
TWIN_RECIPE = ROOT / "tests" / "recipes" / "ci-cpu-twin.yaml"
FIXTURE = ROOT / "tests" / "fixtures" / "tiny-qwen35moe"
SUMS = "SHA256SUMS"
MADE = "MADE.json"
# 2,000 steps: 120/120 known answers on the CPU (1,500 reached it on a GPU; benchmarks/conform.md, "Known
# answers"); then 1,000 steps distilling the MTP drafter from the frozen model.
TRAIN_STEPS, MTP_STEPS = 2000, 1000
REMAKE = (
    "python3 -m pytest -m slow tests/engine/test_tiny_model_real.py (trains it in the CPU twin, ~13 min), then "
    "python3 tests/engine/tiny_fixture.py --write <the trained folder it prints>"
)


def trained_model_key() -> str:
    """The trained model's content key: the maker (task, config, seed, steps), the probes it learns and the twin
    recipe (torch)."""
    made = TRAINER.read_bytes() + PROBES.read_bytes() + TWIN_RECIPE.read_bytes()
    return hashlib.sha256(made + f"{TRAIN_STEPS} {MTP_STEPS}".encode()).hexdigest()[:24]


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (SUMS, MADE))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def problems(folder: Path = FIXTURE) -> list[str]:
    """Why the committed fixture cannot stand for the trained model (empty: it can)."""
    sums, made = folder / SUMS, folder / MADE
    if not sums.is_file() or not made.is_file():
        return [f"{folder} has no {SUMS} or {MADE}; fix: {REMAKE}"]
    found: list[str] = []
    listed = {}
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    present = {str(p.relative_to(folder)) for p in _files(folder)}
    found += [f"{folder}/{n}: listed in {SUMS} but missing" for n in sorted(set(listed) - present)]
    found += [f"{folder}/{n}: not listed in {SUMS}" for n in sorted(present - set(listed))]
    found += [f"{folder}/{n}: sha256 differs from {SUMS}" for n in sorted(set(listed) & present)
              if _sha256(folder / n) != listed[n]]  # fmt: skip
    key = json.loads(made.read_text()).get("key")
    if key != trained_model_key():
        found.append(
            f"{folder}/{MADE}: made with key {key}, but the trainer, probes, twin recipe or steps now give "
            f"{trained_model_key()}; fix: {REMAKE}"
        )
    return found


def write(trained: Path, folder: Path = FIXTURE) -> None:
    """Commit `trained` (a folder the trainer wrote) as the fixture: its files, their sums, what made it."""
    facts = json.loads((trained / "accuracy.json").read_text())
    tmp = folder.with_name(f".{folder.name}.part")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(trained, tmp)
    sums = "".join(f"{_sha256(p)}  {p.relative_to(tmp)}\n" for p in _files(tmp))
    (tmp / SUMS).write_text(sums)
    made = {
        "key": trained_model_key(),
        "steps": TRAIN_STEPS,
        "mtp_steps": MTP_STEPS,
        "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "by": "tests/engine/tiny_trained_qwen35moe.py in the CPU twin (tests/recipes/ci-cpu-twin.yaml)",
        "train_s": facts.get("train_s"),
        "mtp_train_s": facts.get("mtp_train_s"),
    }
    (tmp / MADE).write_text(json.dumps(made, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"] and len(argv) == 2:
        write(Path(argv[1]))
        print(f"wrote {FIXTURE} (key {trained_model_key()})")
        return 0
    if argv == ["--check"]:
        found = problems()
        print("\n".join(found) if found else f"{FIXTURE}: current (key {trained_model_key()})")
        return 1 if found else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

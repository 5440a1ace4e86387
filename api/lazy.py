"""Lazy re-exports for the package faces (PEP 562, as scientific Python's lazy_loader.attach): a
package names the modules that hold what it offers, and a module is imported when one of its
names is first used. So `import stepml_evolve.evaluator.errors` (which runs every enclosing
`__init__`) stays light: no numba, pandas or CLI comes with a package's face."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def attach(package: str, exports: dict[str, tuple[str, ...]]):
    """`__getattr__`, `__dir__` and `__all__` for `package`; `exports` maps a module (relative to
    the package, e.g. ".engine") to the names the package offers from it."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(sys.modules[package], name, value)  # later uses find it without coming here
        return value

    def __dir__() -> list[str]:  # the face and the submodules (what tab completion offers), not helpers
        module = vars(sys.modules[package])
        return sorted(set(where) | {n for n, v in module.items() if isinstance(v, ModuleType)})

    return __getattr__, __dir__, list(where)

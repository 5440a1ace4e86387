"""GPU lookup by name (case-insensitive, with aliases). The numbers live in catalog.yaml, each
with its unit and source; evaluator/hardware/catalog.py reads and checks them.

Peak numbers are vendor datasheet figures for dense BF16 (no sparsity). Components are
expressed as times at these peaks, so a fitted scale constant of 1.0 means "runs at peak".
"""

from __future__ import annotations

from stepml_evolve.evaluator.hardware.catalog import Hardware, catalog

HARDWARE: dict[str, Hardware] = dict(catalog().hardware)
_ALIASES = {alias: hw.name for hw in HARDWARE.values() for alias in hw.aliases}

DEFAULT_HARDWARE = "H100"  # the real replay data was measured on H100 (see ../shared/data/README.md)


def get_hardware(name: str) -> Hardware:
    """Look a GPU up by name (case-insensitive, common aliases); KeyError names the known ones."""
    key = _ALIASES.get(name.strip().lower(), name.strip())
    if key not in HARDWARE:
        raise KeyError(f"unknown hardware {name!r} (known: {', '.join(sorted(HARDWARE))})")
    return HARDWARE[key]


__all__ = ["Hardware", "HARDWARE", "DEFAULT_HARDWARE", "get_hardware"]

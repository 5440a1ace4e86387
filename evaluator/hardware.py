"""Hardware specs: one table, each number with its unit and source.

Peak numbers are vendor datasheet figures for dense BF16 (no sparsity). Components are
expressed as times at these peaks, so a fitted scale constant of 1.0 means "runs at peak".
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # FLOP/s, dense BF16 tensor-core peak per GPU
    hbm_bytes_per_s: float  # bytes/s, HBM bandwidth per GPU
    link_bytes_per_s: float  # bytes/s, NVLink bandwidth per GPU (all links, one direction summed)
    memory_bytes: float  # bytes of HBM per GPU
    source: str


HARDWARE: dict[str, Hardware] = {
    "H100": Hardware(
        name="H100",
        peak_flops=989.5e12,
        hbm_bytes_per_s=3.35e12,
        link_bytes_per_s=900e9,
        memory_bytes=80e9,
        source="NVIDIA H100 SXM5 datasheet (BF16 dense 989.5 TFLOP/s, HBM3 3.35 TB/s, NVLink 900 GB/s)",
    ),
    "A100-80GB": Hardware(
        name="A100-80GB",
        peak_flops=312e12,
        hbm_bytes_per_s=2.039e12,
        link_bytes_per_s=600e9,
        memory_bytes=80e9,
        source="NVIDIA A100 SXM4 80GB datasheet (BF16 dense 312 TFLOP/s, HBM2e 2.039 TB/s, NVLink 600 GB/s)",
    ),
}

_ALIASES = {
    "h100": "H100", "h100-sxm": "H100", "h100_sxm": "H100", "h100-sxm5": "H100", "h100-80gb": "H100",
    "a100": "A100-80GB", "a100-80gb": "A100-80GB", "a100_80gb": "A100-80GB", "a100-sxm4-80gb": "A100-80GB",
}

DEFAULT_HARDWARE = "H100"  # the real replay data was measured on H100 (see ../shared/data/README.md)


def get_hardware(name: str) -> Hardware:
    """Look a GPU up by name (case-insensitive, common aliases); KeyError names the known ones."""
    key = _ALIASES.get(name.strip().lower(), name.strip())
    if key not in HARDWARE:
        raise KeyError(f"unknown hardware {name!r} (known: {', '.join(sorted(HARDWARE))})")
    return HARDWARE[key]

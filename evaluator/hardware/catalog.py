"""The hardware and model catalog (catalog.yaml, package data) as typed records, read once.

Owns loading and checking the YAML: every hardware number must be a number stated in the unit
this module expects for it (HARDWARE_UNITS), and every model's model_config must build a valid
ModelArch. Lookups by alias live in hardware.py; this module only reads and validates.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from stepml_evolve.evaluator.hardware.model_arch import ModelArch

# Hardware field -> the unit catalog.yaml must state for it.
HARDWARE_UNITS = {"peak_flops": "FLOP/s", "hbm_bytes_per_s": "B/s", "link_bytes_per_s": "B/s", "memory_bytes": "B"}


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # FLOP/s, dense BF16 tensor-core peak per GPU
    hbm_bytes_per_s: float  # bytes/s, HBM bandwidth per GPU
    link_bytes_per_s: float  # bytes/s, NVLink bandwidth per GPU (all links, one direction summed)
    memory_bytes: float  # bytes of HBM per GPU
    source: str
    description: str = ""
    go_name: str = ""  # the emitted Go preset is <Name><go_name>
    aliases: tuple[str, ...] = ()  # lower-case names get_hardware also accepts


@dataclass(frozen=True)
class ServedModel:
    name: str  # Hugging Face id
    arch: ModelArch
    config_items: tuple[tuple[str, int], ...]  # model_config, in catalog order

    @property
    def model_config(self) -> dict:
        """The replay format's model_config (a fresh dict, fields in catalog order)."""
        return dict(self.config_items)


@dataclass(frozen=True)
class Catalog:
    hardware: dict[str, Hardware]
    models: dict[str, ServedModel]


def _number(where: str, entry) -> float:
    if not isinstance(entry, dict) or set(entry) != {"value", "unit", "source"}:
        raise ValueError(f"{where}: expected {{value, unit, source}}, got {entry!r}")
    value = entry["value"]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"{where}: value {value!r} is not a positive number (YAML reads 989.5e12 as text: write 989.5e+12)"
        )
    return float(value)


def _hardware(name: str, spec) -> Hardware:
    where = f"catalog hardware {name}"
    expected = {"description", "go_name", "aliases", "source", *HARDWARE_UNITS}
    if not isinstance(spec, dict) or set(spec) != expected:
        raise ValueError(f"{where}: expected the keys {sorted(expected)}")
    numbers = {field: _number(f"{where} {field}", spec[field]) for field in HARDWARE_UNITS}
    for field, unit in HARDWARE_UNITS.items():
        if spec[field]["unit"] != unit:
            raise ValueError(f"{where} {field}: unit must be {unit}, got {spec[field]['unit']!r}")
    if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", str(spec["go_name"])):
        raise ValueError(f"{where}: go_name {spec['go_name']!r} must be letters and digits, capital first (like H100)")
    aliases = tuple(str(a) for a in spec["aliases"])
    if any(a != a.lower() for a in aliases):
        raise ValueError(f"{where}: aliases must be lower-case")
    return Hardware(
        name=name,
        **numbers,
        source=str(spec["source"]),
        description=str(spec["description"]),
        go_name=spec["go_name"],
        aliases=aliases,
    )


def _model(name: str, config) -> ServedModel:
    if not isinstance(config, dict):
        raise ValueError(f"catalog model {name}: model_config must be a mapping")
    try:
        arch = ModelArch.from_model_config(config)
    except ValueError as e:
        raise ValueError(f"catalog model {name}: {e}") from None
    return ServedModel(name=name, arch=arch, config_items=tuple(config.items()))


def load(path: str | Path | None = None) -> Catalog:
    """Read and check a catalog file (default: the packaged catalog.yaml); ValueError on bad data."""
    text = Path(path).read_text() if path else (resources.files(__package__) / "catalog.yaml").read_text()
    raw = yaml.safe_load(text)
    if not isinstance(raw, dict) or set(raw) != {"hardware", "models"}:
        raise ValueError("catalog: expected exactly the top-level keys hardware and models")
    hardware = {name: _hardware(name, spec) for name, spec in raw["hardware"].items()}
    go_names = [hw.go_name for hw in hardware.values()]
    aliases = [a for hw in hardware.values() for a in hw.aliases]
    for what, names in (("go_name", go_names), ("alias", aliases)):
        shared = sorted({n for n in names if names.count(n) > 1})
        if shared:
            raise ValueError(f"catalog: hardware entries share the {what} {', '.join(shared)}")
    models = {name: _model(name, config) for name, config in raw["models"].items()}
    return Catalog(hardware=hardware, models=models)


@functools.cache
def catalog() -> Catalog:
    """The packaged catalog, read on first use."""
    return load()

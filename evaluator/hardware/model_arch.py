"""Transformer architecture of a served model, as the replay data's `model_config` gives it.

Parameter and FLOP counts derived from it live in components.coefficient_values (one definition,
also translated to Go).
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass

BYTES_PER_PARAM = 2  # bytes per weight (BF16)
BYTES_PER_KV_ELEM = 2  # bytes per KV-cache element (BF16)
MAX_SIZE = 2**31 - 1  # any size of model_config: an integer (never a string or a bool) up to this


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SIZE


@dataclass(frozen=True)
class ModelArch:
    """Sizes are counts of elements (not bytes). Dense models have num_experts = top_k = 0."""

    layers: int
    hidden: int  # d
    heads: int  # H (query heads)
    kv_heads: int
    ffn: int  # intermediate (FFN) dim per expert
    vocab: int
    num_experts: int = 0  # E, local experts of a MoE MLP
    top_k: int = 0  # experts per token

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_model_config(cls, mc: dict) -> ModelArch:
        """Build from the replay format's model_config; raises ValueError on bad fields."""
        if not isinstance(mc, dict):
            raise ValueError(f"model_config must be an object, not {reprlib.repr(mc)}")
        required = ["num_layers", "hidden_dim", "num_heads", "num_kv_heads", "intermediate_dim"]
        missing = [k for k in required if k not in mc]
        if missing:
            raise ValueError(f"model_config lacks {', '.join(missing)}")
        vals = {k: mc[k] for k in required}
        for k, v in vals.items():
            if not _count(v) or v <= 0:
                raise ValueError(f"model_config.{k} must be an integer in 1..{MAX_SIZE:,}, not {reprlib.repr(v)}")
        if vals["hidden_dim"] % vals["num_heads"]:
            raise ValueError("model_config.hidden_dim is not a multiple of num_heads")
        if vals["num_heads"] % vals["num_kv_heads"]:
            raise ValueError("model_config.num_heads is not a multiple of num_kv_heads")
        for k in ("num_local_experts", "num_experts_per_tok", "vocab_size"):
            if mc.get(k) is not None and not _count(mc[k]):
                raise ValueError(f"model_config.{k} must be an integer in 0..{MAX_SIZE:,}, not {reprlib.repr(mc[k])}")
        experts = mc.get("num_local_experts") or 0
        top_k = mc.get("num_experts_per_tok") or 0
        if experts and not 0 < top_k <= experts:
            raise ValueError(f"model_config.num_experts_per_tok={top_k} invalid for {experts} experts")
        return cls(
            layers=vals["num_layers"],
            hidden=vals["hidden_dim"],
            heads=vals["num_heads"],
            kv_heads=vals["num_kv_heads"],
            ffn=vals["intermediate_dim"],
            vocab=mc.get("vocab_size") or 32000,
            num_experts=experts,
            top_k=top_k if experts else 0,
        )
